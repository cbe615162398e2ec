"""Checkpoint garbage collection: which checkpoints a study keeps, as a pure function.

Checkpoints are referenced by the search plan; `collect` decides from the plan, the trials
and the points running or queued stages need which of them to keep (Hippo's checkpoint
cache, thesis §4.2.2):

- *protected*, never deleted: every point a running task starts from or may resume from,
  and the latest checkpoint before every point a pending trial waits for (what its queued
  stage starts from);
- each completed trial's latest checkpoint (`keep_latest`: an algorithm may extend it);
- the latest checkpoints of the best `keep_best` trials by `metric`.

With `budget_bytes`, kept checkpoints that are not protected are evicted cheapest to
recompute first (seconds of training from the previous kept checkpoint on its path, per
byte, as Nectar's cost-benefit rule) until the rest fits. A trial that later needs an
evicted point recomputes it from the latest checkpoint before it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from dagtune.plan import SearchPlan
from dagtune.records import COMPLETED, Trial
from dagtune.scheduling import CostModel

__all__ = ["GcDecision", "GcPolicy", "collect"]

Point = tuple[str, int]


@dataclass(frozen=True)
class GcPolicy:
    """What to keep. `metric`/`mode` rank trials for `keep_best` (default: those of the
    algorithm the study ran last). `interval_seconds` makes collection automatic while a
    study runs (at most that often, and after every `Study.run`); None collects only when
    `Study.gc` is called or a run ends. `orphan_seconds`: checkpoint files no search plan
    references (committed just before a coordinator died, or never committed) are deleted
    once they are that old; None keeps them.

    `Study.gc` applies the policy to the study's own trials; what other studies of the same
    model need (their live leases, their completed trials' latest checkpoints and their
    pending trials' resume points) is always kept. `dagtune gc` applies it to every study."""

    keep_best: int = 3
    metric: str | None = None
    mode: str = "max"
    keep_latest: bool = True
    budget_bytes: int | None = None
    interval_seconds: float | None = 60.0
    orphan_seconds: float | None = 3600.0

    def __post_init__(self) -> None:
        if self.keep_best < 0:
            raise ValueError(f"keep_best must be >= 0, got {self.keep_best!r}")
        if self.mode not in ("max", "min"):
            raise ValueError(f"mode must be 'max' or 'min', got {self.mode!r}")
        if self.orphan_seconds is not None and self.orphan_seconds < 0:
            raise ValueError(f"orphan_seconds must be >= 0, got {self.orphan_seconds!r}")
        if self.budget_bytes is not None and self.budget_bytes < 0:
            raise ValueError(f"budget_bytes must be >= 0, got {self.budget_bytes!r}")


@dataclass
class GcDecision:
    """The outcome of `collect`: points to keep and to delete, and their sizes."""

    keep: set[Point] = field(default_factory=set)
    delete: set[Point] = field(default_factory=set)
    protected: set[Point] = field(default_factory=set)
    bytes_before: int = 0
    bytes_after: int = 0


def collect(
    plan: SearchPlan,
    trials: Iterable[Trial],
    protected: Iterable[Point],
    policy: GcPolicy,
    cost: CostModel | None = None,
    *,
    metric: str | None = None,
    mode: str = "max",
) -> GcDecision:
    """Decide which committed checkpoints of `plan` to keep (see the module docstring).

    `protected` are the points running or queued stages need; `metric`/`mode` are used when
    the policy names no metric.
    """
    cost = cost or CostModel()
    sizes = {(n.id, s): info.nbytes for n in plan.nodes.values() for s, info in n.checkpoints.items()}
    guarded = {p for p in protected if p in sizes}
    keep = set(guarded)
    trials = list(trials)
    if policy.keep_latest:
        for trial in trials:
            if trial.status == COMPLETED and trial.node:
                _add(keep, plan.latest_checkpoint(trial.node, trial.steps))
    metric, mode = policy.metric or metric, policy.mode if policy.metric else mode
    if metric and policy.keep_best:
        sign = 1.0 if mode == "max" else -1.0
        scored = [
            t
            for t in trials
            if t.node and t.metrics and metric in t.metrics and math.isfinite(t.metrics[metric])
        ]
        scored.sort(key=lambda t: (-sign * t.metrics[metric], t.id))
        for trial in scored[: policy.keep_best]:
            if trial.reached > 0:
                _add(keep, plan.latest_checkpoint(trial.node, trial.reached))
    if policy.budget_bytes is not None:
        _evict(plan, keep, guarded, sizes, policy.budget_bytes, cost)
    return GcDecision(
        keep=keep,
        delete=set(sizes) - keep,
        protected=guarded,
        bytes_before=sum(sizes.values()),
        bytes_after=sum(sizes[p] for p in keep),
    )


def _add(keep: set[Point], point: Point | None) -> None:
    if point is not None:
        keep.add(point)


def _evict(
    plan: SearchPlan,
    keep: set[Point],
    guarded: set[Point],
    sizes: dict[Point, int],
    budget: int,
    cost: CostModel,
) -> None:
    """Drop unprotected points from `keep`, cheapest recomputation per byte first, until the
    kept bytes fit in `budget`."""
    total = sum(sizes[p] for p in keep)
    while total > budget:
        candidates = keep - guarded
        if not candidates:
            return
        victim = min(
            candidates,
            key=lambda p: (_recompute_seconds(plan, p, keep, cost) / max(sizes[p], 1), p),
        )
        keep.discard(victim)
        total -= sizes[victim]


def _recompute_seconds(plan: SearchPlan, point: Point, keep: set[Point], cost: CostModel) -> float:
    """Seconds to train up to `point` again from the previous kept checkpoint on its path."""
    node_id, step = point
    seconds = 0.0
    node = plan.nodes[node_id]
    upto = step
    while True:
        earlier = [s for s in node.checkpoints if node.start < s < upto and (node.id, s) in keep]
        if earlier:
            return seconds + (upto - max(earlier)) * cost.step_seconds(node.id, plan)
        seconds += (upto - node.start) * cost.step_seconds(node.id, plan)
        if node.parent is None:
            return seconds
        upto = node.start
        node = plan.nodes[node.parent]
        if (node.id, upto) in keep:
            return seconds
