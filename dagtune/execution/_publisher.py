"""One thread per study that keeps what the study shows on its scheduler up to date.

A study on Dask keeps entries in its scheduler's metadata: its demand (`DemandFeed`, which
an adaptive cluster scales for) and, where the dagtune page is served, its latest snapshot
(`dagtune.dashboard.SnapshotFeed`). Each is a *feed*: it knows what to send and whether it
changed (`publish`), and what to leave behind when the study closes (`finish`: the demand
is withdrawn, the page gets the final snapshot). `Publisher` asks every feed every
`interval` seconds from one daemon thread, and finishes them on `close`; a feed that fails
only lags (it is logged at debug level), and the study goes on.

A snapshot of the page's feed redoes only the trials and tree nodes that changed since its
last one (`dagtune.dashboard.kept`), but the study's view it reads still copies every trial
under the study's lock: about 0.2 s of CPU for a 10,000-trial study mid-run, 0.15 s of it the
view. The publishing thread shares the interpreter with the coordinator: after each round it
waits nine times as long as the round took, or `interval` if that is longer, so publishing
takes at most `BUSY_SHARE` (a tenth) of the time however large the study. A 10,000-trial
study's page updates about every 2 s; a small study's every second, as before
(perf/RESULTS.md 9l).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import Any, Protocol

__all__ = ["Feed", "Publisher"]

log = logging.getLogger("dagtune")

BUSY_SHARE = 0.1  # the most of the time a study's publisher spends publishing


class Feed(Protocol):
    """What a `Publisher` keeps up to date: one entry of the scheduler's metadata."""

    def publish(self, force: bool = False) -> bool:
        """Send the entry if it changed since it was last sent (or with `force`); True if sent."""

    def finish(self) -> None:
        """What the entry becomes when the study closes (sent or withdrawn)."""


class Publisher:
    """Asks each of `feeds` to publish every `interval` seconds, from one daemon thread,
    until `study` closes or `close` is called (see the module docstring)."""

    def __init__(self, study: Any, feeds: Sequence[Feed], interval: float = 1.0):
        self.study = study
        self.feeds = list(feeds)
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"dagtune-publish-{study.name}", daemon=True)

    def start(self) -> Publisher:
        self._thread.start()
        return self

    def _loop(self) -> None:
        pause = self.interval
        while not self._stop.wait(pause):
            if self.study.activity().closed:
                return
            began = time.monotonic()
            for feed in self.feeds:
                try:
                    feed.publish()
                except Exception:  # what the scheduler shows only lags; the study goes on
                    log.debug("dagtune: publishing %s failed", type(feed).__name__, exc_info=True)
            pause = self.pause_after(time.monotonic() - began)

    def pause_after(self, busy: float) -> float:
        """How long to wait after a round that took `busy` seconds: `interval`, or longer so
        that publishing is at most `BUSY_SHARE` of the time."""
        return max(self.interval, busy * (1 - BUSY_SHARE) / BUSY_SHARE)

    def close(self) -> None:
        """Stop, then finish every feed (call before the client closes)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        for feed in self.feeds:
            try:
                feed.finish()
            except Exception:
                log.debug("dagtune: finishing %s failed", type(feed).__name__, exc_info=True)
