"""One plan node's part of the live stage tree: its `LiveStage` objects, chained by source, and
what `LiveStageTree` keeps about the node between changes (`NodeState`).

A node's stages form chains: each chain starts from one source (a checkpoint, a running task's
point, the node's start) and ends a stage at each wanted step it serves, in step order. A
step's source is the latest source point before it (a checkpoint or a segment end a running
task will still reach; the node's start if none), so a chain is a run of consecutive chained
steps with no source point between them: `NodeState.chained` lists the chained steps sorted,
and two neighbours in it are on one chain unless a source point lies between them. No step
records its source, so a source point that comes or goes changes the one pair of neighbours
around it (`LiveStageTree._relink`), not the steps after it; a change of one wanted step
splices one stage in or out the same way, and `rerank` recomputes only the ranks it reaches:
O(log w) for w wanted steps plus the stages changed.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left
from collections.abc import Iterator

from sortedcontainers import SortedList

from dagtune.plan._plan import Node
from dagtune.plan._tree import Stage

__all__ = ["METRICS", "STATE", "LiveStage", "MinRank", "NodeState", "follow", "keep", "unlink"]

METRICS, STATE = 1, 2  # what a node wants at a step: metrics reported there, its state for children


class LiveStage:
    """One stage of a `LiveStageTree`, with the fields of `Stage` and a stable `index`.

    `parent` is the stage it continues from (a `LiveStage`, when `source` is ``"stage"``),
    `next` the stage continuing it on the same node, and `heads` the stages of child nodes that
    continue from its end. `priority` is left to the scheduler that keeps it (the tree never
    reads it). A live stage changes in place as the tree changes; `snapshot` freezes one.
    """

    __slots__ = (
        "index",
        "node",
        "order",
        "start",
        "end",
        "source",
        "source_point",
        "source_task",
        "parent",
        "next",
        "heads",
        "origin",
        "metrics_needed",
        "rank",
        "priority",
    )

    def __init__(self, index: int, node: str, order: int, end: int):
        self.index, self.node, self.order, self.end = index, node, order, end
        self.start = 0
        self.source = ""
        self.source_point: tuple[str, int] | None = None
        self.source_task: str | None = None
        self.parent: LiveStage | None = None
        self.next: LiveStage | None = None
        self.heads: dict[int, LiveStage] | None = None
        self.origin = ""  # scratch, checkpoint, running, chain (after `parent` on this node), head
        self.metrics_needed = False
        self.rank = 0
        self.priority = 0.0

    @property
    def steps(self) -> int:
        return self.end - self.start

    @property
    def ready(self) -> bool:
        """Can start now: its source state exists."""
        return self.source in ("scratch", "checkpoint")

    def children(self) -> Iterator[LiveStage]:
        """The stages continuing from this one's end: the next on its node, then the child
        nodes' stages, latest node first (the builder's order)."""
        if self.next is not None:
            yield self.next
        if self.heads:
            yield from sorted(self.heads.values(), key=lambda s: -s.order)

    def fields(self) -> tuple:
        """What a rebuilt `Stage` would say about this stage (links as stage identities)."""
        parent = self.parent.index if self.parent is not None else None
        following = self.next.index if self.next is not None else None
        return (
            self.start,
            self.source,
            self.source_point,
            self.source_task,
            parent,
            following,
            self.metrics_needed,
            self.rank,
        )

    def snapshot(self) -> Stage:
        """A frozen `Stage` with this stage's stable index (children are not listed)."""
        return Stage(
            index=self.index,
            node=self.node,
            start=self.start,
            end=self.end,
            source=self.source,
            source_point=self.source_point,
            source_task=self.source_task,
            parent=self.parent.index if self.parent is not None else None,
            metrics_needed=self.metrics_needed,
            rank=self.rank,
        )

    def __repr__(self) -> str:
        return f"LiveStage({self.index}, {self.node[:8]}, [{self.start}, {self.end}), {self.source})"


class MinRank:
    """Items with a rank and the least rank among them (a heap with lazy deletion)."""

    __slots__ = ("ranks", "heap")

    def __init__(self) -> None:
        self.ranks: dict[str, int] = {}
        self.heap: list[tuple[int, str]] = []

    def set(self, item: str, rank: int) -> None:
        if self.ranks.get(item) == rank:
            return
        self.ranks[item] = rank
        heapq.heappush(self.heap, (rank, item))
        if len(self.heap) > 2 * len(self.ranks) + 16:
            self.heap = [(r, i) for i, r in self.ranks.items()]
            heapq.heapify(self.heap)

    def discard(self, item: str) -> None:
        self.ranks.pop(item, None)

    def least(self) -> int | None:
        heap, ranks = self.heap, self.ranks
        while heap and ranks.get(heap[0][1]) != heap[0][0]:
            heapq.heappop(heap)
        return heap[0][0] if heap else None


class NodeState:
    """What the tree holds for one plan node: its stages by end step, the points running
    tasks serve on it, what its children ask of it, what it asks of its parent, and how each
    wanted step was decided (chained, claimed, or neither: served by the node's checkpoints
    or metrics), which is what a change of a few steps or source points updates."""

    __slots__ = (
        "stages",
        "served",
        "asks",
        "links",
        "moved",
        "head",
        "asked",
        "checkpoints",
        "chained",
        "own",
        "claims",
    )

    def __init__(self) -> None:
        self.stages: dict[int, LiveStage] = {}
        self.served: dict[int, str] = {}  # step -> task delivering that point
        self.asks: dict[int, MinRank] = {}  # branch step -> children needing its state, by rank
        self.links: dict[int, tuple] = {}  # branch step -> what its children continue from
        self.moved: set[int] | None = None  # steps whose answer to children may have changed
        self.head: LiveStage | None = None  # the stage starting at the node's start from its parent
        self.asked: int | None = None  # the rank this node asks its parent's state with
        self.checkpoints: list[int] | None = None  # sorted checkpoint steps (built when first read)
        self.chained = SortedList()  # the wanted steps a stage ends at
        self.own: dict[int, int] = {}  # chained step -> its own rank (the request's, or the least ask)
        # wanted step -> the running task claimed to deliver it (the first in launch order
        # covering it; `served` may name another: the task a chain starts from wins there)
        self.claims: dict[int, str] = {}

    def idle(self) -> bool:
        return not (self.stages or self.served or self.claims or self.asks or self.asked is not None)

    # ------------------------------------------------------------------ what the node wants

    def wanted_at(self, node: Node, ranks: dict[tuple[str, int], int], step: int) -> tuple[int, int] | None:
        """``(what, rank)`` the node wants at `step`, as `build_stage_tree` gathers it (`ranks`:
        the plan's request ranks; asks: the least rank of the children branching there), or
        None."""
        what, rank = 0, None
        if step in node.requests and step not in node.metrics:
            what, rank = METRICS, ranks[(node.id, step)]
        asks = self.asks.get(step)
        if asks is not None:
            least = asks.least()
            what |= STATE
            rank = least if rank is None else min(rank, least)
        return None if rank is None else (what, rank)

    def moved_at(self, step: int) -> None:
        """Note that the node's answer at `step` (`LiveStageTree._source_at`) may have changed:
        a checkpoint, the stage ending there or the task serving it came or went, or children
        began to branch there."""
        if self.moved is None:
            self.moved = set()
        self.moved.add(step)

    # ------------------------------------------------------------------ chains

    def begin(self, stage: LiveStage, start: int, origin: str, task: str | None) -> None:
        """Make `stage` the first of its chain: from `start`, which `origin` provides (the
        caller sets `head` to the stage of origin "head", if any)."""
        if stage.origin == "head" and origin != "head":
            unlink(stage)
        stage.start = start
        if origin == "head":
            if stage.origin != "head":  # linked to the parent node by `LiveStageTree._link_head`
                stage.parent, stage.source = None, ""
        else:
            stage.parent, stage.source = None, origin
            stage.source_task = task if origin == "running" else None
            stage.source_point = (stage.node, start) if origin in ("checkpoint", "running") else None
        stage.origin = origin

    def sorted_checkpoints(self, node: Node) -> list[int]:
        """The node's checkpoint steps, sorted (kept by `checkpoint_changed` once built)."""
        if self.checkpoints is None:
            self.checkpoints = sorted(node.checkpoints)
        return self.checkpoints

    def checkpoint_changed(self, node: Node, step: int) -> None:
        """A checkpoint at `step` was recorded or dropped: keep the sorted steps in line."""
        checkpoints = self.checkpoints
        if checkpoints is None:
            return
        at = bisect_left(checkpoints, step)
        present = at < len(checkpoints) and checkpoints[at] == step
        if step in node.checkpoints:
            if not present:
                checkpoints.insert(at, step)
        elif present:
            del checkpoints[at]

    def detach(self, stage: LiveStage, touched: dict, serve: set[int]) -> None:
        """Take `stage` out of the node's chains (`LiveStageTree._relink` joins its neighbours);
        `serve` gets the point its chain started from, if a running task's."""
        keep(touched, stage)
        del self.stages[stage.end], self.own[stage.end]
        self.chained.remove(stage.end)
        if stage.origin == "running":
            serve.add(stage.start)
        if stage.origin == "head":
            unlink(stage)
        stage.next = stage.parent = None
        stage.origin = ""

    def server(self, step: int) -> str | None:
        """The running task the node's point `step` relies on, as the builder records it:
        the task a chain starts from there, else the task claimed for the step."""
        at = self.chained.bisect_right(step)
        if at < len(self.chained):
            stage = self.stages[self.chained[at]]
            if stage.origin == "running" and stage.start == step:
                return stage.source_task
        return self.claims.get(step)

    def rerank(self, ranked: set[int], touched: dict) -> None:
        """Ranks again from the stages ending at `ranked`, back along their chains while they
        change (a stage's rank: the least of its own and the next stage's)."""
        heap = [-end for end in ranked]
        heapq.heapify(heap)
        done: set[int] = set()
        while heap:  # latest first: a stage after the next one
            end = -heapq.heappop(heap)
            stage = self.stages.get(end)
            if end in done or stage is None:
                continue
            done.add(end)
            rank = self.own[end]
            if stage.next is not None:
                rank = min(rank, stage.next.rank)
            if rank != stage.rank:
                keep(touched, stage)
                stage.rank = rank
                if stage.origin == "chain":
                    heapq.heappush(heap, -stage.parent.end)


def keep(touched: dict[int, tuple], stage: LiveStage) -> None:
    """Note `stage`'s fields before a change of a few steps changes it (once)."""
    if stage.index not in touched:
        touched[stage.index] = (stage, stage.fields())


def follow(stage: LiveStage, previous: LiveStage) -> None:
    """Make `stage` continue `previous` on its node's chain."""
    if stage.origin == "head":
        unlink(stage)
    stage.start, stage.parent, stage.source = previous.end, previous, "stage"
    stage.source_task = stage.source_point = None
    stage.origin = "chain"


def unlink(head: LiveStage) -> None:
    """Detach a node's first stage from the parent node's stage it continued from."""
    old = head.parent
    if old is None or old.node == head.node:
        return
    head.parent = None
    del old.heads[head.index]
    if not old.heads:
        old.heads = None
