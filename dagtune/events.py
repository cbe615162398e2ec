"""What a running task tells the coordinator: one frozen dataclass per kind of event,
matched by type.

Every event names its task (`task`, the task's key), the runner's `attempt` (a task run
again after a lost worker is a new attempt: the coordinator handles each once) and the
point it is about (`node`, `step`). A runner makes them (`dagtune.runner`,
`dagtune.fusion`); an executor hands them over as they are (`SimulatedExecutor`) or as
plain dicts that cross the Dask scheduler (`to_wire`, `from_wire`: ``{"kind": ..., field:
value}``, msgpack-able).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

__all__ = [
    "CheckpointCorrupt",
    "CheckpointDeclined",
    "CheckpointSaved",
    "Event",
    "FusionChecked",
    "MetricsReported",
    "StateLoaded",
    "StepDone",
    "TaskEnded",
    "TaskEvent",
    "TaskFailed",
    "TaskStarted",
    "TrainerWarned",
    "from_wire",
    "to_wire",
]


@dataclass(frozen=True)
class TaskEvent:
    """What every event has: the task, the runner's attempt, the point it is about (`node`
    is None for a fresh trainer's step 0, ``""`` when the task was lost before any point)."""

    kind: ClassVar[str] = ""
    task: str
    attempt: str
    node: str | None
    step: int


@dataclass(frozen=True)
class TaskStarted(TaskEvent):
    """The task started on `worker` at `time` (wall clock), at step `step` of its path."""

    kind: ClassVar[str] = "start"
    worker: str | None
    time: float | None


@dataclass(frozen=True)
class StateLoaded(TaskEvent):
    """The task's starting state came from the worker's `memory` or from `storage` (`origin`)."""

    kind: ClassVar[str] = "load"
    origin: str


@dataclass(frozen=True)
class MetricsReported(TaskEvent):
    """The metrics of point ``(node, step)``: the step's training metrics and its evaluation."""

    kind: ClassVar[str] = "metrics"
    metrics: dict[str, float]


@dataclass(frozen=True)
class CheckpointSaved(TaskEvent):
    """A checkpoint of point ``(node, step)`` is committed (`nbytes`, its `sha256`)."""

    kind: ClassVar[str] = "checkpoint"
    nbytes: int = 0
    sha256: str = ""


@dataclass(frozen=True)
class StepDone(TaskEvent):
    """Step `step` is trained, in `seconds`, with training metrics `train`; it comes after
    everything the step produced."""

    kind: ClassVar[str] = "step"
    seconds: float
    train: dict[str, float]


@dataclass(frozen=True)
class CheckpointDeclined(TaskEvent):
    """A checkpoint the coordinator asked for at ``(node, step)`` is already passed."""

    kind: ClassVar[str] = "declined"


@dataclass(frozen=True)
class TrainerWarned(TaskEvent):
    """A warning about the trainer (`category`: a warning class's name; `once`: what it is
    about, shown once per study)."""

    kind: ClassVar[str] = "warning"
    category: str
    message: str
    once: str


@dataclass(frozen=True)
class CheckpointCorrupt(TaskEvent):
    """The checkpoint at ``(node, step)`` failed verification when the task loaded it; the
    task ended without training."""

    kind: ClassVar[str] = "corrupt"
    worker: str | None
    time: float | None
    error: str


@dataclass(frozen=True)
class TaskEnded(TaskEvent):
    """The task ended at ``(node, step)``: its path is ``done``, it ``stopped`` where it was
    told to (or paused), or its fused group found the trainer cannot fuse (``unfused``)."""

    kind: ClassVar[str] = "end"
    worker: str | None
    reason: str
    time: float | None


@dataclass(frozen=True)
class TaskFailed(TaskEvent):
    """Training failed at ``(node, step)`` (`cause`: one of `dagtune.records.CAUSES`), or the
    task was `lost` with its worker (`killed`: it took down the workers that ran it).
    `retry`: whether training the stage again may succeed (not after a failed check of the
    trainer's code, `dagtune.errors.TrainerCheckError`)."""

    kind: ClassVar[str] = "error"
    time: float | None
    error: str
    traceback: str = ""
    cause: str = "trainer"
    worker: str | None = None
    lost: bool = False
    killed: bool = False
    retry: bool = True


@dataclass(frozen=True)
class FusionChecked(TaskEvent):
    """A fused task checked its trainer: it fuses (`ok`), or not and why (`reason`)."""

    kind: ClassVar[str] = "fusion"
    worker: str | None
    time: float | None
    ok: bool
    reason: str


Event = (
    TaskStarted
    | StateLoaded
    | MetricsReported
    | CheckpointSaved
    | StepDone
    | CheckpointDeclined
    | TrainerWarned
    | CheckpointCorrupt
    | TaskEnded
    | TaskFailed
    | FusionChecked
)

_BY_KIND: dict[str, type[TaskEvent]] = {
    cls.kind: cls
    for cls in (
        TaskStarted,
        StateLoaded,
        MetricsReported,
        CheckpointSaved,
        StepDone,
        CheckpointDeclined,
        TrainerWarned,
        CheckpointCorrupt,
        TaskEnded,
        TaskFailed,
        FusionChecked,
    )
}
_FIELDS = {cls: tuple(f.name for f in dataclasses.fields(cls)) for cls in _BY_KIND.values()}


def to_wire(event: TaskEvent) -> dict[str, Any]:
    """`event` as a plain dict (``kind`` and every field) that msgpack carries."""
    return {"kind": event.kind, **{name: getattr(event, name) for name in _FIELDS[type(event)]}}


def from_wire(wire: dict[str, Any]) -> TaskEvent:
    """The event `to_wire` made `wire` from (a ValueError names an unknown kind)."""
    cls = _BY_KIND.get(wire.get("kind"))
    if cls is None:
        raise ValueError(f"not a task event: kind {wire.get('kind')!r}")
    return cls(**{name: wire[name] for name in _FIELDS[cls] if name in wire})
