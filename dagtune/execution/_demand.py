"""What a study asks of an adaptive cluster: its demand, and the scaling that reads it.

dagtune submits stages just in time, one task per free worker slot (docs/DESIGN.md), so the
stages waiting for a slot are not Dask tasks, and Dask's own adaptive target, which counts
submitted tasks, would never grow a cluster for them (nor start the first worker of one at
``minimum=0``). So every study on Dask publishes its *demand* — how many stages are ready to
run without a slot — in its scheduler's metadata under ``["dagtune", "demand", <study>]``
(`DemandFeed`, sent by the study's `Publisher` when it changes, removed when the study
closes), and `DemandAdaptive`, an `Adaptive` for any `SpecCluster` (dask-jobqueue's
included), aims at the workers there are plus the published demand, within its minimum and
maximum. A worker that joins gets work at once (the study re-plans when its slots grow). A
study started on an adaptive cluster that has no worker yet waits for the first one
patiently (`check_resources`), asking for one worker meanwhile (`asking_for_a_worker`).
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from collections import deque
from collections.abc import Iterator
from typing import Any

from distributed.deploy.adaptive import Adaptive

from dagtune.validation import is_number

__all__ = [
    "ADAPTIVE",
    "DEMAND",
    "DemandAdaptive",
    "DemandFeed",
    "adapts",
    "asking_for_a_worker",
    "study_demand",
    "total_demand",
    "withdraw",
]

log = logging.getLogger("dagtune")

DEMAND = ("dagtune", "demand")  # scheduler metadata: {study key: stages ready without a slot}
ADAPTIVE = ("dagtune", "adaptive")  # scheduler metadata: {cluster name: bounds} of DemandAdaptive


def total_demand(published: Any) -> int:
    """The sum of the demands studies published (anything malformed counts as nothing)."""
    if not isinstance(published, dict):
        return 0
    return sum(int(value) for value in published.values() if is_number(value) and value > 0)


class DemandAdaptive(Adaptive):
    """Adaptive scaling that also counts the stages dagtune studies hold back for want of
    a worker: the target is the larger of Dask's own target and the workers there are plus
    the published demand, then bounded by `minimum` and `maximum` (as every `Adaptive`).

    Use it as ``cluster.adapt(Adaptive=DemandAdaptive, minimum=..., maximum=...)`` (any
    `SpecCluster`; `slurm` does it). `history` keeps the last decisions as
    ``(time, dask_target, demand, workers, target)``."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.history: deque[tuple[float, int, int, int, int]] = deque(maxlen=1000)

    async def target(self) -> int:
        base = await super().target()
        published = await self.scheduler.get_metadata(keys=list(DEMAND), default={})
        demand = total_demand(published)
        workers = len(self.observed)
        target = max(base, workers + demand) if demand else base
        self.history.append((time.time(), base, demand, workers, target))
        try:  # tells studies on this scheduler that it adapts (they then wait for workers)
            bounds = {
                "minimum": self.minimum,
                "maximum": None if self.maximum == float("inf") else self.maximum,
            }
            name = str(getattr(self.cluster, "name", "cluster"))
            await self.scheduler.set_metadata(keys=[*ADAPTIVE, name], value=bounds)
        except Exception:  # only a hint for studies
            log.debug("dagtune: announcing adaptive scaling failed", exc_info=True)
        return target


def adapts(client: Any) -> bool:
    """Whether `client`'s cluster scales adaptively (its own `Adaptive`, or a
    `DemandAdaptive` that announced itself on the scheduler)."""
    adaptive = getattr(getattr(client, "cluster", None), "_adaptive", None)
    if adaptive is not None and getattr(adaptive, "state", "") in ("starting", "running"):
        return True
    try:
        return bool(client.get_metadata(list(ADAPTIVE), default=None))
    except Exception:
        return False


def withdraw(client: Any, key: list[str]) -> None:
    """Remove a published demand (the scheduler has no call for it: run one there; if
    the scheduler refuses to run functions, leave a zero)."""

    def drop(dask_scheduler: Any, keys: tuple = tuple(key)) -> None:
        entries = dask_scheduler.task_metadata
        for part in keys[:-1]:
            entries = entries.get(part, {})
        if isinstance(entries, dict):
            entries.pop(keys[-1], None)

    try:
        client.run_on_scheduler(drop)
    except Exception:
        try:
            client.set_metadata(key, 0)
        except Exception:  # the scheduler is gone: so is the demand
            log.debug("dagtune: withdrawing a demand failed", exc_info=True)


@contextlib.contextmanager
def asking_for_a_worker(client: Any) -> Iterator[None]:
    """Publish a demand of one worker while the block runs (a study waiting for its
    first worker on a cluster at its minimum of 0)."""
    key = [*DEMAND, f"waiting-{uuid.uuid4().hex[:8]}"]
    try:
        client.set_metadata(key, 1)
    except Exception:
        log.debug("dagtune: publishing a demand failed", exc_info=True)
    try:
        yield
    finally:
        withdraw(client, key)


def study_demand(study: Any) -> int:
    """How many of `study`'s stages are ready to run but have no free worker slot (as its
    coordinator found at its last scheduling round)."""
    return study.activity().demand


class DemandFeed:
    """A study's demand, for its `Publisher`: sent to the scheduler's metadata when it
    changed; withdrawn when the study closes."""

    def __init__(self, study: Any, client: Any = None):
        self.study = study
        self.client = client if client is not None else study.client
        self.key = [*DEMAND, f"{study.name}-{study.activity().token}"]
        self.published: int | None = None

    def publish(self, force: bool = False) -> bool:
        """Send the demand if it changed (or with `force`); True if sent."""
        demand = study_demand(self.study)
        if demand == self.published and not force:
            return False
        self.client.set_metadata(self.key, demand)
        self.published = demand
        return True

    def finish(self) -> None:
        """Withdraw the demand (the study closes)."""
        withdraw(self.client, self.key)
