"""The stage tree kept up to date as the plan and the running tasks change.

`build_stage_tree` rebuilds the whole tree from the plan; a coordinator that calls it at every
scheduling round pays trials x events. `LiveStageTree` holds the same tree and updates only
what a change can reach: the node it happened on, then its ancestors as long as what a node
asks of its parent (the state at its branch step, and the earliest request rank behind it)
changes. It follows the plan through `SearchPlan.observers` (requests, metrics, checkpoints,
whoever makes them) and the running tasks through `launch`, `advance` and `finish`, the same
facts the `InFlight` protocol answers for the rebuild.

The tree it holds equals the rebuilt one, stage for stage: the builder's decisions are local
to a plan node given what its children ask of it (see `build_stage_tree`), so the same code
runs per node. Two facts make the rest local too:

- a stage's rank after the builder's propagation is the least request rank from its end to
  the end of its chain on the same node (a child node's chain adds nothing: its rank already
  entered the need at the branch point); so ranks never propagate across nodes beyond the
  contribution a child makes to its parent's need;
- the builder numbers stages by plan node, latest first, then by start; ``(-order, start)``
  sorts live stages the same way, so `tree` renumbers them exactly as a rebuild would.

Changes are applied lazily: `settle` (called by every query) handles the nodes touched since
the last one, deepest first, so a burst of submissions or events costs one pass. A
`TreeObserver` hears which stages were added, changed, linked or removed, which is how the
scheduler keeps priorities and its ready queue without walking the tree.

Cost of one change. Every change decides again only the wanted steps whose decision can change
and relinks the chains around the source points it moved (`_update`): a request, metrics or a
child's ask at a step decides that step; a checkpoint committed or dropped decides its step and
relinks the chain after it (a source point came or went there); a task's launch decides the
chained steps it claims, its advance or end the steps it claimed or was relied on for, and
either relinks the chains after its segment ends. A step records whether it is served, claimed
or chained, not its source: a chain is a run of chained steps with no source point between
them, so a point that comes or goes relinks one pair of neighbours, not the steps after it.
O(log w) per step or point for w wanted steps on the node, plus the stages changed (a stage
spliced in or out, the next one's start, the previous one's link, and the ranks before it while
they change). So a sibling branching off a long trial at a new step costs a constant, and so do
a checkpoint and a task event on a long trial with thousands of branch points (perf/RESULTS.md
9u), unless the task claims or releases many steps at once (each a stage that comes or goes).
No node decides all its steps again: a node without state wants nothing unserved, so a new
state decides the steps queued. Ancestors follow as long as what a node asks of its parent
changes (one step of the parent each). Linking a new child stage is O(1); a branch point whose
source changes (checkpoint committed, task launched) relinks the children waiting on it, once
per change of that point. Only the branch points a change may have moved are asked
(`NodeState.moved_at`: a checkpoint, the stage ending there or the task serving it came or went,
a first child branched there), so a node with w branch points costs a change one point, not w.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, bisect_right, insort
from collections.abc import Iterable, Iterator
from typing import Protocol

from sortedcontainers import SortedList

from dagtune.plan._chains import METRICS, LiveStage, MinRank, NodeState, follow, keep, unlink
from dagtune.plan._plan import Node, SearchPlan
from dagtune.plan._tree import StageTree

__all__ = ["InFlightPoints", "LiveStageTree", "TreeObserver"]


class TreeObserver(Protocol):
    """Hears how a `LiveStageTree` changed, one stage at a time, during `settle`."""

    def stage_added(self, stage: LiveStage) -> None: ...

    def stage_changed(self, stage: LiveStage) -> None:
        """A field of `stage` that a rebuilt `Stage` shows changed (bounds, source, parent,
        rank, the stage after it)."""

    def stage_removed(self, stage: LiveStage) -> None: ...


class _Covered:
    """What one task trains on one node: the union of its segments ``(start, end]`` as
    disjoint sorted intervals (what it can claim) and its segments' ends, sorted (where chains
    can start from it)."""

    __slots__ = ("starts", "stops", "ends")

    def __init__(self, spans: list[tuple[int, int]]) -> None:
        if len(spans) == 1:  # most tasks: one segment on a node
            start, end = spans[0]
            self.starts, self.stops, self.ends = [start], [end], [end]
            return
        self.starts: list[int] = []
        self.stops: list[int] = []
        for start, end in sorted(spans):
            if self.stops and start <= self.stops[-1]:
                self.stops[-1] = max(self.stops[-1], end)
            else:
                self.starts.append(start)
                self.stops.append(end)
        self.ends = sorted({end for _, end in spans})

    def covers(self, step: int) -> bool:
        at = bisect_left(self.starts, step) - 1  # the last interval starting before `step`
        return at >= 0 and step <= self.stops[at]

    def ranges(self, above: int) -> Iterator[tuple[int, int]]:
        """The covered steps above `above`, as inclusive ``(first, last)`` ranges."""
        for start, stop in zip(self.starts, self.stops, strict=True):
            if stop > above:
                yield max(start, above) + 1, stop

    def ends_in(self, low: int, high: int) -> list[int]:
        """The segment ends in ``(low, high]``."""
        return self.ends[bisect_right(self.ends, low) : bisect_right(self.ends, high)]


class InFlightPoints:
    """The points running tasks will still deliver, as plain facts (segments and progress):
    the `InFlight` answers, without side effects (the coordinator's `RunningTasks` holds the
    tasks themselves and records what the rebuilt tree claims from them).

    A task trains segments ``(node, start, end)`` and has trained up to `progress`; it will
    deliver every point ``(node, t)`` of a segment with ``progress < t <= end``. Tasks are
    asked in launch order, as the coordinator asks its own. Each node keeps its tasks'
    segments merged (`_Covered`) and the ends still ahead of them sorted, so `claim` costs
    O(tasks on the node x log segments) and `latest_before` O(log ends), not the segments of
    a path of thousands of stages.
    """

    def __init__(self) -> None:
        self.tasks: dict[str, tuple[tuple[tuple[str, int, int], ...], int]] = {}
        self.on_node: dict[str, dict[str, _Covered]] = {}  # node -> its tasks in launch order
        self._ahead: dict[str, list] = {}  # node -> (end, launch, task) with progress < end, sorted
        self._launch: dict[str, int] = {}
        self._nodes: dict[str, tuple[str, ...]] = {}  # task -> its nodes
        self._launched = 0

    def add(self, key: str, segments: Iterable[tuple[str, int, int]], progress: int) -> None:
        segments = tuple(segments)
        self.tasks[key] = (segments, progress)
        self._launch[key] = self._launched
        self._launched += 1
        spans: dict[str, list[tuple[int, int]]] = {}
        for node, start, end in segments:
            spans.setdefault(node, []).append((start, end))
        self._nodes[key] = tuple(spans)
        for node, parts in spans.items():
            covered = self.on_node.setdefault(node, {})[key] = _Covered(parts)
            self._move(node, key, covered.ends_in(progress, covered.ends[-1]), add=True)

    def set_progress(self, key: str, progress: int) -> None:
        segments, before = self.tasks[key]
        self.tasks[key] = (segments, progress)
        low, high = (before, progress) if before < progress else (progress, before)
        for node in self._nodes[key]:
            ends = self.on_node[node][key].ends_in(low, high)
            if ends:
                self._move(node, key, ends, add=progress < before)

    def remove(self, key: str) -> None:
        _, progress = self.tasks.pop(key)
        for node in self._nodes.pop(key):
            keys = self.on_node[node]
            covered = keys.pop(key)
            self._move(node, key, covered.ends_in(progress, covered.ends[-1]), add=False)
            if not keys:
                del self.on_node[node]
        del self._launch[key]

    def _move(self, node: str, key: str, ends: list[int], add: bool) -> None:
        """Put `ends` of task `key` on `node` among those still ahead, or take them out (a
        sorted list: a bisection and a move of the entries after it, few but on a long path)."""
        if not ends:
            return
        ahead = self._ahead.get(node)
        if ahead is None:
            ahead = self._ahead[node] = []
        launch = self._launch[key]
        for end in ends:
            if add:
                insort(ahead, (end, launch, key))
            else:
                del ahead[bisect_left(ahead, (end, launch, key))]
        if not ahead:
            del self._ahead[node]

    def nodes(self, key: str) -> Iterable[str]:
        """The nodes task `key` trains, once each (kept: a long path has a segment per stage)."""
        return self._nodes[key]

    def covered(self, node: str, key: str) -> _Covered:
        """What task `key` trains on `node`."""
        return self.on_node[node][key]

    def claim(self, node: str, step: int) -> str | None:
        """The first task that will still deliver point ``(node, step)``, or None."""
        for key, covered in self.on_node.get(node, {}).items():
            if self.tasks[key][1] < step and covered.covers(step):
                return key
        return None

    def latest_before(self, node: str, step: int) -> tuple[int, str] | None:
        """The latest segment end on `node` before `step` a task will still reach, as
        ``(step, task)`` (the first task in launch order among equals), or None."""
        ahead = self._ahead.get(node)
        if ahead is None:
            return None
        at = bisect_left(ahead, (step,))
        if not at:
            return None
        end = ahead[at - 1][0]
        return end, ahead[bisect_left(ahead, (end,))][2]

    def ahead_in(self, node: str, low: int, high: int) -> bool:
        """Whether a task will still reach a segment end on `node` in ``[low, high)``."""
        ahead = self._ahead.get(node)
        if ahead is None:
            return False
        at = bisect_left(ahead, (low,))
        return at < len(ahead) and ahead[at][0] < high


class LiveStageTree:
    """The stage tree of `plan`'s active requests, updated in place (see the module docstring).

    ``build_stage_tree(plan, in_flight)`` with an `InFlight` answering like `tasks` gives the
    same tree as `tree`. The tree subscribes to `plan.observers`; call `close` to stop.
    """

    def __init__(self, plan: SearchPlan, observer: TreeObserver | None = None):
        self.plan = plan
        self.observer = observer
        self.tasks = InFlightPoints()
        self._states: dict[str, NodeState] = {}
        self._queue: list[tuple[int, str]] = []
        # queued node -> (wanted steps to decide again, source points that came, went or changed)
        self._pending: dict[str, tuple[set[int], set[int]]] = {}
        self._relied: dict[str, list] = {}  # task -> (step, node) the tree relies on it for, sorted
        self._claimed: dict[str, list] = {}  # task -> (step, node) claimed for it, sorted
        self._relied_changed: set[str] = set()  # tasks whose points changed since `take_changed`
        self._next_index = 0
        self.rebuilds = 0  # node updates so far: what the changes cost
        self.walked = 0  # wanted steps decided so far (`_decide`): what the changes cost
        self.placed = 0  # stages linked again to the one before them (`_relink`)
        plan.observers.append(self._plan_changed)
        for node, step in plan.active:
            self._touch(node, step)

    def close(self) -> None:
        """Stop following the plan."""
        if self._plan_changed in self.plan.observers:
            self.plan.observers.remove(self._plan_changed)

    # ------------------------------------------------------------------ inputs

    def _plan_changed(self, kind: str, node: str, step: int | None) -> None:
        if kind == "request":
            self._touch(node, step)
        elif kind == "metrics":
            state = self._states.get(node)
            if state is not None and (step in state.asks or step in self.plan.nodes[node].requests):
                self._touch(node, step)
        elif kind == "checkpoint":
            state = self._states.get(node)
            if state is not None:  # a node without state wants nothing a checkpoint can change
                state.checkpoint_changed(self.plan.nodes[node], step)
                state.moved_at(step)
                self._touch(node, step, step)

    def launch(self, key: str, segments: Iterable[tuple[str, int, int]], progress: int) -> None:
        """A task started training `segments` ``(node, start, end)``, at step `progress`.

        It claims the chained steps it covers (the last launched, it takes no other task's
        claim) and its segment ends may start chains: those steps and points, nothing else."""
        self.tasks.add(key, segments, progress)
        for node in self.tasks.nodes(key):
            state = self._states.get(node)
            if state is not None:
                self._cover(node, state, key, progress, None, state.chained)

    def advance(self, key: str, progress: int) -> None:
        """Task `key` has trained up to step `progress`: points it passed are no longer its."""
        before = self.tasks.tasks[key][1]
        self.tasks.set_progress(key, progress)
        if progress < before:  # it went back (a restart): it covers more again, ahead of later tasks
            for node in self.tasks.nodes(key):
                state = self._states.get(node)
                if state is not None:
                    self._cover(node, state, key, progress, before, state.chained)
                    for other in self.tasks.on_node[node]:  # their claims it may take back
                        self._cover(node, state, key, progress, before, self._claimed.get(other, ()))
            return
        for points in (self._relied.get(key), self._claimed.get(key)):
            for step, node in points or ():  # by step: those it passed come first
                if step > progress:
                    break
                self._touch(node, step, step)

    def finish(self, key: str) -> None:
        """Task `key` ended (or was lost): it delivers nothing more."""
        self.tasks.remove(key)
        for points in (self._relied.get(key), self._claimed.get(key)):
            for step, node in points or ():
                self._touch(node, step, step)

    def _cover(self, node: str, state: NodeState, key: str, low: int, high: int | None, steps) -> None:
        """Queue the steps that task `key` covers on `node` above `low` (and up to `high`)
        among `steps` (the node's chained steps, or another task's claimed ``(step, node)``),
        and its segment ends there (points chains may start from)."""
        covered = self.tasks.covered(node, key)
        top = covered.ends[-1] if high is None else high
        for step in covered.ends_in(low, top):
            self._touch(node, None, step)
        if not steps:
            return
        for first, last in covered.ranges(low):
            last = min(last, top)
            if isinstance(steps, SortedList):
                for step in steps.irange(first, last):
                    self._touch(node, step)
                continue
            for step, where in steps[bisect_left(steps, (first,)) : bisect_left(steps, (last + 1,))]:
                if where == node:
                    self._touch(node, step)

    def _touch(self, node: str, step: int | None, point: int | None = None) -> None:
        """Queue `node` for the next `settle`: what it wants, or how it decides, changed at
        `step` (a request, metrics, a child's ask, a checkpoint, a task's claim), and a source
        point came, went or changed at `point` (a checkpoint, a running task's segment end)."""
        pending = self._pending.get(node)
        if pending is None:
            heapq.heappush(self._queue, (-self.plan.nodes[node].order, node))
            pending = self._pending[node] = (set(), set())
        if step is not None:
            pending[0].add(step)
        if point is not None:
            pending[1].add(point)

    # ------------------------------------------------------------------ queries

    def settle(self) -> None:
        """Apply every change since the last call (deepest plan nodes first)."""
        if not self._queue:
            return
        while self._queue:
            _, node = heapq.heappop(self._queue)
            steps, points = self._pending.pop(node)
            state = self._states.get(node)
            if state is None:  # all it wanted was served: only the steps changed can be wanted
                state = self._states[node] = NodeState()
            self._update(node, state, steps, points)
        self._pending = {}  # a drained dict keeps its table (a burst of trials: one per node)

    def stages_of(self, node: str) -> list[LiveStage]:
        """The stages of plan node `node`, by start."""
        self.settle()
        state = self._states.get(node)
        return [] if state is None else sorted(state.stages.values(), key=lambda s: s.start)

    @property
    def wanted(self) -> dict[str, set[tuple[str, int]]]:
        """Running task -> the points the tree relies on it to deliver (`StageTree.wanted`)."""
        self.settle()
        return {task: {(node, step) for step, node in points} for task, points in self._relied.items()}

    def wanted_of(self, task: str) -> set[tuple[str, int]]:
        self.settle()
        return {(node, step) for step, node in self._relied.get(task, ())}

    def take_changed(self) -> set[str]:
        """The running tasks whose `wanted_of` changed since the last call (a coordinator
        redirects those, not every running task)."""
        self.settle()
        changed, self._relied_changed = self._relied_changed, set()
        return changed

    def tree(self) -> StageTree:
        """The tree as a `StageTree`, numbered as `build_stage_tree` numbers it."""
        self.settle()
        live = sorted(
            (s for state in self._states.values() for s in state.stages.values()),
            key=lambda s: (-s.order, s.start),
        )
        number = {s.index: i for i, s in enumerate(live)}
        stages = []
        for i, s in enumerate(live):
            stage = s.snapshot()
            stage.index = i
            stage.parent = number[s.parent.index] if s.parent is not None else None
            stage.children = [number[c.index] for c in s.children()]
            stages.append(stage)
        return StageTree(stages, self.wanted)

    # ------------------------------------------------------------------ one node

    def _decide(self, node, step: int, what: int) -> str | None:
        """The builder's decision for one wanted step: None where the node's checkpoints or
        metrics serve it, the running task that will deliver it, else "" (a stage ends there,
        on the chain of the latest source point before it: `_relink` places it)."""
        self.walked += 1
        has_metrics = step in node.metrics
        if step in node.checkpoints and (has_metrics or not what & METRICS):
            return None
        if what == METRICS and has_metrics:
            return None
        task = self.tasks.claim(node.id, step)
        return "" if task is None else task

    def _update(self, node_id: str, state: NodeState, steps: set[int], points: set[int]) -> None:
        """Decide again the wanted steps in `steps` and place again the chains around them
        and around the source points in `points`, changing only the stages that reaches.

        A step's decision (served, claimed, chained) depends on what the node wants there,
        its checkpoint and metrics there and the tasks covering it; where a chained step's
        stage starts depends on the source points before it. So a request, metrics or a
        child's ask at a step decides that step; a checkpoint decides its step and places
        the chain after it; a task's launch, advance or end decides the steps it claims or
        claimed and places the chains after its segment ends. Every other step keeps its
        decision and its stage: what they depend on did not change. Splicing is local: a
        stage added or removed, or a source point changed, relinks one pair of neighbours in
        `NodeState.chained` (`_relink`), then ranks are recomputed back along the chains
        while they change (`NodeState.rerank`): O(log w) per step or point for w wanted
        steps, plus the stages changed. Nothing decides every step of a node again: an
        absent `NodeState` means every step the node wants is served (its state is dropped
        only then), so a new one decides the steps queued."""
        self.rebuilds += 1
        node = self.plan.nodes[node_id]
        touched: dict[int, tuple] = {}  # stage index -> (stage, its fields before)
        added: list[LiveStage] = []
        detached: list[LiveStage] = []
        ranked: set[int] = set()  # ends whose rank to compute again
        places: set[int] = {point + 1 for point in points}  # relink the first chained step from each
        serve: set[int] = set()  # steps whose serving task may have changed
        for step in steps:
            want = state.wanted_at(node, self.plan.request_rank, step)
            decision = None if want is None else self._decide(node, step, want[0])
            claimed = state.claims.get(step)
            if claimed is not None and claimed != decision:
                del state.claims[step]
                _unnote(self._claimed, claimed, node_id, step)
                serve.add(step)
            if decision and claimed != decision:
                state.claims[step] = decision
                _note(self._claimed, decision, node_id, step)
                serve.add(step)
            stage = state.stages.get(step)
            if stage is not None and decision != "":
                state.detach(stage, touched, serve)
                detached.append(stage)
                places.add(step)
            elif decision == "":
                if stage is None:
                    stage = state.stages[step] = LiveStage(self._next_index, node_id, node.order, step)
                    self._next_index += 1
                    state.chained.add(step)
                    added.append(stage)
                    places.update((step, step + 1))
                else:
                    keep(touched, stage)
                stage.metrics_needed = bool(want[0] & METRICS)
                state.own[step] = want[1]
                ranked.add(step)
        for place in places:
            self._relink(node, state, place, touched, ranked, serve)
        first = state.stages[state.chained[0]] if state.chained else None
        state.head = first if first is not None and first.origin == "head" else None
        state.rerank(ranked, touched)

        if state.head is not None:  # `_finish` links it
            keep(touched, state.head)
        for stage in detached + added:
            state.moved_at(stage.end)
            touched.pop(stage.index, None)
        for step in serve:
            self._serve_point(node_id, state, step, state.server(step))
        asked = state.head.rank if state.head is not None else None
        self._finish(node, state, asked, added, list(touched.values()), detached)

    def _relink(
        self, node, state: NodeState, place: int, touched: dict, ranked: set[int], serve: set[int]
    ) -> None:
        """Link the first chained step from `place` to the one before it: follow it on one
        chain, or start a chain of its own from the latest source point before it."""
        chained, stages = state.chained, state.stages
        at = chained.bisect_left(place)
        before = stages[chained[at - 1]] if at else None
        if at == len(chained):
            if before is not None and before.next is not None:
                keep(touched, before)
                before.next = None
                ranked.add(before.end)
            return
        stage = stages[chained[at]]
        self.placed += 1
        keep(touched, stage)
        if stage.origin == "running":
            serve.add(stage.start)
        if before is not None and _one_chain(self.tasks, node, state, before.end, stage.end):
            follow(stage, before)
            link = stage
        else:
            state.begin(stage, *_source(self.tasks, node, state, stage.end))
            if stage.origin == "running":
                serve.add(stage.start)
            link = None
        if before is not None and before.next is not link:
            keep(touched, before)
            before.next = link
            ranked.add(before.end)

    def _finish(self, node, state: NodeState, asked, added: list, kept: list[tuple], removed: list) -> None:
        """What an update of `node` ends with: its ask of its parent, its head's link, its
        children's links, and the observer told of the stages that changed (`kept`:
        ``(stage, its fields before)``)."""
        self._ask_parent(node, state, asked)
        if state.head is not None:
            self._link_head(node, state.head)
        self._relink_children(node, state)

        observer = self.observer
        if observer is not None:
            for stage in added:
                observer.stage_added(stage)
            for stage, before in kept:
                if before != stage.fields():
                    observer.stage_changed(stage)
            for stage in removed:
                observer.stage_removed(stage)
        if state.idle():
            del self._states[node.id]

    def _serve_point(self, node_id: str, state: NodeState, step: int, task: str | None) -> None:
        """Record which running task, if any, the node's point `step` relies on."""
        old = state.served.get(step)
        if old == task:
            return
        state.moved_at(step)
        if old is not None:
            del state.served[step]
            self._relied_changed.add(old)
            _unnote(self._relied, old, node_id, step)
        if task is not None:
            state.served[step] = task
            self._relied_changed.add(task)
            _note(self._relied, task, node_id, step)

    def _ask_parent(self, node, state: NodeState, asked: int | None) -> None:
        """Tell the parent whether this node needs its state at the branch step, and with
        which rank; the parent is rebuilt if that changes its need there."""
        if asked == state.asked:
            return
        state.asked = asked
        parent = node.parent
        if parent is None:
            return
        up = self._states.get(parent)
        if up is None:  # a parent holding nothing: all else it wants is served
            if asked is None:
                return
            up = self._states[parent] = NodeState()
        asks = up.asks.get(node.start)
        before = asks.least() if asks is not None else None
        if asked is None:
            if asks is not None:
                asks.discard(node.id)
                if not asks.ranks:
                    del up.asks[node.start]
                    up.links.pop(node.start, None)
        else:
            if asks is None:
                asks = up.asks[node.start] = MinRank()
                up.moved_at(node.start)  # a new branch point: its answer is still to link
            asks.set(node.id, asked)
        after = asks.least() if asks is not None and asks.ranks else None
        if after != before:
            self._touch(parent, node.start)

    # ------------------------------------------------------------------ links between nodes

    def _source_at(self, parent: str, step: int) -> tuple:
        """Where a child branching at ``(parent, step)`` continues from (the builder's rule:
        a checkpoint there, else the stage ending there, else the task delivering it)."""
        if step in self.plan.nodes[parent].checkpoints:
            return ("checkpoint", None)
        state = self._states.get(parent)
        if state is not None:
            stage = state.stages.get(step)
            if stage is not None:
                return ("stage", stage)
            task = state.served.get(step)
            if task is not None:
                return ("running", task)
        return ("checkpoint", None)

    def _link_head(self, node, head: LiveStage) -> None:
        """Link this node's first stage to what its parent offers at the branch step: the
        parent's last settled answer there (its next rebuild relinks every child if that
        changes), or the answer now if the parent has not settled one yet."""
        state = self._states.get(node.parent)
        link = state.links.get(node.start) if state is not None else None
        self._link(node, head, link if link is not None else self._source_at(node.parent, node.start))

    def _relink_children(self, node, state: NodeState) -> None:
        """Children branching where this node's answer changed follow the change.

        Only the branch points noted by `NodeState.moved_at` since the last call are asked again (what a
        change can reach), not every point children branch at: a node with many children at
        distinct steps costs each new child one point, not all of them. `links` needs no
        sweep: `_ask_parent` drops a point's link with its last child."""
        moved, state.moved = state.moved, None
        if not moved:
            return
        for step in sorted(moved):  # as they were linked: by step
            asks = state.asks.get(step)
            if asks is None:
                continue
            link = self._source_at(node.id, step)
            if state.links.get(step) == link:
                continue
            state.links[step] = link
            for child in asks.ranks:
                head = self._states[child].head
                if head is None:
                    continue
                before = head.fields()
                self._link(self.plan.nodes[child], head, link)
                if self.observer is not None and head.fields() != before:
                    self.observer.stage_changed(head)

    def _link(self, node, head: LiveStage, link: tuple) -> None:
        kind, ref = link
        if kind == "stage":
            if head.parent is not ref:
                unlink(head)
                if ref.heads is None:
                    ref.heads = {}
                ref.heads[head.index] = head
                head.parent = ref
            head.source, head.source_point, head.source_task = "stage", None, None
        else:
            unlink(head)
            head.source, head.source_point = kind, (node.parent, node.start)
            head.source_task = ref if kind == "running" else None


def _source(tasks: InFlightPoints, node: Node, state: NodeState, step: int) -> tuple[int, str, str | None]:
    """Where a chain whose first stage ends at `step` starts: ``(step, origin, task)`` of the
    latest source point before it (a checkpoint after the node's start, else a running task's
    segment end), or the node's start."""
    checkpoints = state.sorted_checkpoints(node)
    at = bisect_left(checkpoints, step)
    source = checkpoints[at - 1] if at and checkpoints[at - 1] > node.start else None
    origin, ref = "checkpoint", None
    running = tasks.latest_before(node.id, step)
    if running is not None and (source is None or running[0] > source):
        source, origin, ref = running[0], "running", running[1]
    if source is None:
        source = node.start
        origin = "scratch" if node.parent is None else "head"
    return source, origin, ref


def _one_chain(tasks: InFlightPoints, node: Node, state: NodeState, before: int, step: int) -> bool:
    """Whether chained steps `before` < `step` are on one chain: no source point in
    ``[before, step)`` (chained steps lie after the node's start)."""
    checkpoints = state.sorted_checkpoints(node)
    at = bisect_left(checkpoints, before)
    if at < len(checkpoints) and checkpoints[at] < step:
        return False
    return not tasks.ahead_in(node.id, before, step)


def _note(index: dict[str, list], task: str, node: str, step: int) -> None:
    """Add point ``(node, step)`` to `task`'s in `index` (a sorted list: most tasks have one or
    two; a long path's points go in step order, at the end)."""
    points = index.get(task)
    if points is None:
        index[task] = [(step, node)]
    else:
        insort(points, (step, node))


def _unnote(index: dict[str, list], task: str, node: str, step: int) -> None:
    """Take point ``(node, step)`` out of `task`'s in `index`."""
    points = index.get(task)
    if points is not None:
        at = bisect_left(points, (step, node))
        if at < len(points) and points[at] == (step, node):
            del points[at]
            if not points:
                del index[task]
