"""What the coordinator hands to an executor: a path of stages to train, and its directives.

These are plain, picklable values shared by the coordinator, the executors (Dask and
simulated) and the worker-side runner.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dagtune.config import Config

__all__ = ["Directive", "PathTask", "Segment", "TrainerSpec"]


@dataclass(frozen=True)
class TrainerSpec:
    """How to build the trainer on a worker, and the model identity it belongs to."""

    cls: type
    kwargs: dict[str, Any]
    seed: int
    identity: str


@dataclass(frozen=True)
class Segment:
    """Train `config` (the config of search-plan node `node`) over steps ``[start, end)``."""

    node: str
    config: Config
    start: int
    end: int


@dataclass(frozen=True)
class PathTask:
    """Consecutive segments along one root-to-leaf path, run by one worker in one go.

    `source` is the checkpoint point the first segment resumes from, or None for a fresh
    trainer at step 0. `checkpoints` are the absolute steps to save at (every stage end,
    points other paths branch from, periodic saves); metrics are evaluated every
    `eval_every` steps and always at checkpoints and at the path's end. Each worker checks
    its first `check_evaluate` evaluations of the model for changing the training state
    (`dagtune.evalcheck`) and its first `check_resume` checkpoints of it for resuming
    exactly (`dagtune.resumecheck`). The trainer's code runs with torch's thread count set
    to `torch_threads` (None: as the worker has it). A fused group whose task has a
    `fusion_check` (``"probe"`` or ``"agreement"``, `dagtune.fusion.check_fusion`) checks its
    trainer before training. `step_timeout` (seconds, None: no limit) is how long the task
    may go without finishing a step before the worker gives it up (`dagtune.execution.dask`).
    `checkpoint_interval` (seconds, None: never) also saves a checkpoint, unplanned, at the
    end of the first step that ends at least that long after the task's last save (or after
    it began training), so that a lost worker, an interrupt or a killed coordinator loses at
    most about that much training; it adds no evaluation, so what is trained and reported
    does not depend on the clock, only which extra checkpoints exist.
    """

    key: str
    trainer: TrainerSpec
    segments: tuple[Segment, ...]
    source: tuple[str, int] | None
    checkpoints: frozenset[int]
    eval_every: int = 1
    topic: str = ""
    check_evaluate: int = 0
    fusion_check: str | None = None
    check_resume: int = 0
    torch_threads: int | None = None
    step_timeout: float | None = None
    checkpoint_interval: float | None = None

    @property
    def start(self) -> int:
        return self.segments[0].start

    @property
    def end(self) -> int:
        return self.segments[-1].end

    @property
    def steps(self) -> int:
        return self.end - self.start

    def node_at(self, step: int) -> str:
        """The node owning point `step` (the segment that trains step ``step - 1``)."""
        for segment in self.segments:
            if segment.start < step <= segment.end:
                return segment.node
        raise ValueError(f"step {step} is not on task {self.key} ({self.start}, {self.end}]")


@dataclass(frozen=True)
class Directive:
    """Changes to a running task: extra checkpoints wanted on its way (trials that branched
    off while it ran), the step to stop at (its later work was cancelled), and a stage
    boundary to pause at if it has not passed it yet (a longer stage waits for its worker;
    the rest of the path runs later from the checkpoint saved there)."""

    checkpoints: frozenset[int] = field(default_factory=frozenset)
    stop_at: int | None = None
    pause_at: int | None = None

    def to_dict(self) -> dict:
        return {"checkpoints": sorted(self.checkpoints), "stop_at": self.stop_at, "pause_at": self.pause_at}

    @staticmethod
    def from_dict(data: dict | None) -> Directive:
        if not data:
            return Directive()
        return Directive(frozenset(data.get("checkpoints", ())), data.get("stop_at"), data.get("pause_at"))
