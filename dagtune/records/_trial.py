"""A trial and its statuses: the record the coordinator fills in, the algorithms decide on,
and storage and every view show."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dagtune.config import Config

__all__ = [
    "CAUSES",
    "COMPLETED",
    "DIVERGED",
    "FAILED",
    "OUTSIDE_THE_TRAINER",
    "PENDING",
    "STATUSES",
    "STOPPED",
    "Trial",
]

PENDING, COMPLETED, STOPPED, FAILED, DIVERGED = "pending", "completed", "stopped", "failed", "diverged"
STATUSES = (PENDING, COMPLETED, STOPPED, FAILED, DIVERGED)

#: why a trial failed: its trainer raised (``trainer``), a step outlasted the study's
#: ``step_timeout`` (``timeout``), the Dask workers running it died (``workers``: Dask gave
#: up after the task took down several; an exhausted memory, a crash in native code or a
#: failing cluster), or reading or writing a checkpoint failed (``storage``)
CAUSES = ("trainer", "timeout", "workers", "storage")
#: the causes a study opened again retries by itself: not the trainer's code, as far as
#: dagtune can tell (a dying worker may still be the trainer's doing)
OUTSIDE_THE_TRAINER = ("workers", "storage")


@dataclass(eq=False, slots=True)
class Trial:
    """One trial: a config trained for `steps` steps, and what came back.

    `status` is ``pending`` (waiting for its results), ``completed`` (reached `steps`; an
    algorithm may extend it), ``stopped``, ``failed`` (see `error`, and `cause`, one of
    `CAUSES`) or ``diverged`` (a metric became NaN or infinite).
    """

    id: int
    config: Config
    steps: int
    tag: Any = None
    status: str = PENDING
    node: str = ""
    metrics: dict[str, float] | None = None
    reported: int = 0
    curve: list[tuple[int, dict[str, float]]] = field(default_factory=list)
    error: str | None = None
    cause: str | None = None
    submitted_at: float = 0.0
    finished_at: float | None = None
    salt: str = ""
    segments: list[tuple[str, int, int]] = field(default_factory=list)

    @property
    def done(self) -> bool:
        return self.status != PENDING

    @property
    def reached(self) -> int:
        """The steps the trial reached: its `steps` if completed, else the last step it
        received metrics for (what every report and view counts for it)."""
        return self.steps if self.status == COMPLETED else self.reported
