"""Which stages to run next: a cost model, critical-path priorities and path batching.

Hippo §4.3: the priority of a stage is the estimated time of the longest path from it to a
leaf; the scheduler hands a whole path (the stage, then its highest-priority child, and so
on to a leaf) to one worker, and repeats on what remains. Running the critical path first
bounds the makespan by the longest chain; batching a path on one worker keeps the trainer
in memory between its stages. Breadth-first (one stage at a time, shallowest first) and
FIFO (the oldest request's whole path first, what a trial-based system does) are kept for
comparison.

Committing a worker to a whole path has one cost: when every worker is busy and a stage
with a longer chain below it becomes ready, it waits for a path to end. So the critical-path
policy may also *pause* a running path at its next stage boundary (where a checkpoint is
saved anyway) when a waiting ready stage has more work below it than the path would leave
behind: Hu's highest-level-first rule, applied at stage ends. Ties never pause.

Policies are pure functions of the stage tree: they return decisions, they do not act. A
policy states its order as keys (`ready_key`, `path_key`), so the same order applies to a
rebuilt `StageTree` (`pick`) and to the ready queue `dagtune.planner.IncrementalPlanner`
keeps up to date.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from dagtune.plan import SearchPlan, Stage, StageTree, build_stage_tree
from dagtune.records import ScheduleView, Span

__all__ = [
    "BreadthFirst",
    "CostModel",
    "CriticalPath",
    "Fifo",
    "HeldStages",
    "Pausable",
    "SchedulingPolicy",
    "held_stages",
    "policy_named",
    "schedule_view",
    "view_of_stages",
]


class CostModel:
    """Seconds per step of each config segment (search-plan node), measured as stages run.

    Before a node has been measured its estimate is its parent's, else the mean of all
    measurements, else `default`. `observers` hear the node of every measurement (a planner
    keeping priorities refreshes the estimates it used).
    """

    def __init__(self, default: float = 1.0, smoothing: float = 0.3):
        if default <= 0:
            raise ValueError(f"CostModel.default must be positive, got {default!r}")
        self.default = default
        self.smoothing = smoothing
        self._per_node: dict[str, float] = {}
        self._total = 0.0
        self._count = 0
        self.observers: list[Callable[[str], None]] = []

    def observe(self, node: str, seconds: float) -> None:
        """Record that one step of `node` took `seconds`."""
        previous = self._per_node.get(node)
        self._per_node[node] = (
            seconds if previous is None else previous + self.smoothing * (seconds - previous)
        )
        self._total += seconds
        self._count += 1
        for observer in self.observers:
            observer(node)

    def measured(self, node: str) -> bool:
        """Whether `node` has an estimate of its own."""
        return node in self._per_node

    def unmeasured_seconds(self) -> float:
        """The estimate of a node with no measured ancestor: the mean, else `default`."""
        return self._total / self._count if self._count else self.default

    def step_seconds(self, node: str, plan: SearchPlan | None = None) -> float:
        current: str | None = node
        while current is not None:
            if current in self._per_node:
                return self._per_node[current]
            current = plan.nodes[current].parent if plan is not None else None
        return self.unmeasured_seconds()

    def stage_seconds(self, stage: Stage, plan: SearchPlan | None = None) -> float:
        return stage.steps * self.step_seconds(stage.node, plan)


def critical_path_priorities(tree: StageTree, cost: CostModel, plan: SearchPlan | None = None) -> list[float]:
    """For every stage, the estimated seconds of the longest path from it down to a leaf."""
    priority = [0.0] * len(tree.stages)
    for stage in _bottom_up(tree):
        below = max((priority[c] for c in stage.children), default=0.0)
        priority[stage.index] = cost.stage_seconds(stage, plan) + below
    return priority


def schedule_view(plan: SearchPlan, running: Mapping[str, Any], cost: CostModel) -> ScheduleView:
    """What is being trained and what waits, and the critical path (`dagtune.records.ScheduleView`),
    from a stage tree rebuilt from scratch: the reference, and the view of a coordinator that
    keeps no incremental planner (`dagtune.planner.IncrementalPlanner.schedule_view` reads its
    live tree instead, the same view without rebuilding the tree).

    `running` maps task keys to the running tasks (each with its `task.segments` and the
    `progress` it reported) and draws the stage tree through ``running.peek()``, which
    claims nothing: drawing changes no plan and no task."""
    tree = build_stage_tree(plan, running.peek())  # type: ignore[attr-defined]
    priority = critical_path_priorities(tree, cost, plan)
    held = held_stages(
        tree.stages,
        lambda stage: priority[stage.index],
        lambda stage: [tree.stages[c] for c in stage.children],
    )
    return view_of_stages(held, running, cost, plan)


class HeldStages(NamedTuple):
    """A stage tree as a view reads it, however it is held (rebuilt, or the incremental
    planner's live one, which keeps these between views): the `queued` stages' spans
    ``(node, start, end)`` in the order `build_stage_tree` numbers the stages, the `top`
    stage (the root with the longest path below it, the first in that order among equals;
    None without stages), and `best`: the child of a stage that the critical path continues
    with (the longest path below it, the first of its children in that order among equals;
    None for a leaf). Stages have ``node``, ``start``, ``end`` and ``source_task``. The live
    planner answers `best` from the children it keeps by priority, without reading them all
    (a branch point with thousands of children)."""

    queued: Sequence[Span]
    top: Any | None
    best: Callable[[Any], Any | None]


def held_stages(
    stages: Sequence[Any], priority: Callable[[Any], float], children: Callable[[Any], Iterable[Any]]
) -> HeldStages:
    """`HeldStages` of `stages` in the builder's order (each also with ``parent``: None for a
    root), walking them all; `children` lists a stage's children in that order."""
    roots = [s for s in stages if s.parent is None]
    return HeldStages(
        tuple((s.node, s.start, s.end) for s in stages),
        max(roots, key=priority) if roots else None,  # `max` keeps the first of equals
        lambda stage: max(children(stage), key=priority, default=None),
    )


def view_of_stages(
    held: HeldStages, running: Mapping[str, Any], cost: CostModel, plan: SearchPlan
) -> ScheduleView:
    """The `ScheduleView` of the stage tree `held`. Ties on the critical path go to the stage
    first in the builder's order: which of equal paths the page draws (the critical-path
    scheduler breaks such ties by rank first, `CriticalPath.path_key`, so where ranks differ
    the path drawn may not be the one it follows). It reads the running tasks and the
    critical path, not every stage (`held` has the queued spans and the top stage)."""
    queued = held.queued if isinstance(held.queued, tuple) else tuple(held.queued)
    return ScheduleView(
        running=tuple(span for run in running.values() for span in _spans_left(run)),
        queued=queued,
        critical=tuple(_critical_spans(held, running, cost, plan)),
        running_tasks=len(running),
        queued_stages=len(queued),
    )


def _critical_spans(
    held: HeldStages, running: Mapping[str, Any], cost: CostModel, plan: SearchPlan
) -> list[Span]:
    """The critical path: from the stage with the longest path below it (and the running
    task it waits for, if any) down its longest branch; with nothing queued, the running
    task with the most work left. `max` keeps the first of equals: the earliest stage."""
    _, stage, best = held
    spans: list[Span] = []
    if stage is not None:
        if stage.source_task in running:
            spans.extend(_spans_left(running[stage.source_task]))
        while stage is not None:
            spans.append((stage.node, stage.start, stage.end))
            stage = best(stage)
        return spans
    if running:

        def left(run: Any) -> float:
            return sum((b - a) * cost.step_seconds(n, plan) for n, a, b in _spans_left(run))

        spans.extend(_spans_left(max(running.values(), key=left)))
    return spans


def _spans_left(run: Any) -> list[Span]:
    """What a running task still has to train."""
    return [(s.node, max(s.start, run.progress), s.end) for s in run.task.segments if s.end > run.progress]


def _bottom_up(tree: StageTree) -> list[Stage]:
    """Stages with every child before its parent."""
    order: list[Stage] = []
    stack = [(root, False) for root in tree.roots]
    while stack:
        stage, expanded = stack.pop()
        if expanded:
            order.append(stage)
            continue
        stack.append((stage, True))
        stack.extend((tree.stages[c], False) for c in stage.children)
    return order


@dataclass(frozen=True)
class Pausable:
    """A running path that could pause at the stage boundary `step` ahead of it, leaving
    `remaining` estimated seconds of longest chain (its own rest and what hangs below) for
    later."""

    task: str
    step: int
    remaining: float


class SchedulingPolicy(ABC):
    """Chooses up to `slots` paths of ready stages to start now, and which running paths
    to pause for the ready stages left waiting (none by default).

    The order is given by keys: ready stages start by `ready_key` (smallest first, ties in
    tree order: the index a rebuilt tree gives), and a path continues with the child of
    smallest `path_key` (ties: the child listed first). `follows_priority` says that
    `path_key` is ``(-priority, rank)``, which lets a planner find that child without
    scanning a branch point's children.
    """

    name: str
    follows_priority = False

    @abstractmethod
    def ready_key(self, stage: Stage, priority: float, depth: int) -> tuple:
        """Sort key of a ready stage (`depth`: its plan node's depth)."""

    def path_key(self, stage: Stage, priority: float) -> tuple | None:
        """Sort key of a child to continue a path with; None: paths are single stages."""
        return None

    def preempt(
        self, waiting: Iterable[Stage], priority: Mapping[int, float], pausable: list[Pausable]
    ) -> dict[str, int]:
        """Running tasks to pause, as task key -> boundary step. `waiting` are the ready
        stages left without a slot, in any order (see `preempt_ordered`)."""
        return {}

    def preempt_ordered(
        self, waiting: Iterable[Stage], priority: Mapping[int, float], pausable: list[Pausable]
    ) -> dict[str, int]:
        """`preempt` with `waiting` already in `ready_key` order (read only as far as needed)."""
        return self.preempt(waiting, priority, pausable)

    def pick(
        self,
        tree: StageTree,
        slots: int,
        cost: CostModel,
        plan: SearchPlan | None = None,
        priority: list[float] | None = None,
    ) -> list[list[Stage]]:
        """Paths to launch, best first; each starts with a ready stage and follows children.
        `priority` (from `critical_path_priorities`) is computed if not given."""
        if slots <= 0:
            return []
        if priority is None:
            priority = critical_path_priorities(tree, cost, plan)
        depth = (lambda s: plan.nodes[s.node].depth) if plan is not None else (lambda s: 0)
        ready = sorted(tree.ready(), key=lambda s: (*self.ready_key(s, priority[s.index], depth(s)), s.index))
        paths = []
        for stage in ready[:slots]:
            path = [stage]
            while path[-1].children and self.path_key(path[-1], priority[path[-1].index]) is not None:
                children = [tree.stages[c] for c in path[-1].children]
                path.append(
                    min(
                        enumerate(children),
                        key=lambda pair: (*self.path_key(pair[1], priority[pair[1].index]), pair[0]),
                    )[1]
                )
            paths.append(path)
        return paths


class CriticalPath(SchedulingPolicy):
    """Longest remaining path first; a whole path per worker (Hippo's scheduler)."""

    name = "critical_path"
    follows_priority = True

    def ready_key(self, stage: Stage, priority: float, depth: int) -> tuple:
        return (-priority, stage.rank)

    def path_key(self, stage: Stage, priority: float) -> tuple:
        return (-priority, stage.rank)

    def preempt(
        self, waiting: Iterable[Stage], priority: Mapping[int, float], pausable: list[Pausable]
    ) -> dict[str, int]:
        ordered = sorted(waiting, key=lambda s: (-priority[s.index], s.rank, s.index))
        return self.preempt_ordered(ordered, priority, pausable)

    def preempt_ordered(
        self, waiting: Iterable[Stage], priority: Mapping[int, float], pausable: list[Pausable]
    ) -> dict[str, int]:
        """Pair the longest waiting stages with the running paths that leave the least behind,
        while the waiting chain is strictly longer."""
        shortest = sorted(pausable, key=lambda p: (p.remaining, p.task))
        pauses: dict[str, int] = {}
        for stage in waiting:
            if not shortest or priority[stage.index] <= shortest[0].remaining:
                break
            victim = shortest.pop(0)
            pauses[victim.task] = victim.step
        return pauses


class BreadthFirst(SchedulingPolicy):
    """One stage at a time, shallowest first (the baseline Hippo compares against)."""

    name = "breadth_first"

    def ready_key(self, stage: Stage, priority: float, depth: int) -> tuple:
        return (depth, stage.start, stage.rank)


class Fifo(SchedulingPolicy):
    """The oldest request's whole path first: trial-based execution order (Ray Tune's FIFO)."""

    name = "fifo"

    def ready_key(self, stage: Stage, priority: float, depth: int) -> tuple:
        return (stage.rank,)

    def path_key(self, stage: Stage, priority: float) -> tuple:
        return (stage.rank,)


_POLICIES = {cls.name: cls for cls in (CriticalPath, BreadthFirst, Fifo)}


def policy_named(name: str | SchedulingPolicy) -> SchedulingPolicy:
    """A policy instance from its name ("critical_path", "breadth_first", "fifo")."""
    if isinstance(name, SchedulingPolicy):
        return name
    if name not in _POLICIES:
        raise ValueError(f"scheduling policy must be one of {sorted(_POLICIES)}, got {name!r}")
    return _POLICIES[name]()
