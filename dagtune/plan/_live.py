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

Cost of one change. A change of what a node wants at a step (a request, metrics, a child
node beginning to branch there or changing the rank it asks with) decides that step alone
again (`_update`) and splices its stage into or out of its chain: O(log w) for w wanted steps
on the node, plus the stages it changes (its own, the next one's start, the previous one's
link, and the ranks before it while they change). The other steps keep their decisions: what
they were decided on did not change, as for a node not touched at all. So a sibling branching
off a long trial at a new step costs a constant, not the trial's branch points (perf/RESULTS.md
9u). A checkpoint or a running task that comes, goes or moves on a node may change the source
of every stage on it: that node decides all its wanted steps again (`_rebuild`, O(w log c) for
c checkpoints). Either way, ancestors follow as long as what a node asks of its parent changes
(one step of the parent each). Linking a new child stage is O(1); a branch point whose source
changes (checkpoint committed, task launched) relinks the children waiting on it, once per
change of that point. Only the branch points a change may have moved are asked (`NodeState.moved_at`: a
checkpoint, the stage ending there or the task serving it came or went, a first child
branched there), so a node with w branch points costs a change one point, not w.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left
from collections.abc import Iterable
from typing import Protocol

from sortedcontainers import SortedList

from dagtune.plan._chains import METRICS, LiveStage, MinRank, NodeState, follow, keep, unlink
from dagtune.plan._plan import SearchPlan
from dagtune.plan._tree import StageTree

__all__ = ["InFlightPoints", "LiveStageTree", "TreeObserver"]


class TreeObserver(Protocol):
    """Hears how a `LiveStageTree` changed, one stage at a time, during `settle`."""

    def stage_added(self, stage: LiveStage) -> None: ...

    def stage_changed(self, stage: LiveStage) -> None:
        """A field of `stage` that a rebuilt `Stage` shows changed (bounds, source, parent,
        rank, the stage after it)."""

    def stage_removed(self, stage: LiveStage) -> None: ...


class InFlightPoints:
    """The points running tasks will still deliver, as plain facts (segments and progress):
    the `InFlight` answers, without side effects (the coordinator's `RunningTasks` holds the
    tasks themselves and records what the rebuilt tree claims from them).

    A task trains segments ``(node, start, end)`` and has trained up to `progress`; it will
    deliver every point ``(node, t)`` of a segment with ``progress < t <= end``. Tasks are
    asked in launch order, as the coordinator asks its own.
    """

    def __init__(self) -> None:
        self.tasks: dict[str, tuple[tuple[tuple[str, int, int], ...], int]] = {}
        self.on_node: dict[str, dict[str, None]] = {}

    def add(self, key: str, segments: Iterable[tuple[str, int, int]], progress: int) -> None:
        segments = tuple(segments)
        self.tasks[key] = (segments, progress)
        for node, _, _ in segments:
            self.on_node.setdefault(node, {})[key] = None

    def set_progress(self, key: str, progress: int) -> None:
        self.tasks[key] = (self.tasks[key][0], progress)

    def remove(self, key: str) -> None:
        segments, _ = self.tasks.pop(key)
        for node, _, _ in segments:
            keys = self.on_node.get(node)
            if keys is not None:
                keys.pop(key, None)
                if not keys:
                    del self.on_node[node]

    def nodes(self, key: str) -> set[str]:
        return {node for node, _, _ in self.tasks[key][0]}

    def claim(self, node: str, step: int) -> str | None:
        """The first task that will still deliver point ``(node, step)``, or None."""
        for key in self.on_node.get(node, ()):
            segments, progress = self.tasks[key]
            if progress < step and any(n == node and s < step <= e for n, s, e in segments):
                return key
        return None

    def latest_before(self, node: str, step: int) -> tuple[int, str] | None:
        """The latest segment end on `node` before `step` a task will still reach, as
        ``(step, task)`` (the first task in launch order among equals), or None."""
        best: tuple[int, str] | None = None
        for key in self.on_node.get(node, ()):
            segments, progress = self.tasks[key]
            for n, _, end in segments:
                if n == node and progress < end < step and (best is None or end > best[0]):
                    best = (end, key)
        return best


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
        # queued node -> the wanted steps that changed on it, or None: decide them all again
        self._pending: dict[str, set[int] | None] = {}
        self._relied: dict[str, set[tuple[str, int]]] = {}  # task -> points the tree relies on
        self._relied_changed: set[str] = set()  # tasks whose points changed since `take_changed`
        self._next_index = 0
        self.rebuilds = 0  # node rebuilds and updates so far: what the changes cost
        self.walked = 0  # wanted steps decided so far (`_decide`): what they cost
        plan.observers.append(self._plan_changed)
        for node, _ in plan.active:
            self._touch(node)

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
            if state is not None:
                state.checkpoints = None
                state.moved_at(step)
                self._touch(node)

    def launch(self, key: str, segments: Iterable[tuple[str, int, int]], progress: int) -> None:
        """A task started training `segments` ``(node, start, end)``, at step `progress`."""
        self.tasks.add(key, segments, progress)
        for node in self.tasks.nodes(key):
            if node in self._states:
                self._touch(node)

    def advance(self, key: str, progress: int) -> None:
        """Task `key` has trained up to step `progress`: points it passed are no longer its."""
        before = self.tasks.tasks[key][1]
        self.tasks.set_progress(key, progress)
        if progress < before:  # it went back (a restart): it covers more again
            for node in self.tasks.nodes(key):
                if node in self._states:
                    self._touch(node)
            return
        for node, step in self._relied.get(key, ()):
            if step <= progress:
                self._touch(node)

    def finish(self, key: str) -> None:
        """Task `key` ended (or was lost): it delivers nothing more."""
        self.tasks.remove(key)
        for node, _ in self._relied.get(key, ()):
            self._touch(node)

    def _touch(self, node: str, step: int | None = None) -> None:
        """Queue `node` for the next `settle`: what it wants changed at `step` only (a request,
        metrics, a child's ask there), or anything (None: a checkpoint, a running task)."""
        pending = self._pending
        if node not in pending:
            heapq.heappush(self._queue, (-self.plan.nodes[node].order, node))
            pending[node] = None if step is None else {step}
        elif step is None:
            pending[node] = None
        else:
            steps = pending[node]
            if steps is not None:
                steps.add(step)

    # ------------------------------------------------------------------ queries

    def settle(self) -> None:
        """Apply every change since the last call (deepest plan nodes first)."""
        if not self._queue:
            return
        while self._queue:
            _, node = heapq.heappop(self._queue)
            steps = self._pending.pop(node)
            state = self._states.get(node)
            if steps is None or state is None:
                self._rebuild(node)
            else:
                self._update(node, state, steps)
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
        return {task: set(points) for task, points in self._relied.items() if points}

    def wanted_of(self, task: str) -> set[tuple[str, int]]:
        self.settle()
        return set(self._relied.get(task, ()))

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

    def _decide(self, node, state: NodeState, step: int, what: int) -> tuple | None:
        """The builder's decision for one wanted step: None where the node's checkpoints or
        metrics serve it, ``("claim", task)`` where a running task will deliver it, else
        ``("chain", source, origin, task)``: a stage ends there, on the chain from `source`."""
        self.walked += 1
        has_metrics = step in node.metrics
        if step in node.checkpoints and (has_metrics or not what & METRICS):
            return None
        if what == METRICS and has_metrics:
            return None
        task = self.tasks.claim(node.id, step)
        if task is not None:
            return ("claim", task)
        if state.checkpoints is None:
            state.checkpoints = sorted(node.checkpoints)
        checkpoints = state.checkpoints
        at = bisect_left(checkpoints, step)
        source = checkpoints[at - 1] if at and checkpoints[at - 1] > node.start else None
        origin, ref = "checkpoint", None
        running = self.tasks.latest_before(node.id, step)
        if running is not None and (source is None or running[0] > source):
            source, origin, ref = running[0], "running", running[1]
        if source is None:
            source = node.start
            origin = "scratch" if node.parent is None else "head"
        return ("chain", source, origin, ref)

    def _rebuild(self, node_id: str) -> None:
        """Decide every wanted step of the node again (a checkpoint or a running task changed:
        the sources of all its stages may have)."""
        self.rebuilds += 1
        plan = self.plan
        node = plan.nodes[node_id]
        state = self._states.get(node_id)
        if state is None:
            state = self._states[node_id] = NodeState()
        wanted = state.wanted(node, self.plan.request_rank)

        # the builder's loop over one node's wanted steps
        served: dict[int, str] = {}
        chains: dict[int, list] = {}  # source step -> [origin, task, steps]
        decided: dict[int, tuple] = {}
        claims: dict[int, str] = {}
        for step in sorted(wanted):
            what, rank = wanted[step]
            decision = self._decide(node, state, step, what)
            if decision is None:
                continue
            if decision[0] == "claim":
                served[step] = claims[step] = decision[1]
                decided[step] = decision
                continue
            _, source, origin, ref = decision
            decided[step] = (*decision, rank)
            if origin == "running":
                served[source] = ref
            chain = chains.get(source)
            if chain is None:
                chains[source] = [origin, ref, [step]]
            else:
                chain[0], chain[1] = origin, ref
                chain[2].append(step)
        state.decided, state.claims = decided, claims
        state.chained = SortedList(step for _, _, steps in chains.values() for step in steps)
        state.sourced = {
            source: [ref, len(steps)]
            for source, (origin, ref, steps) in chains.items()
            if origin == "running"
        }

        # the stages: one per chained step; rank = least rank from there to the chain's end
        specs: list[tuple] = []  # (end, start, origin, task, metrics, rank, previous end)
        asked = None
        for source, (origin, ref, steps) in chains.items():
            ranks = [wanted[s][1] for s in steps]
            for i in range(len(ranks) - 2, -1, -1):
                ranks[i] = min(ranks[i], ranks[i + 1])
            if origin == "head":
                asked = ranks[0]
            begin, previous = source, None
            for end, rank in zip(steps, ranks):
                kind = origin if previous is None else "chain"
                specs.append((end, begin, kind, ref, bool(wanted[end][0] & METRICS), rank, previous))
                begin, previous = end, end

        old = state.stages
        before = {end: stage.fields() for end, stage in old.items()}
        new: dict[int, LiveStage] = {}
        added: list[LiveStage] = []
        state.head = None
        for end, begin, kind, ref, metrics, rank, previous in specs:
            stage = old.pop(end, None)
            if stage is None:
                stage = LiveStage(self._next_index, node_id, node.order, end)
                self._next_index += 1
                added.append(stage)
            stage.metrics_needed, stage.rank = metrics, rank
            if kind == "chain":
                follow(stage, new[previous])
            else:
                state.begin(stage, begin, kind, ref)
            stage.next = None
            new[end] = stage
        for end, *_, previous in specs:
            if previous is not None:
                new[previous].next = new[end]
        state.stages = new
        removed = list(old.values())
        for stage in removed:
            state.moved_at(stage.end)
            if stage.origin == "head":
                unlink(stage)
        for stage in added:
            state.moved_at(stage.end)

        self._serve(node_id, state, served)
        self._finish(
            node, state, asked, added, [(s, before[e]) for e, s in new.items() if e in before], removed
        )

    def _finish(self, node, state: NodeState, asked, added: list, kept: list[tuple], removed: list) -> None:
        """What a rebuild or an update of `node` ends with: its ask of its parent, its head's
        link, its children's links, and the observer told of the stages that changed
        (`kept`: ``(stage, its fields before)``)."""
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

    # ------------------------------------------------------------------ a few steps of one node

    def _update(self, node_id: str, state: NodeState, steps: set[int]) -> None:
        """Decide again only the wanted steps in `steps` (a request, metrics or a child's ask
        changed there; no checkpoint or running task changed on the node, or it would have
        been rebuilt), and change only the stages that reaches: the stage ending at each step,
        the one after it on its chain (its start), the one before (its link) and, while they
        change, the ranks before it. The other steps keep their decisions: as for a node not
        touched at all, what they were decided on did not change."""
        self.rebuilds += 1
        node = self.plan.nodes[node_id]
        touched: dict[int, tuple] = {}  # stage index -> (stage, its fields before)
        added: list[LiveStage] = []
        detached: list[LiveStage] = []
        ranked: set[int] = set()  # ends whose rank to compute again
        points: set[int] = set()  # steps whose serving task may have changed
        for step in sorted(steps):
            want = state.wanted_at(node, self.plan.request_rank, step)
            decision = None if want is None else self._decide(node, state, step, want[0])
            old = state.decided.get(step)
            reuse = None
            if old is not None:
                points.add(step if old[0] == "claim" else old[1])
                if old[0] == "claim":
                    del state.claims[step]
                else:
                    reuse = state.detach(step, touched, ranked)
                    state.count_source(old[1], old[2], old[3], -1)
                del state.decided[step]
            if decision is not None and decision[0] == "claim":
                state.decided[step] = decision
                state.claims[step] = decision[1]
                points.add(step)
            elif decision is not None:
                _, source, origin, ref = decision
                state.decided[step] = (*decision, want[1])
                state.count_source(source, origin, ref, 1)
                points.add(source)
                stage = reuse
                if stage is None:
                    stage = LiveStage(self._next_index, node_id, node.order, step)
                    self._next_index += 1
                    added.append(stage)
                stage.metrics_needed = bool(want[0] & METRICS)
                state.insert(stage, touched, ranked)
                reuse = None
            if reuse is not None:
                detached.append(reuse)
        state.rerank(ranked, touched)

        if state.head is not None:  # `_finish` links it
            keep(touched, state.head)
        for stage in detached + added:
            state.moved_at(stage.end)
            touched.pop(stage.index, None)
        for step in points:
            task = state.sourced[step][0] if step in state.sourced else state.claims.get(step)
            self._serve_point(node_id, state, step, task)
        asked = state.head.rank if state.head is not None else None
        self._finish(node, state, asked, added, list(touched.values()), detached)

    def _serve_point(self, node_id: str, state: NodeState, step: int, task: str | None) -> None:
        """Record which running task, if any, the node's point `step` relies on."""
        old = state.served.get(step)
        if old == task:
            return
        state.moved_at(step)
        if old is not None:
            del state.served[step]
            self._relied_changed.add(old)
            points = self._relied.get(old)
            if points is not None:
                points.discard((node_id, step))
                if not points:
                    del self._relied[old]
        if task is not None:
            state.served[step] = task
            self._relied_changed.add(task)
            self._relied.setdefault(task, set()).add((node_id, step))

    def _serve(self, node_id: str, state: NodeState, served: dict[int, str]) -> None:
        """Record which running tasks the node's points rely on."""
        if served == state.served:
            return
        for step, task in state.served.items():
            if served.get(step) != task:
                state.moved_at(step)
                self._relied_changed.add(task)
                points = self._relied.get(task)
                if points is not None:
                    points.discard((node_id, step))
                    if not points:
                        del self._relied[task]
        for step, task in served.items():
            if state.served.get(step) != task:
                state.moved_at(step)
                self._relied_changed.add(task)
                self._relied.setdefault(task, set()).add((node_id, step))
        state.served = served

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
        if up is None:  # a parent holding nothing yet: all its wanted steps to decide
            up = self._states[parent] = NodeState()
            self._touch(parent)
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
