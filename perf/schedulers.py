"""Prototype scheduling policies, measured on the paper's studies (perf-side only).

dagtune's `CriticalPath` (dagtune/scheduling.py) orders ready stages by their critical-path
priority (estimated seconds of the longest path from the stage down to a leaf), breaks ties
by request order, and hands each worker a whole path: the stage, then its highest-priority
child, and so on down to a leaf. In a grid whose trials all train the same number of steps,
every leaf sits at the same depth, so the priority of a stage is almost exactly its remaining
steps: a stage starting at step 40 outranks every stage starting later, whatever lies
beneath it, and stages starting at the same step tie and fall back to request order. The
variants here change only those two choices, to see what the tie-breaks are worth:

``critical path``            dagtune's policy, unchanged (the reference).
``+ subtree work``           ties (priorities within 1%) broken by the work in the stage's
                             subtree, most first; the path follows the child with the most
                             work beneath it among the near-ties.
``+ subtree work, no path``  the same order, one stage per worker at a time (the next stage
                             of a path is picked again when the stage ends; the coordinator
                             still prefers the worker that holds its trainer in memory).
``work-weighted``            priority max(longest path, subtree work / workers): a stage
                             holding much parallel work beneath it counts as urgent as a
                             long chain, the quantity the precedence lower bound charges.

``python -m perf.paper --schedulers`` runs every variant on the four studies at 40 GPUs.
"""

from __future__ import annotations

from typing import Any

from dagtune.plan import SearchPlan, Stage, StageTree
from dagtune.scheduling import CostModel, CriticalPath, critical_path_priorities

TOLERANCE = 0.01  # priorities within 1% count as tied


def subtree_work(tree: StageTree, cost: CostModel, plan: SearchPlan | None) -> list[float]:
    """Estimated seconds of all the stages at and below each stage."""
    work = [0.0] * len(tree.stages)
    for stage in sorted(tree.stages, key=lambda s: -_depth(tree, s)):
        work[stage.index] = cost.stage_seconds(stage, plan) + sum(work[c] for c in stage.children)
    return work


def _depth(tree: StageTree, stage: Stage) -> int:
    depth = 0
    while stage.parent is not None:
        stage = tree.stages[stage.parent]
        depth += 1
    return depth


def _bucket(value: float, top: float) -> int:
    """Priorities within TOLERANCE of the largest one share a bucket."""
    return round(value / (TOLERANCE * top)) if top > 0 else 0


class SubtreeWorkTies(CriticalPath):
    """Critical path with near-ties broken by subtree work (most first)."""

    name = "critical_path_subtree_work"
    whole_path = True

    def pick(
        self, tree: StageTree, slots: int, cost: CostModel, plan: SearchPlan | None = None
    ) -> list[list[Stage]]:
        if slots <= 0:
            return []
        priority = critical_path_priorities(tree, cost, plan)
        work = subtree_work(tree, cost, plan)
        top = max(priority, default=0.0)

        def key(s: Stage) -> tuple:
            return (-_bucket(priority[s.index], top), -work[s.index], s.rank, s.index)

        ready = sorted(tree.ready(), key=key)
        paths = []
        for stage in ready[:slots]:
            path = [stage]
            while self.whole_path and path[-1].children:
                path.append(min((tree.stages[c] for c in path[-1].children), key=key))
            paths.append(path)
        return paths


class SubtreeWorkStages(SubtreeWorkTies):
    """`SubtreeWorkTies` without path commitment: one stage per worker at a time."""

    name = "critical_path_subtree_work_stages"
    whole_path = False


class WorkWeighted(CriticalPath):
    """Priority max(longest path below, subtree work / workers); whole paths as dagtune."""

    name = "work_weighted"

    def __init__(self, workers: int):
        self.workers = workers

    def pick(
        self, tree: StageTree, slots: int, cost: CostModel, plan: SearchPlan | None = None
    ) -> list[list[Stage]]:
        if slots <= 0:
            return []
        longest = critical_path_priorities(tree, cost, plan)
        work = subtree_work(tree, cost, plan)
        urgency = [max(a, b / self.workers) for a, b in zip(longest, work, strict=True)]
        ready = sorted(tree.ready(), key=lambda s: (-urgency[s.index], s.rank, s.index))
        paths = []
        for stage in ready[:slots]:
            path = [stage]
            while path[-1].children:
                path.append(
                    max(
                        (tree.stages[c] for c in path[-1].children), key=lambda s: (urgency[s.index], -s.rank)
                    )
                )
            paths.append(path)
        return paths


def variants(workers: int) -> dict[str, Any]:
    return {
        "critical path": "critical_path",
        "+ subtree work": SubtreeWorkTies(),
        "+ subtree work, no path": SubtreeWorkStages(),
        "work-weighted": WorkWeighted(workers),
    }
