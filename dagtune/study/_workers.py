"""A study on Dask keeps an eye on its workers: with work waiting and no worker left (each
one died, and none came back), it says so at once, again every minute, and fails with
`NoWorkersError` when none came back within the wait.

The wait is Dask's config ``dagtune.lost-workers-wait`` (default 5 minutes: a nanny
replaces a dead worker within seconds, a supervisor restarting ``dask worker`` processes
within a minute or two), or on an adaptive cluster, which asks for new workers (a Slurm job
may queue for long), ``dagtune.adaptive-wait`` (default 1 hour), as when a study waits
for its first worker (`dagtune.execution.dask.check_resources`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from dagtune.errors import DagtuneError

__all__ = ["LOST_WORKERS_WAIT", "NoWorkersError", "WorkerWatch"]

log = logging.getLogger("dagtune")

#: Dask config: how long a study waits with work and no worker (not on an adaptive cluster)
LOST_WORKERS_WAIT = ("dagtune.lost-workers-wait", "5 minutes")
ADAPTIVE_WAIT = ("dagtune.adaptive-wait", "1h")
REMIND_SECONDS = 60.0


class NoWorkersError(DagtuneError, RuntimeError):
    """The study's cluster had no worker, with work waiting, for longer than the study
    waits for one. Its pending trials stay pending: opening the study again, on a cluster
    with workers, continues them."""


class WorkerWatch:
    """Watches one study's worker slots (`check` after each driver round).

    `adaptive` says, when first asked, whether the cluster scales adaptively (it decides
    which wait applies); `clock` is injectable for tests."""

    def __init__(self, study: str, adaptive: Callable[[], bool], clock: Callable[[], float] = time.monotonic):
        self.study = study
        self.adaptive = adaptive
        self.clock = clock
        self.since: float | None = None  # when the last worker went, work waiting
        self.wait: tuple[float, str] | None = None  # seconds, and the config key that set them
        self._reminded = 0.0

    def check(self, slots: int, waiting: int) -> NoWorkersError | None:
        """Given the worker slots now and the pending trials waiting for training, log the
        news; the error once the wait is over, else None."""
        now = self.clock()
        if slots > 0 or waiting == 0:
            if self.since is not None and slots > 0:
                log.warning("dagtune: study %r has workers again after %.0f s", self.study, now - self.since)
            self.since = None
            return None
        if self.since is None:
            self.since = self._reminded = now
            seconds, key = self._wait()
            log.warning(
                "dagtune: study %r has no Dask worker (the cluster lost them all), and %d pending trial(s) wait; "
                "waiting up to %.0f s for one (Dask config %s)",
                self.study,
                waiting,
                seconds,
                key,
            )
        seconds, key = self._wait()
        if now - self.since > seconds:
            return NoWorkersError(
                f"study {self.study!r} had no Dask worker for {now - self.since:.0f} s with {waiting} pending trial(s) "
                f"waiting (Dask config {key} = {seconds:.0f} s): start workers (or find why they died in "
                "their logs), then run the study again to continue its pending trials"
            )
        if now - self._reminded >= REMIND_SECONDS:
            self._reminded = now
            log.warning(
                "dagtune: study %r still has no Dask worker after %.0f s (waiting up to %.0f s)",
                self.study,
                now - self.since,
                seconds,
            )
        return None

    def _wait(self) -> tuple[float, str]:
        if self.wait is None:
            import dask  # loaded already: the study runs on Dask
            from dask.utils import parse_timedelta

            key, default = ADAPTIVE_WAIT if self.adaptive() else LOST_WORKERS_WAIT
            self.wait = (parse_timedelta(dask.config.get(key, default=default), "seconds"), key)
        return self.wait
