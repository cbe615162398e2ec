"""Median stopping (Golovin et al. 2017, Google Vizier): stop what is doing worse than typical.

Every config is submitted at once, to run to `max_steps`, so the search plan sees every
shared prefix before anything runs. Stopping a trial cancels only its own request: a stage
another trial still needs keeps running, so stopping never costs a sharing trial anything.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from typing import Any

from dagtune.algos._base import Algorithm, Context, Decision, Stop, Submit, check_positive
from dagtune.algos._halving import ConfigSource
from dagtune.coordinator import Trial

__all__ = ["MedianStopping"]


class MedianStopping(Algorithm):
    """Stop a trial whose best result so far is worse than the median of the others' running
    averages at the same step.

    At each result of trial ``T`` after ``s`` steps with ``grace <= s < max_steps``, the
    *others* are the trials of this run that have reported at step ``s`` or later (running,
    completed or stopped). If there are at least `min_samples` of them, ``T`` is stopped when
    its best metric over steps ``<= s`` is strictly worse than the median of the others'
    running averages (the mean of each one's metric over its steps ``<= s``). This is the
    rule of Vizier and of Ray Tune's ``MedianStoppingRule``: a trial's best-so-far against
    the others' running averages, so a noisy curve is judged by its best and a typical curve
    by its whole history. A non-finite metric (a diverged trial) counts as the worst value.

    `space` is a `dt.Grid`, a `dt.Random` or any iterable of configs; all of a finite space
    are run, or as many as `budget` (total trial steps it may request) allows at
    `max_steps` each; an endless space needs a `budget`.
    """

    def __init__(
        self,
        space: Iterable[Any],
        metric: str,
        mode: str = "max",
        *,
        max_steps: int,
        grace: int = 1,
        min_samples: int = 3,
        budget: int | None = None,
    ):
        super().__init__(metric, mode)
        owner = type(self).__name__
        check_positive(owner, max_steps=max_steps, grace=grace, min_samples=min_samples, budget=budget)
        if grace > max_steps:
            raise ValueError(f"{owner}: grace={grace} must not exceed max_steps={max_steps}")
        if budget is not None and budget < max_steps:
            raise ValueError(f"{owner}: budget={budget} is less than one trial of max_steps={max_steps}")
        source = ConfigSource(space, owner)
        if budget is None and not source.sized:
            raise ValueError(f"{owner}: an endless search space needs a budget (total trial steps)")
        self.configs = source.take(None if budget is None else budget // max_steps)
        self.max_steps = max_steps
        self.grace = grace
        self.min_samples = min_samples

    def start(self, ctx: Context) -> list[Decision]:
        return [Submit(config, self.max_steps) for config in self.configs]

    def on_result(self, trial: Trial, step: int, metrics: dict[str, float]) -> list[Decision]:
        self.check_metric(metrics)
        if step < self.grace or step >= trial.steps:
            return []
        others = [t for t in self.trials if t is not trial and t.curve and t.curve[-1][0] >= step]
        if len(others) < self.min_samples:
            return []
        median = statistics.median(self.running_average(t, step) for t in others)
        best = max(self._score(m) for s, m in trial.curve if s <= step)
        return [Stop(trial.id)] if best < median else []

    def running_average(self, trial: Trial, step: int) -> float:
        """The mean score (the metric, negated for ``min``) over the trial's steps ``<= step``."""
        return statistics.fmean(self._score(m) for s, m in trial.curve if s <= step)

    def _score(self, metrics: dict[str, float]) -> float:
        score = self.score(metrics)
        return score if math.isfinite(score) else -math.inf
