"""A trial and its statuses: the record the coordinator fills in, the algorithms decide on,
and storage and every view show."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
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
    "TrialSnapshot",
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


class _Reached:
    """What a trial's status and steps say of it, for the trial and its snapshots alike."""

    __slots__ = ()  # its subclasses' instances keep no __dict__

    status: str
    steps: int
    reported: int

    @property
    def done(self) -> bool:
        return self.status != PENDING

    @property
    def reached(self) -> int:
        """The steps the trial reached: its `steps` if completed, else the last step it
        received metrics for (what every report and view counts for it)."""
        return self.steps if self.status == COMPLETED else self.reported


@dataclass(eq=False, slots=True)
class Trial(_Reached):
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

    def snapshot(self) -> TrialSnapshot:
        """The trial as it is now, frozen: what a view reads while the study goes on."""
        return TrialSnapshot(
            id=self.id,
            config=self.config,
            steps=self.steps,
            tag=self.tag,
            status=self.status,
            node=self.node,
            metrics=None if self.metrics is None else MappingProxyType(dict(self.metrics)),
            reported=self.reported,
            curve=tuple(self.curve),
            error=self.error,
            cause=self.cause,
            submitted_at=self.submitted_at,
            finished_at=self.finished_at,
            salt=self.salt,
            segments=tuple(self.segments),
        )


@dataclass(frozen=True, eq=False)
class TrialSnapshot(_Reached):
    """A `Trial` frozen when a view of its study was taken (`Trial.snapshot`): the same fields,
    which the study's later events leave as they were. Every view reads trials as these."""

    id: int
    config: Config
    steps: int
    tag: Any
    status: str
    node: str
    metrics: Mapping[str, float] | None
    reported: int
    curve: tuple[tuple[int, Mapping[str, float]], ...]
    error: str | None
    cause: str | None
    submitted_at: float
    finished_at: float | None
    salt: str
    segments: tuple[tuple[str, int, int], ...]
