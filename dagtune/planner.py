"""Incremental planning: the stage tree, its critical-path priorities and the ready queue,
kept up to date instead of rebuilt at every scheduling round.

A coordinator that rebuilds the stage tree and its priorities whenever something changed
pays for every stage at every event: trials x events. `IncrementalPlanner` holds the same
state and updates what a change reaches:

- the stages, through a `LiveStageTree` that follows the search plan (requests, metrics,
  checkpoints, whoever makes them) and the running tasks (`task_launched`,
  `task_progressed`, `task_ended`);
- each stage's priority, the estimated seconds of the longest path from it to a leaf, from
  the stages that changed up to their roots;
- the ready stages, in the scheduling policy's order, so that `pick` reads the best `slots`
  of them and follows their paths without sorting anything.

Its parts, one job each: the estimate each node is priced with (`Pricing`, below), the ready
queue (`_ReadyQueue`), the stages that start from a running task's point (`_Sources`) and a
branch point's children by priority (`_Ordered`); the planner joins them.

`build_stage_tree` with `critical_path_priorities` stays the reference: `tree()` returns the
same `StageTree` (same numbering) and the same priorities, and `pick(slots)` the same paths
as ``policy.pick(tree, slots, ...)``.

Cost estimates. A priority multiplies a stage's steps by its node's estimated seconds per
step (`CostModel`), and every measured step moves an estimate: a node's own, which its
unmeasured descendants inherit, and the mean, which every node without a measured ancestor
uses. Following each of them exactly would touch most of the tree at every step event. So
the planner re-prices a node's stages when the estimate it used and the cost model's differ
by more than `tolerance` (relative); with ``tolerance=0`` it follows every change exactly.
`estimates` is the cost model the priorities were computed with: the rebuilt priorities
under it are equal to the planner's, and each of its estimates is within `tolerance` of
the live cost model's.

Costs (n stages, w wanted steps on a node): a plan change or a task event updates the stages it
reaches on its node and its ancestors (O(log w) per step it decides or source point it moves;
see `LiveStageTree`), then prices the stages that changed and, while their priority changes,
the stages above them: a priority is a maximum over the stages below, so a change stops going
up where it no longer moves the maximum (a sibling at a new branch point, a checkpoint or a
task event on a long trial prices a few stages, not the node's). O(log n) per stage priced (the
ready queue and a branch point's children are sorted containers); `priced` counts them.
A re-priced estimate prices every stage of the nodes whose estimate it changes, each once,
and every one of those priorities changes: the nodes re-priced together move from one value to
another, and every path below such a stage crosses its own steps, so each path's seconds, and
their maximum, move the same way (for one estimate that moved: two moving apart between two
settles can offset each other on a path through both). Beyond them it prices the stages a
change reaches, as above; a node that only changes where its estimate comes from (measured at
what it inherited) is not re-priced (`test_a_re_priced_estimate_prices_the_stages_whose_priority_changes`
counts it). It happens once per change beyond `tolerance`. `pick` costs
O(slots x path length x log n).
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from sortedcontainers import SortedList

from dagtune.plan import LiveStage, LiveStageTree, SearchPlan, StageTree
from dagtune.records import ScheduleView, Span
from dagtune.scheduling import CostModel, HeldStages, SchedulingPolicy, schedule_view, view_of_stages

__all__ = ["IncrementalPlanner", "PlannedCosts", "Pricing", "live_schedule_view"]


def _builder_order(stage: LiveStage) -> tuple[int, int, int]:
    """Sort key of live stages in the order `build_stage_tree` numbers stages: latest plan
    node first, then by start (one stage per node and start; the index only makes it total)."""
    return (-stage.order, stage.start, stage.index)


class _KeptOrder:
    """The live stages in the order `build_stage_tree` numbers them, with their spans, and the
    roots by priority: what a schedule view and `tree()` read, kept between them and patched
    from the stages that changed since the last read (`changed`: added, removed, moved, or a
    root whose priority changed), so a view no longer sorts every stage (0.097 of 0.109 s of
    a view at 10,000 trials, perf/RESULTS.md 9l).

    Nothing is kept until the first `update` (a planner nobody views pays no set insertion:
    `changed` is a no-op until then). An update places each changed stage again (a bisection
    and a list insertion, a memory move), or sorts them all once when more than an eighth of
    them changed. `placed` counts the stages placed (the tests that count a view's work read
    it)."""

    _RESORT = 8

    def __init__(self, live: Mapping[int, LiveStage]) -> None:
        self._live = live
        self._changed: set[int] | None = None  # None: nothing kept yet
        self._keys: list[tuple[int, int, int]] = []  # `_builder_order` of `stages`, sorted
        self.stages: list[LiveStage] = []
        self._spans: list[Span] = []
        self._placed: dict[int, tuple[int, int, int]] = {}  # index -> its key in `_keys`
        self._roots = SortedList()  # (-priority, *builder order) of the stages with no parent
        self._root_keys: dict[int, tuple] = {}
        self.queued: tuple[Span, ...] = ()
        self.placed = 0

    def changed(self, stage: LiveStage) -> None:
        """`stage` was added, removed or changed (its start, parent or, for a root, priority).
        Once more stages changed than are live, the next update sorts them all again, and
        nothing is collected until then (no view for a long time: the set stops growing)."""
        changed = self._changed
        if changed is not None:
            changed.add(stage.index)
            if len(changed) > 2 * len(self._live) + 64:
                self._changed = None

    def top(self) -> LiveStage | None:
        """The root with the longest path below it, the first in the builder's order among
        equals (as of the last `update`)."""
        return self._live[self._roots[0][-1]] if self._roots else None

    def update(self) -> None:
        """Bring the order, the spans and the roots to the live stages."""
        changed = self._changed
        if changed is None or len(changed) * self._RESORT > len(self._live):
            self._rebuild()
            return
        if not changed:
            return
        keys, stages, spans, live = self._keys, self.stages, self._spans, self._live
        for index in changed:
            old = self._placed.pop(index, None)
            if old is not None:
                at = bisect.bisect_left(keys, old)
                del keys[at], stages[at], spans[at]
            root = self._root_keys.pop(index, None)
            if root is not None:
                self._roots.remove(root)
            stage = live.get(index)
            if stage is not None:
                key = self._placed[index] = _builder_order(stage)
                at = bisect.bisect_left(keys, key)
                keys.insert(at, key)
                stages.insert(at, stage)
                spans.insert(at, (stage.node, stage.start, stage.end))
                self._root(stage, key)
        self.placed += len(changed)
        changed.clear()
        self.queued = tuple(spans)

    def _rebuild(self) -> None:
        self.stages = sorted(self._live.values(), key=_builder_order)
        self._keys = [_builder_order(s) for s in self.stages]
        self._spans = [(s.node, s.start, s.end) for s in self.stages]
        self._placed = {s.index: key for s, key in zip(self.stages, self._keys, strict=True)}
        self._roots, self._root_keys = SortedList(), {}
        for stage, key in zip(self.stages, self._keys, strict=True):
            self._root(stage, key)
        self.placed += len(self.stages)
        self._changed = set()
        self.queued = tuple(self._spans)

    def _root(self, stage: LiveStage, key: tuple[int, int, int]) -> None:
        if stage.parent is None:
            root = self._root_keys[stage.index] = (-stage.priority, *key)
            self._roots.add(root)


class _Ordered:
    """Items with sortable keys and the smallest among them: a dict while few, a sorted
    list once many (a branch point with thousands of children)."""

    __slots__ = ("keys", "sorted")
    _MANY = 32

    def __init__(self) -> None:
        self.keys: dict[int, tuple] = {}
        self.sorted: SortedList | None = None

    def set(self, item: int, key: tuple) -> None:
        old = self.keys.get(item)
        if old == key:
            return
        if self.sorted is not None:
            if old is not None:
                self.sorted.remove((*old, item))
            self.sorted.add((*key, item))
        self.keys[item] = key
        if self.sorted is None and len(self.keys) > self._MANY:
            self.sorted = SortedList((*k, i) for i, k in self.keys.items())

    def discard(self, item: int) -> None:
        old = self.keys.pop(item, None)
        if old is not None and self.sorted is not None:
            self.sorted.remove((*old, item))

    def best(self) -> tuple[tuple, int] | None:
        """``(key, item)`` with the smallest key, or None."""
        if self.sorted is not None:
            if not self.sorted:
                return None
            first = self.sorted[0]
            return first[:-1], first[-1]
        if not self.keys:
            return None
        item = min(self.keys, key=self.keys.__getitem__)
        return self.keys[item], item


class PlannedCosts:
    """The estimates a planner's priorities were computed with, as a `CostModel` would give
    them (pass it to `critical_path_priorities` to recompute the same priorities)."""

    def __init__(self, estimates: Mapping[str, float]):
        self._estimates = estimates

    def step_seconds(self, node: str, plan: SearchPlan | None = None) -> float:
        return self._estimates[node]

    def stage_seconds(self, stage, plan: SearchPlan | None = None) -> float:
        return stage.steps * self._estimates[stage.node]


class _Priorities(Mapping):
    """Stage index -> priority of the planner's live stages."""

    def __init__(self, stages: dict[int, LiveStage]):
        self._stages = stages

    def __getitem__(self, index: int) -> float:
        return self._stages[index].priority

    def __iter__(self) -> Iterator[int]:
        return iter(self._stages)

    def __len__(self) -> int:
        return len(self._stages)


class _ReadyQueue:
    """The ready stages in the policy's order: sorted keys, and each stage's current key."""

    __slots__ = ("keys", "sorted")

    def __init__(self) -> None:
        self.sorted = SortedList()
        self.keys: dict[int, tuple] = {}

    def put(self, index: int, key: tuple | None) -> None:
        """Queue stage `index` under `key`, or take it out (`key` None)."""
        old = self.keys.get(index)
        if key == old:
            return
        if old is not None:
            self.sorted.remove(old)
            del self.keys[index]
        if key is not None:
            self.sorted.add(key)
            self.keys[index] = key


class _Sources:
    """The stages that start from a point a running task will deliver, by task."""

    __slots__ = ("by_task", "task_of")

    def __init__(self) -> None:
        self.by_task: dict[str, dict[int, LiveStage]] = {}
        self.task_of: dict[int, str] = {}

    def note(self, stage: LiveStage) -> None:
        """Follow where `stage` starts from now."""
        task = stage.source_task if stage.source == "running" else None
        old = self.task_of.get(stage.index)
        if old == task:
            return
        if old is not None:
            self.drop(stage.index)
        if task is not None:
            self.by_task.setdefault(task, {})[stage.index] = stage
            self.task_of[stage.index] = task

    def drop(self, index: int) -> None:
        """Stage `index` starts from no running task any more (or is gone)."""
        task = self.task_of.pop(index, None)
        if task is None:
            return
        stages = self.by_task[task]
        del stages[index]
        if not stages:
            del self.by_task[task]


class Pricing:
    """The estimated seconds per step each node with stages is priced with, kept within
    `tolerance` of the cost model (module docstring, "Cost estimates"). Every such node is
    priced with ``applied[source]``, where source is its nearest measured ancestor (itself
    included) or None (the cost model's mean); `touch` is told each node whose estimate
    changed. `refreshes` counts the estimate changes applied, `repriced` the node
    re-pricings they caused."""

    def __init__(self, plan: SearchPlan, cost: CostModel, tolerance: float, touch: Callable[[str], None]):
        self.plan, self.cost, self.tolerance, self.touch = plan, cost, tolerance, touch
        self.estimate: dict[str, float] = {}  # node -> the estimate its stages are priced with
        self._source: dict[str, str | None] = {}
        self._applied: dict[str | None, float] = {}
        self._below: dict[str, int] = {}  # node -> nodes with stages in its subtree
        self._children_with: dict[str, set[str]] = {}  # node -> children with stages below
        self._roots_with: set[str] = set()
        self._observed: set[str] = set()
        self._split: set[str] = set()  # measured nodes whose estimates went to their subtree
        self.refreshes = 0
        self.repriced = 0
        cost.observers.append(self._observed.add)

    def close(self) -> None:
        """Stop following the cost model."""
        if self._observed.add in self.cost.observers:
            self.cost.observers.remove(self._observed.add)

    def _differs(self, new: float, old: float) -> bool:
        return new != old if self.tolerance == 0 else abs(new - old) > self.tolerance * abs(old)

    def track(self, node: str) -> None:
        """`node` has stages now: price it and count it in its ancestors' subtrees."""
        plan = self.plan
        source: str | None = None
        current: str | None = node
        while current is not None:
            self._below[current] = self._below.get(current, 0) + 1
            parent = plan.nodes[current].parent
            if self._below[current] == 1:
                if parent is None:
                    self._roots_with.add(current)
                else:
                    self._children_with.setdefault(parent, set()).add(current)
            if source is None and self.cost.measured(current):
                source = current
            current = parent
        if source not in self._applied:
            self._applied[source] = (
                self.cost.unmeasured_seconds() if source is None else self.cost.step_seconds(source)
            )
        self._source[node] = source
        self.estimate[node] = self._applied[source]

    def untrack(self, node: str) -> None:
        del self._source[node], self.estimate[node]
        current: str | None = node
        while current is not None:
            parent = self.plan.nodes[current].parent
            self._below[current] -= 1
            if not self._below[current]:
                del self._below[current]
                if parent is None:
                    self._roots_with.discard(current)
                else:
                    children = self._children_with[parent]
                    children.discard(current)
                    if not children:
                        del self._children_with[parent]
            current = parent

    def refresh(self) -> None:
        """Re-price the nodes whose estimate moved beyond `tolerance` since it was applied."""
        if not self._observed:
            return
        observed = list(self._observed)
        self._observed.clear()
        cost = self.cost
        for node in observed:
            if node not in self.plan.nodes:
                continue
            value = cost.step_seconds(node)
            first = node not in self._split  # its subtree priced from an ancestor until now
            if first or node not in self._applied or self._differs(value, self._applied[node]):
                self._split.add(node)
                self._applied[node] = value
                self._reprice(node, [node] if node in self._below else [])
        mean = cost.unmeasured_seconds()
        if None in self._applied and self._differs(mean, self._applied[None]):
            self._applied[None] = mean
            self._reprice(None, [r for r in self._roots_with if not cost.measured(r)])

    def _reprice(self, source: str | None, tops: list[str]) -> None:
        """Give every node with stages priced from `source` its current estimate: the nodes
        below `tops` down to (not into) measured descendants. Only a node whose estimate
        changes is re-priced (`touch`): a node now priced from another source at the same
        value (measured at what it inherited) keeps its priorities."""
        self.refreshes += 1
        value = self._applied[source]
        stack = list(tops)
        while stack:
            node = stack.pop()
            if node in self.estimate:
                self._source[node] = source
                if self.estimate[node] != value:
                    self.estimate[node] = value
                    self.repriced += 1
                    self.touch(node)
            stack.extend(c for c in self._children_with.get(node, ()) if not self.cost.measured(c))


class IncrementalPlanner:
    """Stage tree, priorities and ready queue of `plan`, kept up to date (module docstring).

    Feed it the running tasks as the coordinator launches, advances and retires them; the
    plan and the cost model it follows by itself. Queries settle pending changes first.

    Typical use in a scheduling round::

        for path in planner.pick(free):             # best paths, each a list of stages
            launch(path, planner.priorities[path[0].index])
            planner.task_launched(key, [(s.node, s.start, s.end) for s in path], path[0].start)
        pauses = policy.preempt_ordered(planner.ready(), planner.priorities, pausable)
        demand = planner.ready_count()
        directive_points = planner.wanted_of(task)  # what the tree relies on a task for

    Stages handed out are `LiveStage` objects: read them at once, they change in place.
    The order is the policy's keys (`SchedulingPolicy.ready_key`, `path_key`); a policy that
    overrides `pick` with another order (perf/schedulers.py's prototypes) needs the rebuild.
    Plan changes reach the planner synchronously (`SearchPlan.observers`), so the plan must be
    changed under the same lock as the planner is queried (the study's).
    """

    def __init__(
        self,
        plan: SearchPlan,
        cost: CostModel,
        policy: SchedulingPolicy,
        *,
        tolerance: float = 0.0,
    ):
        if not tolerance >= 0:
            raise ValueError(f"IncrementalPlanner.tolerance must be >= 0, got {tolerance!r}")
        self.plan, self.cost, self.policy, self.tolerance = plan, cost, policy, tolerance
        self._stages: dict[int, LiveStage] = {}
        self._dirty: set[int] = set()  # stages to price again at the next settle
        self._repriced: set[str] = set()  # nodes whose estimate changed: all their stages
        self._heap: list[tuple[int, int, int]] | None = None  # (-order, -start, index) while settling
        self._ready = _ReadyQueue()
        self._heads: dict[int, _Ordered] = {}  # stage -> the child-node stages continuing it
        self._drawn: dict[int, _Ordered] = {}  # the same by (-priority, -order): what views follow
        self._under: dict[int, LiveStage] = {}  # head stage -> the stage it is listed under
        self._sources = _Sources()
        self._per_node: dict[str, int] = {}  # node -> its stage count
        self.pricing = Pricing(plan, cost, tolerance, self._repriced.add)
        self.priced = 0  # stages priced so far: what the changes cost
        self.priorities: Mapping[int, float] = _Priorities(self._stages)
        self._order = _KeptOrder(self._stages)  # what views read, kept once one is taken
        self.view_reads = 0  # stages a schedule view placed again or read on its critical path
        self.live = LiveStageTree(plan, observer=self)

    def close(self) -> None:
        """Stop following the plan and the cost model."""
        self.live.close()
        self.pricing.close()

    # ------------------------------------------------------------------ running tasks

    def task_launched(self, key: str, segments: Iterable[tuple[str, int, int]], progress: int) -> None:
        """A task trains `segments` ``(node, start, end)`` from step `progress`."""
        self.live.launch(key, segments, progress)

    def task_progressed(self, key: str, progress: int) -> None:
        """Task `key` has trained up to step `progress`."""
        self.live.advance(key, progress)

    def task_ended(self, key: str) -> None:
        """Task `key` ended, failed or was lost."""
        self.live.finish(key)

    # ------------------------------------------------------------------ queries

    def settle(self) -> None:
        """Apply every pending change (queries do this first)."""
        self.live.settle()
        self.pricing.refresh()
        if not (self._dirty or self._repriced):
            return
        for node in self._repriced:
            self._dirty.update(s.index for s in self.live.stages_of(node))
        self._repriced.clear()
        stages = self._stages
        heap = [(-s.order, -s.start, s.index) for s in map(stages.get, self._dirty) if s is not None]
        heapq.heapify(heap)
        self._heap = heap
        while heap:  # later nodes, then later stages first: a stage after the stages below it
            index = heapq.heappop(heap)[2]
            stage = stages.get(index)
            if stage is not None and index in self._dirty:
                self._dirty.discard(index)
                self._price(stage)
        self._heap = None
        self._dirty = set()  # a drained set keeps its table (a burst of trials)

    def pick(self, slots: int) -> list[list[LiveStage]]:
        """What ``policy.pick(tree, slots, ...)`` returns for the rebuilt tree: up to `slots`
        paths, best first, each a ready stage followed by its chosen descendants."""
        self.settle()
        if slots <= 0:
            return []
        paths = []
        for entry in self._ready.sorted.islice(0, slots):
            path = [self._stages[entry[-1]]]
            while self.policy.path_key(path[-1], path[-1].priority) is not None:
                following = self._follow(path[-1])
                if following is None:
                    break
                path.append(following)
            paths.append(path)
        return paths

    def ready(self) -> Iterator[LiveStage]:
        """The ready stages in the policy's order (lazily: read as far as needed)."""
        self.settle()
        for entry in self._ready.sorted:
            yield self._stages[entry[-1]]

    def ready_count(self) -> int:
        self.settle()
        return len(self._ready.keys)

    def __len__(self) -> int:
        self.settle()
        return len(self._stages)

    def wanted_of(self, task: str) -> set[tuple[str, int]]:
        """The points the tree relies on running task `task` to deliver (`StageTree.wanted`)."""
        return self.live.wanted_of(task)

    def wanted_changed(self) -> set[str]:
        """The running tasks whose `wanted_of` changed since the last call."""
        return self.live.take_changed()

    def sourced_from(self, task: str) -> list[LiveStage]:
        """The stages that start from a point running task `task` will deliver."""
        self.settle()
        return list(self._sources.by_task.get(task, {}).values())

    @property
    def estimates(self) -> PlannedCosts:
        """The cost model the current priorities were computed with."""
        self.settle()
        return PlannedCosts(dict(self.pricing.estimate))

    def schedule_view(self, running: Mapping[str, Any]) -> ScheduleView:
        """What `dagtune.scheduling.schedule_view` draws for the rebuilt tree, read off the live
        one: the same spans, queued stages and critical path, priced as the scheduler prices
        them (`estimates`; with ``tolerance=0`` the cost model's). `running` maps task keys to
        the running tasks this planner was told of (`task_launched`).

        A view (the page's, every few seconds, under the study's lock) costs the pending
        changes (`settle`, as the next scheduling round would), placing again the stages that
        changed since the previous view in the order kept between views (`_KeptOrder`), a copy
        of the queued spans (one tuple of the kept list) and the critical path's walk, which
        reads each stage's best child off the children kept by priority (`_drawn`), not
        every child (a branch point with thousands of children), where a
        rebuild built the whole tree and its priorities again (the view of 100,000 trials
        mid-run: 2.45 s rebuilt, 1.59 s when each view sorted the live stages; perf/RESULTS.md
        section 9l). `view_reads` counts the stages placed and read (for the tests that count)."""
        self.settle()
        order = self._order
        before = order.placed
        order.update()
        self.view_reads += order.placed - before

        stages, drawn = self._stages, self._drawn

        def best(stage: LiveStage) -> LiveStage | None:
            """The child the critical path continues with: the highest priority, the first in
            the builder's order among equals (the next stage on the node, then child nodes'
            stages, latest node first), read off the kept orders, not off every child."""
            following = stage.next
            heads = drawn.get(stage.index)
            found = heads.best() if heads is not None else None
            head = stages[found[1]] if found is not None else None
            self.view_reads += 1 + (following is not None) + (head is not None)
            if head is None or (following is not None and following.priority >= head.priority):
                return following
            return head

        held = HeldStages(order.queued, order.top(), best)
        return view_of_stages(held, running, self.cost, self.plan)

    def tree(self) -> tuple[StageTree, list[float]]:
        """The stage tree as `build_stage_tree` numbers it, and the priorities by index."""
        self.settle()
        tree = self.live.tree()
        self._order.update()
        return tree, [s.priority for s in self._order.stages]

    # ------------------------------------------------------------------ following a path

    def _follow(self, stage: LiveStage) -> LiveStage | None:
        """The child a path continues with: smallest `path_key`, the first listed on ties
        (the next stage on the node, then child nodes' stages, latest node first)."""
        key = self.policy.path_key
        candidates: list[tuple[tuple, LiveStage]] = []
        if stage.next is not None:
            candidates.append(((*key(stage.next, stage.next.priority), 0, 0), stage.next))
        heads = self._heads.get(stage.index)
        if heads is not None:
            if self.policy.follows_priority:
                _, index = heads.best()
                chosen = [self._stages[index]]
            else:
                chosen = [self._stages[i] for i in heads.keys]
            candidates.extend(((*key(h, h.priority), 1, -h.order), h) for h in chosen)
        if not candidates:
            return None
        return min(candidates, key=lambda pair: pair[0])[1]

    # ------------------------------------------------------------------ the tree's news

    def stage_added(self, stage: LiveStage) -> None:
        self._stages[stage.index] = stage
        self._order.changed(stage)
        count = self._per_node.get(stage.node, 0)
        self._per_node[stage.node] = count + 1
        if count == 0:
            self.pricing.track(stage.node)
        self._touch(stage)

    def stage_changed(self, stage: LiveStage) -> None:
        self._order.changed(stage)
        self._touch(stage)

    def stage_removed(self, stage: LiveStage) -> None:
        del self._stages[stage.index]
        self._order.changed(stage)
        self._ready.put(stage.index, None)
        self._heads.pop(stage.index, None)
        self._drawn.pop(stage.index, None)
        under = self._under.pop(stage.index, None)
        if under is not None:
            self._unlist(under, stage.index)
        self._sources.drop(stage.index)
        count = self._per_node[stage.node] - 1
        if count:
            self._per_node[stage.node] = count
        else:
            del self._per_node[stage.node]
            self.pricing.untrack(stage.node)

    def _touch(self, stage: LiveStage) -> None:
        """Price `stage` again at the next settle (or, during one, after the stages below it)."""
        if stage.index not in self._dirty:
            self._dirty.add(stage.index)
            if self._heap is not None:  # settling: the stages it is priced after come first in the heap
                heapq.heappush(self._heap, (-stage.order, -stage.start, stage.index))

    # ------------------------------------------------------------------ priorities

    def _price(self, stage: LiveStage) -> None:
        """Price one stage again (the stages below it are priced), and carry what changed to
        the ready queue, the stage before it on its node and the stage it continues from:
        a priority is a maximum over the stages below, so a change goes up only while it
        changes one (a new stage at a node's new branch point prices a few stages, not the
        node's)."""
        self.priced += 1
        below = stage.next.priority if stage.next is not None else 0.0
        heads = self._heads.get(stage.index)
        if heads is not None:
            best = heads.best()
            if best is not None:
                below = max(below, -best[0][0])
        priority = stage.steps * self.pricing.estimate[stage.node] + below
        if priority != stage.priority:
            if stage.parent is None:
                self._order.changed(stage)
            elif stage.parent.node == stage.node:
                self._touch(stage.parent)
            stage.priority = priority
        self._queue_ready(stage, self.plan.nodes[stage.node].depth)
        self._list_under(stage)
        self._sources.note(stage)

    def _queue_ready(self, stage: LiveStage, depth: int) -> None:
        key = None
        if stage.ready:
            key = (
                *self.policy.ready_key(stage, stage.priority, depth),
                -stage.order,
                stage.start,
                stage.index,
            )
        self._ready.put(stage.index, key)

    def _list_under(self, stage: LiveStage) -> None:
        """Keep a child node's first stage listed under the stage it continues from, keyed
        by (-priority, rank, -order): the longest first, the builder's tie order."""
        parent = stage.parent if stage.parent is not None and stage.parent.node != stage.node else None
        old = self._under.get(stage.index)
        if old is not None and old is not parent:
            del self._under[stage.index]
            self._unlist(old, stage.index)
        if parent is None:
            return
        heads = self._heads.get(parent.index)
        if heads is None:
            heads = self._heads[parent.index] = _Ordered()
            self._drawn[parent.index] = _Ordered()
        key = (-stage.priority, stage.rank, -stage.order)
        if heads.keys.get(stage.index) != key:
            heads.set(stage.index, key)
            self._drawn[parent.index].set(stage.index, (-stage.priority, -stage.order))
            self._under[stage.index] = parent
            self._touch(parent)

    def _unlist(self, parent: LiveStage, index: int) -> None:
        heads = self._heads.get(parent.index)
        if heads is not None:
            heads.discard(index)
            self._drawn[parent.index].discard(index)
            if not heads.keys:
                del self._heads[parent.index], self._drawn[parent.index]
            self._touch(parent)


def live_schedule_view(
    planner: IncrementalPlanner | None, plan: SearchPlan, running: Mapping[str, Any], cost: CostModel
) -> ScheduleView:
    """A study's `ScheduleView` (`Study.view(schedule=True)`): read off `planner`'s live stage
    tree, or rebuilt (`dagtune.scheduling.schedule_view`) where the coordinator keeps no
    planner (a policy with a `pick` of its own)."""
    if planner is not None:
        return planner.schedule_view(running)
    return schedule_view(plan, running, cost)
