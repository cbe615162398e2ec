"""What the dispatcher learns from running tasks that concerns trials, as values the
trial ledger applies (`dagtune.coordinator._ledger`): the one way from tasks to trials."""

from __future__ import annotations

from dataclasses import dataclass

from dagtune.records import MetricsPoint

__all__ = ["MetricsKnown", "Outcome", "PointFailed"]


@dataclass(frozen=True)
class MetricsKnown:
    """The metrics at point ``(node, step)`` became known (a task reported them, or another
    study recorded them): the trials passing there get them, as the point the plan keeps."""

    node: str
    step: int
    metrics: MetricsPoint


@dataclass(frozen=True)
class PointFailed:
    """Training failed at point ``(node, step)`` more often than retries allow: the trials
    passing there fail with `error` and `cause` (one of `dagtune.records.CAUSES`)."""

    node: str
    step: int
    error: str | None
    cause: str


#: what `Dispatcher.handle` returns for the ledger
Outcome = MetricsKnown | PointFailed
