"""The tasks running: each one's record (`Running`), indexed by the plan nodes its path
covers, and what they will still deliver.

`RunningTasks` is the `dagtune.plan.InFlight` the stage tree is built against: claiming a
point asks the task that passes it to deliver it (checkpoint it on its way, run at least that
far); a task nothing claims is needed by no trial and may stop. `peek` answers the same
questions without claiming anything (for drawing the tree).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from dagtune.coordinator._kept import HeldPoints
from dagtune.plan import InFlight, SearchPlan
from dagtune.scheduling import CostModel, Pausable
from dagtune.tasks import Directive, PathTask

__all__ = ["Running", "RunningTasks", "Slot"]


@dataclass(eq=False, slots=True)
class Slot:
    """The worker slot a task occupies: its own, or one its fused task's members share (a
    fused task runs as one task on one slot), with the GPU time counted for it so far."""

    fused: bool = False
    charged: float | None = None  # the slot's time is counted up to here

    def uncounted_since(self, started: float) -> float:
        """Where the slot's time not counted yet begins (`started`, a member's start, until
        some of it is counted)."""
        return started if self.charged is None else self.charged

    def charge(self, started: float, until: float) -> float:
        """Seconds of this slot up to `until` not counted yet: counted once however many
        members share it."""
        begin = self.uncounted_since(started)
        self.charged = max(begin, until)
        return max(0.0, until - begin)


@dataclass(slots=True)
class Running:
    """A launched path task: where it runs (`worker`, since `started`), how far it got
    (`progress`), the points the last stage tree claimed from it, the directive it was last
    sent, the step it is asked to pause at, and the `slot` it occupies."""

    task: PathTask
    priority: float
    worker: str | None = None
    started: float | None = None
    progress: int = 0
    claimed: set[int] = field(default_factory=set)
    directive: Directive = field(default_factory=Directive)
    pause_at: int | None = None
    number: int = 0  # start order among the coordinator's tasks
    slot: Slot = field(default_factory=Slot)


class RunningTasks(Mapping[str, Running]):
    """The running tasks by key (see the module docstring).

    What the coordinator asks of them at every round is kept as tasks start, end and are
    redirected, never found by walking them: the slots they occupy (`slots_used`), the
    points they need (`needed`) and which of them share a slot."""

    def __init__(self) -> None:
        self._tasks: dict[str, Running] = {}
        #: every point a running task starts from or may resume from (its source, and the
        #: checkpoints it saves on its way), held once per task that needs it
        self.needed = HeldPoints()
        self._sharing: dict[int, int] = {}  # id of an occupied slot -> the tasks on it
        self._on_node: dict[str, list[str]] = {}  # node -> running task keys covering it
        self._ending: dict[tuple[str, int], dict[str, None]] = {}  # end point -> tasks ending there
        self._bounded: dict[str, None] = {}  # tasks of several segments: a boundary to pause at

    def __getitem__(self, key: str) -> Running:
        return self._tasks[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._tasks)

    def __len__(self) -> int:
        return len(self._tasks)

    def start(self, key: str, running: Running) -> None:
        self._tasks[key] = running
        slot = id(running.slot)
        self._sharing[slot] = self._sharing.get(slot, 0) + 1
        for point in _needed_points(running):
            self.needed.add(point)
        for segment in running.task.segments:
            self._on_node.setdefault(segment.node, []).append(key)
        task = running.task
        self._ending.setdefault((task.node_at(task.end), task.end), {})[key] = None
        if len(task.segments) > 1:
            self._bounded[key] = None

    def end(self, key: str) -> Running:
        running = self._tasks.pop(key)
        slot = id(running.slot)
        if self._sharing[slot] == 1:
            del self._sharing[slot]
        else:
            self._sharing[slot] -= 1
        for point in _needed_points(running):
            self.needed.remove(point)
        for segment in running.task.segments:
            keys = self._on_node.get(segment.node)
            if keys is not None and key in keys:
                keys.remove(key)
                if not keys:  # an emptied list per node trained once was kept for the study's life
                    del self._on_node[segment.node]
        task = running.task
        end = (task.node_at(task.end), task.end)
        del self._ending[end][key]
        if not self._ending[end]:
            del self._ending[end]
        self._bounded.pop(key, None)
        return running

    def ending_at(self, point: tuple[str, int]) -> Iterator[Running]:
        """The running tasks whose path ends at `point`, in launch order."""
        return (self._tasks[key] for key in self._ending.get(point, ()))

    def direct(self, key: str, directive: Directive) -> None:
        """Task `key` is sent `directive` (the checkpoints it saves may change)."""
        running = self._tasks[key]
        before = _needed_points(running)
        running.directive = directive
        after = _needed_points(running)
        for point in after - before:
            self.needed.add(point)
        for point in before - after:
            self.needed.remove(point)

    def slots_used(self) -> int:
        """The worker slots the running tasks occupy (a fused task's members share one)."""
        return len(self._sharing)

    def busy_seconds(self, now: float) -> float:
        """Seconds the occupied slots have run up to `now` and not counted yet (a slot once)."""
        begun: dict[int, float] = {}
        for running in self._tasks.values():
            if running.started is not None:
                begin = running.slot.uncounted_since(running.started)
                begun[id(running.slot)] = min(begun.get(id(running.slot), begin), begin)
        return sum(max(0.0, now - begin) for begin in begun.values())

    # ------------------------------------------------------------------ InFlight

    def claim(self, node: str, step: int) -> str | None:
        """A running task that still passes point ``(node, step)``, which must deliver it."""
        key = self._passing(node, step)
        if key is not None:
            self._tasks[key].claimed.add(step)
        return key

    def latest_before(self, node: str, step: int) -> tuple[int, str] | None:
        """The latest point on `node` before `step` a running task will reach, claimed."""
        best = self._latest_before(node, step)
        if best is not None:
            self._tasks[best[1]].claimed.add(best[0])
        return best

    def peek(self) -> InFlight:
        """The same answers as `claim` and `latest_before`, claiming nothing."""
        return _Peek(self)

    def _passing(self, node: str, step: int) -> str | None:
        for key in self._on_node.get(node, ()):
            running = self._tasks[key]
            if running.progress < step and any(
                s.node == node and s.start < step <= s.end for s in running.task.segments
            ):
                return key
        return None

    def _latest_before(self, node: str, step: int) -> tuple[int, str] | None:
        best: tuple[int, str] | None = None
        for key in self._on_node.get(node, ()):
            running = self._tasks[key]
            for segment in running.task.segments:
                later = best is None or segment.end > best[0]
                if segment.node == node and running.progress < segment.end < step and later:
                    best = (segment.end, key)
        return best

    # ------------------------------------------------------------------ what they need, what they may give up

    def unneeded(self) -> list[str]:
        """The tasks the last stage tree claimed nothing from."""
        return [key for key, running in self._tasks.items() if not running.claimed]

    def pausable(
        self, below: Callable[[str], Iterable[tuple[int, float]]], cost: CostModel, plan: SearchPlan
    ) -> list[Pausable]:
        """Running tasks with a stage boundary still ahead that alone occupy their slot, and
        the longest chain each would leave behind by pausing there: the rest of its path, then
        what hangs below the points it delivers (`below(task)`: ``(step, priority)`` of each
        stage sourced from it). Only tasks of several segments have a boundary: the others are
        not looked at."""

        def seconds(task: PathTask, start: int, end: int) -> float:
            """Estimated seconds of training `task`'s steps ``[start, end)``."""
            return sum(
                max(0, min(s.end, end) - max(s.start, start)) * cost.step_seconds(s.node, plan)
                for s in task.segments
            )

        found = []
        for key in self._bounded:
            running = self._tasks[key]
            if self._sharing[id(running.slot)] > 1:
                continue  # pausing one member of a fused task frees no slot
            task = running.task
            step = min((s.end for s in task.segments if running.progress < s.end < task.end), default=None)
            if step is None:
                continue
            own = seconds(task, step, task.end)
            hanging = [seconds(task, step, at) + p for at, p in below(key) if at > step]
            found.append(Pausable(key, step, max([own, *hanging])))
        return found


def _needed_points(running: Running) -> set[tuple[str, int]]:
    """The points task `running` starts from or may resume from: its source, and the
    checkpoints it saves on its way."""
    task = running.task
    points = {
        (task.node_at(step), step)
        for step in task.checkpoints | running.directive.checkpoints
        if task.start < step <= task.end
    }
    if task.source is not None:
        points.add(task.source)
    return points


class _Peek:
    """`InFlight` over running tasks that claims nothing (`RunningTasks.peek`)."""

    def __init__(self, tasks: RunningTasks):
        self.tasks = tasks

    def claim(self, node: str, step: int) -> str | None:
        return self.tasks._passing(node, step)

    def latest_before(self, node: str, step: int) -> tuple[int, str] | None:
        return self.tasks._latest_before(node, step)
