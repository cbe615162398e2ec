"""A trial and its statuses: the record the coordinator fills in, the algorithms decide on,
and storage and every view show."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any

from dagtune.config import Config
from dagtune.records._point import MetricsPoint

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


@dataclass(eq=False, slots=True, repr=False, init=False)
class Trial(_Reached):
    """One trial: a config trained for `steps` steps, and what came back.

    `status` is ``pending`` (waiting for its results), ``completed`` (reached `steps`; an
    algorithm may extend it), ``stopped``, ``failed`` (see `error`, and `cause`, one of
    `CAUSES`) or ``diverged`` (a metric became NaN or infinite).

    `metrics` (its last metrics, a dict, or None) and `curve` (``(step, metrics)`` pairs by
    step, a list) are built on each access from what the trial keeps compact, the
    `MetricsPoint`s `last` and `points` it shares with the search plan (issue 24: a dict per
    point was most of a study's memory per trial); assigning either stores it so.
    """

    id: int
    config: Config
    steps: int
    tag: Any = None
    status: str = PENDING
    node: str = ""
    last: MetricsPoint | None = None
    reported: int = 0
    points: list[MetricsPoint] = field(default_factory=list)
    error: str | None = None
    cause: str | None = None
    submitted_at: float = 0.0
    finished_at: float | None = None
    salt: str = ""
    segments: list[tuple[str, int, int]] = field(default_factory=list)

    def __init__(
        self,
        id: int,
        config: Config,
        steps: int,
        tag: Any = None,
        status: str = PENDING,
        node: str = "",
        metrics: Mapping[str, float] | None = None,
        reported: int = 0,
        curve: Iterable[tuple[int, Mapping[str, float]]] = (),
        error: str | None = None,
        cause: str | None = None,
        submitted_at: float = 0.0,
        finished_at: float | None = None,
        salt: str = "",
        segments: list[tuple[str, int, int]] | None = None,
    ) -> None:
        """The fields in their order, as before the compact points: `metrics` and `curve`
        are taken as dicts and stored as points."""
        self.id, self.config, self.steps, self.tag = id, config, steps, tag
        self.status, self.node, self.reported = status, node, reported
        self.error, self.cause, self.salt = error, cause, salt
        self.submitted_at, self.finished_at = submitted_at, finished_at
        self.segments = [] if segments is None else segments
        self.metrics = metrics
        self.curve = curve

    @property
    def metrics(self) -> dict[str, float] | None:
        """The last metrics the trial received (a new dict each time), or None."""
        return None if self.last is None else self.last.as_dict()

    @metrics.setter
    def metrics(self, metrics: Mapping[str, float] | None) -> None:
        self.last = None if metrics is None else MetricsPoint.of(self.reported, metrics)

    @property
    def curve(self) -> list[tuple[int, dict[str, float]]]:
        """The metrics received, as ``(step, metrics)`` pairs by step (a new list of new dicts
        each time)."""
        return [(point[0], point.as_dict()) for point in self.points]

    @curve.setter
    def curve(self, curve: Iterable[tuple[int, Mapping[str, float]]]) -> None:
        self.points = [MetricsPoint.of(step, metrics) for step, metrics in curve]

    def __repr__(self) -> str:
        return _shown(self)

    def snapshot(self) -> TrialSnapshot:
        """The trial as it is now, frozen: what a view reads while the study goes on."""
        metrics = self.metrics
        return TrialSnapshot(
            id=self.id,
            config=self.config,
            steps=self.steps,
            tag=self.tag,
            status=self.status,
            node=self.node,
            metrics=None if metrics is None else MappingProxyType(metrics),
            reported=self.reported,
            points=tuple(self.points),
            error=self.error,
            cause=self.cause,
            submitted_at=self.submitted_at,
            finished_at=self.finished_at,
            salt=self.salt,
            segments=tuple(self.segments),
        )


#: the compact fields of a `Trial` (and a snapshot) its repr shows as what they are read as
_SHOWN = {"last": "metrics", "points": "curve"}


def _shown(record: Trial | TrialSnapshot) -> str:
    """`record` as a dataclass shows itself, with `metrics` and `curve` in place of the
    compact fields they are read from."""
    shown = (_SHOWN.get(f.name, f.name) for f in fields(record))
    return f"{type(record).__qualname__}({', '.join(f'{name}={getattr(record, name)!r}' for name in shown)})"


@dataclass(frozen=True, eq=False, repr=False)
class TrialSnapshot(_Reached):
    """A `Trial` frozen when a view of its study was taken (`Trial.snapshot`): the same fields,
    which the study's later events leave as they were. Every view reads trials as these.
    Its `curve` (a tuple of ``(step, metrics)`` pairs) is built on access from `points`, the
    trial's compact points (a view of every trial copies no metrics it does not read)."""

    id: int
    config: Config
    steps: int
    tag: Any
    status: str
    node: str
    metrics: Mapping[str, float] | None
    reported: int
    points: tuple[MetricsPoint, ...]
    error: str | None
    cause: str | None
    submitted_at: float
    finished_at: float | None
    salt: str
    segments: tuple[tuple[str, int, int], ...]

    @property
    def curve(self) -> tuple[tuple[int, Mapping[str, float]], ...]:
        """The metrics received, as ``(step, metrics)`` pairs by step (new dicts each time)."""
        return tuple((point[0], point.as_dict()) for point in self.points)

    def __repr__(self) -> str:
        return _shown(self)
