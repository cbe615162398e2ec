"""Building the stage tree from the search plan (Hippo Alg. 1, generalized).

The stage tree is transient: it is rebuilt from the plan whenever something changes and
lists exactly the training still to do for the active requests. Every needed point is
served from the latest state available before it on its path: a committed checkpoint
(including one exactly at a branch step), a point a running task will still pass (which it
is then asked to checkpoint), or the stage that trains up to it. A stage trains one node's
config over ``[start, end)`` and ends where a request needs metrics or another path branches
off; requests at the root level are served like any other.

When a trial branches off in the middle of a stage that is already running and has not yet
passed the branch step, the tree relies on that task to checkpoint there (no recomputation):
`StageTree.wanted` lists, per running task, every point the tree relies on it to deliver.
"""

from __future__ import annotations

import heapq
import html
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Protocol

from dagtune.plan._plan import SearchPlan

__all__ = ["InFlight", "Stage", "StageTree", "build_stage_tree"]

_METRICS, _STATE = 1, 2


class InFlight(Protocol):
    """What running tasks will still produce; the tree builder asks and they commit to it."""

    def claim(self, node: str, step: int) -> str | None:
        """A running task that will deliver point ``(node, step)`` (state and metrics), or None.
        Claiming may add a checkpoint to the task's way."""

    def latest_before(self, node: str, step: int) -> tuple[int, str] | None:
        """The latest point on `node` before `step` that a running task will still deliver, as
        ``(step, task)``, claimed; or None."""


@dataclass
class Stage:
    """Train `node`'s config over steps ``[start, end)``.

    `source` tells where the state at `start` comes from: ``"scratch"`` (a fresh trainer),
    ``"checkpoint"`` (the committed point `source_point`), ``"stage"`` (the end of stage
    `parent`), or ``"running"`` (a running task, `source_task`, will deliver it).
    """

    index: int
    node: str
    start: int
    end: int
    source: str
    source_point: tuple[str, int] | None = None
    source_task: str | None = None
    parent: int | None = None
    children: list[int] = field(default_factory=list)
    metrics_needed: bool = False
    rank: int = 0

    @property
    def steps(self) -> int:
        return self.end - self.start

    @property
    def ready(self) -> bool:
        """Can start now: its source state exists."""
        return self.source in ("scratch", "checkpoint")


@dataclass
class StageTree:
    """The stages still to run, and what running tasks must deliver for them.

    `wanted` maps a running task (the key `InFlight` answered with) to the points
    ``(node, step)`` the tree relies on it to deliver, state and metrics: requests it serves,
    branch points of stages that start from it (which it must checkpoint on its way), and the
    latest point of its node that a stage continues from. A task not listed is relied on for
    nothing and may stop at its next step boundary.
    """

    stages: list[Stage]
    wanted: dict[str, set[tuple[str, int]]] = field(default_factory=dict)

    @property
    def roots(self) -> list[Stage]:
        return [s for s in self.stages if s.parent is None]

    @property
    def total_steps(self) -> int:
        return sum(s.steps for s in self.stages)

    def ready(self) -> list[Stage]:
        return [s for s in self.stages if s.ready]

    def subtree(self, stage: Stage) -> Iterator[Stage]:
        stack = [stage]
        while stack:
            current = stack.pop()
            yield current
            stack.extend(self.stages[c] for c in current.children)

    def __len__(self) -> int:
        return len(self.stages)

    def _repr_html_(self) -> str:
        """The stages still to run, indented under their parents (how Jupyter shows a tree)."""
        if not self.stages:
            return '<div class="dagtune">empty stage tree: nothing left to train</div>'
        lines = []
        stack = [(root, 0) for root in reversed(self.roots)]
        while stack:
            stage, depth = stack.pop()
            source = stage.source + (
                f" {stage.source_point[0][:8]}@{stage.source_point[1]}" if stage.source_point else ""
            )
            lines.append(
                f"<tr><td style='padding-left:{8 + 16 * depth}px;text-align:left'>{stage.node[:8]}</td>"
                f"<td>{stage.start}–{stage.end}</td><td>{html.escape(source)}</td>"
                f"<td>{'metrics' if stage.metrics_needed else ''}</td></tr>"
            )
            stack.extend((self.stages[c], depth + 1) for c in reversed(stage.children))
        head = "<tr><th>node</th><th>steps</th><th>starts from</th><th>reports</th></tr>"
        return (
            f'<div class="dagtune"><b>Stage tree: {len(self.stages)} stages, '
            f"{self.total_steps} steps to train</b><table>{head}{''.join(lines)}</table></div>"
        )


def build_stage_tree(plan: SearchPlan, in_flight: InFlight | None = None) -> StageTree:
    """The stages that serve every active request of `plan` not served yet."""
    demand: dict[str, dict[int, int]] = {}
    rank: dict[tuple[str, int], int] = {}
    heap: list[int] = []

    def need(node: str, step: int, what: int, order: int) -> None:
        steps = demand.get(node)
        if steps is None:
            steps = demand[node] = {}
            heapq.heappush(heap, -plan.nodes[node].order)
        steps[step] = steps.get(step, 0) | what
        key = (node, step)
        rank[key] = min(rank.get(key, order), order)

    for (node, step), order in plan.request_rank.items():
        if step not in plan.nodes[node].metrics:
            need(node, step, _METRICS, order)

    stages: list[Stage] = []
    ends: dict[tuple[str, int], int] = {}  # point -> stage ending there
    heads: list[tuple[int, str, int]] = []  # (stage, parent node, branch step) to link
    served_by_task: dict[tuple[str, int], str] = {}

    while heap:
        node = plan.nodes[plan.order[-heapq.heappop(heap)]]
        wanted = demand[node.id]
        chains: dict[int, list[int]] = {}
        origins: dict[int, tuple[str, object]] = {}
        for step in sorted(wanted):
            what = wanted[step]
            has_metrics = step in node.metrics
            if step in node.checkpoints and (has_metrics or not what & _METRICS):
                continue
            if what == _METRICS and has_metrics:
                continue
            task = in_flight.claim(node.id, step) if in_flight else None
            if task is not None:
                served_by_task[(node.id, step)] = task
                continue
            source = max((s for s in node.checkpoints if node.start < s < step), default=None)
            origin: tuple[str, object] = ("checkpoint", source)
            running = in_flight.latest_before(node.id, step) if in_flight else None
            if running is not None and (source is None or running[0] > source):
                source, origin = running[0], ("running", running[1])
                served_by_task[(node.id, source)] = running[1]
            if source is None:
                source = node.start
                if node.parent is None:
                    origin = ("scratch", None)
                else:
                    origin = ("parent", None)
                    need(node.parent, node.start, _STATE, rank[(node.id, step)])
            chains.setdefault(source, []).append(step)
            origins[source] = origin
        for source, steps in chains.items():
            kind, ref = origins[source]
            previous: Stage | None = None
            begin = source
            for end in steps:
                stage = Stage(
                    index=len(stages),
                    node=node.id,
                    start=begin,
                    end=end,
                    source="stage" if previous else kind,
                    metrics_needed=bool(wanted[end] & _METRICS),
                    rank=rank[(node.id, end)],
                )
                if previous is not None:
                    stage.parent = previous.index
                    previous.children.append(stage.index)
                elif kind == "checkpoint":
                    stage.source_point = (node.id, source)
                elif kind == "running":
                    stage.source_task = ref
                    stage.source_point = (node.id, source)
                elif kind == "parent":
                    heads.append((stage.index, node.parent, node.start))
                stages.append(stage)
                ends[(node.id, end)] = stage.index
                previous, begin = stage, end

    for index, parent, step in heads:
        stage = stages[index]
        if step in plan.nodes[parent].checkpoints:  # even if a stage retrains it for metrics
            stage.source, stage.source_point = "checkpoint", (parent, step)
        elif (parent, step) in ends:
            upstream = stages[ends[(parent, step)]]
            stage.source, stage.parent = "stage", upstream.index
            upstream.children.append(index)
        elif (parent, step) in served_by_task:
            stage.source, stage.source_task = "running", served_by_task[(parent, step)]
            stage.source_point = (parent, step)
        else:
            stage.source, stage.source_point = "checkpoint", (parent, step)

    _propagate_rank(plan, stages)
    by_task: dict[str, set[tuple[str, int]]] = {}
    for point, task in served_by_task.items():
        by_task.setdefault(task, set()).add(point)
    return StageTree(stages, by_task)


def _propagate_rank(plan: SearchPlan, stages: list[Stage]) -> None:
    """A stage's rank becomes the earliest rank of any request it leads to (FIFO order)."""
    # children sit deeper in the plan, or later on the same node: visit them first
    for stage in sorted(stages, key=lambda s: (-plan.nodes[s.node].depth, -s.start)):
        for child in stage.children:
            stage.rank = min(stage.rank, stages[child].rank)
