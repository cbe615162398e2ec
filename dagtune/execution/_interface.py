"""The executor interface: what the coordinator needs from a place that runs path tasks.

`DaskExecutor` (`dagtune.execution.dask`) runs tasks as Dask futures on a real cluster;
`SimulatedExecutor` runs the same tasks in virtual time. The coordinator cannot
tell them apart, so the planning code tested in simulation is the code that runs on GPUs.

Executors report what happens as the runner's typed events (`dagtune.events`: a task
started, loaded its state, trained a step, reported metrics, saved a checkpoint, declined
one, warned, ended, failed, found a corrupt checkpoint, checked fusion). An event may be delivered twice (streamed, then again with the task's
result); the coordinator ignores repeats. The events of one step come out of one `poll`
(the runner produces them together), so the step is counted together with the metrics it
produced, and a task's `TaskEnded` comes after all its other events.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

from dagtune.events import TaskEvent
from dagtune.tasks import Directive, PathTask

__all__ = ["Executor"]


class Executor(ABC):
    """A place that runs path tasks (see the module docstring)."""

    #: whether the clock is virtual: a simulation is turned by the study's waiting caller,
    #: a real cluster by a driver thread that polls it (`dagtune.study`)
    virtual: ClassVar[bool] = False
    #: the checkpoint store its tasks write and read (a study given this executor keeps its
    #: records there when it is a `dagtune.checkpoints.CheckpointStore`), or None
    store: Any = None

    @abstractmethod
    def slots(self) -> int:
        """How many tasks (a fused group counting as one) can run at once right now."""

    @abstractmethod
    def launch(self, task: PathTask, priority: float = 0.0, prefer: str | None = None) -> None:
        """Start `task`; `prefer` names a worker holding its source point in memory."""

    @abstractmethod
    def launch_group(self, tasks: list[PathTask], priority: float = 0.0, prefer: str | None = None) -> None:
        """Start `tasks` (pairwise `dagtune.fusion.can_fuse`) as ONE fused task on one slot,
        lock-stepped by `dagtune.fusion.FusedPathRunner`: events come under each task's own
        key, as its `launch` would give them, and `direct` takes each task's key."""

    @abstractmethod
    def direct(self, key: str, directive: Directive) -> None:
        """Send a running task new wanted checkpoints or a step to stop at."""

    @abstractmethod
    def poll(self, timeout: float | None = None) -> list[TaskEvent]:
        """Events that happened since the last poll, waiting up to `timeout` seconds for one
        (a simulated executor advances virtual time to the next event instead); never part
        of a step's events without the rest."""

    @abstractmethod
    def now(self) -> float:
        """Seconds on the executor's clock (wall clock, or virtual time)."""

    def abandon(self, key: str, worker: str | None) -> None:  # noqa: B027 - an optional hook
        """Give up task `key`, still running on `worker` (a step outlasted the study's
        ``step_timeout``, and a running task can't be cancelled): stop what runs it and
        replace that worker. Its error event came already. A simulated task never hangs."""

    def close(self) -> None:  # noqa: B027 - an optional hook
        """Release what the executor started."""
