"""One plan node's part of the live stage tree: its `LiveStage` objects, chained by source, and
what `LiveStageTree` keeps about the node between changes (`NodeState`).

A node's stages form chains: each chain starts from one source (a checkpoint, a running task's
point, the node's start) and ends a stage at each wanted step it serves, in step order. A
step's source only grows with the step (the latest checkpoint or running task's point before
it), so a chain is a run of consecutive chained steps with one source: `NodeState.chained`
lists them sorted, and a step's neighbours on its chain are its neighbours in that list. That
is what lets a change of one wanted step splice one stage in or out (`insert`, `detach`) and
recompute only the ranks it reaches (`rerank`), in O(log w) for w wanted steps plus the
stages changed.
"""

from __future__ import annotations

import heapq
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
    wanted step was decided (what a change of a few steps updates without a rebuild)."""

    __slots__ = (
        "stages",
        "served",
        "asks",
        "links",
        "moved",
        "head",
        "asked",
        "checkpoints",
        "decided",
        "chained",
        "claims",
        "sourced",
    )

    def __init__(self) -> None:
        self.stages: dict[int, LiveStage] = {}
        self.served: dict[int, str] = {}  # step -> task delivering that point
        self.asks: dict[int, MinRank] = {}  # branch step -> children needing its state, by rank
        self.links: dict[int, tuple] = {}  # branch step -> what its children continue from
        self.moved: set[int] | None = None  # steps whose answer to children may have changed
        self.head: LiveStage | None = None  # the stage starting at the node's start from its parent
        self.asked: int | None = None  # the rank this node asks its parent's state with
        self.checkpoints: list[int] | None = None  # sorted checkpoint steps (a cache)
        # wanted step -> ("claim", task) or ("chain", source, origin, task, own rank); a wanted
        # step the node's checkpoints or metrics already serve is not listed
        self.decided: dict[int, tuple] = {}
        self.chained = SortedList()  # the steps decided "chain" (each ends a stage)
        self.claims: dict[int, str] = {}  # step -> the running task claimed for it
        self.sourced: dict[int, list] = {}  # a running source step -> [its task, chained steps from it]

    def idle(self) -> bool:
        return not (self.stages or self.served or self.asks or self.asked is not None)

    # ------------------------------------------------------------------ what the node wants

    def wanted(self, node: Node, ranks: dict[tuple[str, int], int]) -> dict[int, list[int]]:
        """Step -> [what, rank]: the node's needs, as `build_stage_tree` gathers them
        (`ranks`: the plan's request ranks)."""
        wanted: dict[int, list[int]] = {}
        for step in node.requests:
            if step not in node.metrics:
                wanted[step] = [METRICS, ranks[(node.id, step)]]
        for step, asks in self.asks.items():
            rank = asks.least()
            entry = wanted.get(step)
            if entry is None:
                wanted[step] = [STATE, rank]
            else:
                entry[0] |= STATE
                entry[1] = min(entry[1], rank)
        return wanted

    def wanted_at(self, node: Node, ranks: dict[tuple[str, int], int], step: int) -> tuple[int, int] | None:
        """``(what, rank)`` the node wants at `step` (one entry of `wanted`), or None."""
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
        """Make `stage` the first of its chain: from `start`, which `origin` provides."""
        if stage.origin == "head" and origin != "head":
            unlink(stage)
        stage.start = start
        if origin == "head":
            self.head = stage
            if stage.origin != "head":  # linked to the parent node by `LiveStageTree._link_head`
                stage.parent, stage.source = None, ""
        else:
            stage.parent, stage.source = None, origin
            stage.source_task = task if origin == "running" else None
            stage.source_point = (stage.node, start) if origin in ("checkpoint", "running") else None
        stage.origin = origin

    def count_source(self, source: int, origin: str, task: str | None, delta: int) -> None:
        """Count a chained step in or out of those starting from a running task's point."""
        if origin != "running":
            return
        entry = self.sourced.get(source)
        if entry is None:
            self.sourced[source] = [task, delta]
        else:
            entry[1] += delta
            if not entry[1]:
                del self.sourced[source]

    def neighbours(self, step: int) -> tuple[LiveStage | None, LiveStage | None]:
        """The stages before and after chained step `step` on its chain."""
        chained, decided = self.chained, self.decided
        at, source = chained.index(step), decided[step][1]
        before = after = None
        if at > 0 and decided[chained[at - 1]][1] == source:
            before = self.stages[chained[at - 1]]
        if at + 1 < len(chained) and decided[chained[at + 1]][1] == source:
            after = self.stages[chained[at + 1]]
        return before, after

    def detach(self, step: int, touched: dict, ranked: set[int]) -> LiveStage:
        """Take the stage ending at `step` out of its chain (the next one starts where it did);
        `touched` gets the stages' fields before they change, `ranked` the ends whose rank to
        compute again."""
        stage = self.stages.pop(step)
        before, after = self.neighbours(step)
        self.chained.remove(step)
        keep(touched, stage)
        if after is not None:
            keep(touched, after)
            if before is not None:
                follow(after, before)
            else:
                self.begin(after, stage.start, stage.origin, stage.source_task)
        if before is not None:
            keep(touched, before)
            before.next = after
            ranked.add(before.end)
        if self.head is stage:
            self.head = after if after is not None and after.origin == "head" else None
        if stage.origin == "head":
            unlink(stage)
        stage.next = stage.parent = None
        stage.origin = ""
        return stage

    def insert(self, stage: LiveStage, touched: dict, ranked: set[int]) -> None:
        """Put `stage` into the chain of its step `stage.end` (decided "chain" already)."""
        step = stage.end
        self.chained.add(step)
        self.stages[step] = stage
        before, after = self.neighbours(step)
        if before is not None:
            keep(touched, before)
            follow(stage, before)
            before.next = stage
            ranked.add(before.end)
        else:
            _, source, origin, task, _ = self.decided[step]
            self.begin(stage, source, origin, task)
        stage.next = after
        if after is not None:
            keep(touched, after)
            follow(after, stage)
        ranked.add(step)

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
            rank = self.decided[end][4]
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
