"""Median stopping (Golovin et al. 2017, Google Vizier): stop what is doing worse than the
trials that completed did at the same step.

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
from dagtune.records import COMPLETED, Trial

__all__ = ["MedianStopping"]


class MedianStopping(Algorithm):
    """Vizier's median stopping rule (Golovin et al. 2017, "Median Stopping Rule").

    Trial ``T`` is stopped at step ``s`` if its best objective value by step ``s`` is strictly
    worse than the median of the running averages, up to step ``s``, of the objectives of the
    *completed* trials. A completed trial is one that reached `max_steps` (stopped, diverged
    and failed trials are not); its running average at ``s`` is the mean of its metric over
    its steps ``<= s``. The rule is checked at each result of ``T`` after ``s`` steps with
    ``grace <= s < max_steps``, once at least `min_samples` trials have completed (Vizier
    needs one; a few make the median meaningful). So no trial is stopped before the first
    ones finish: with all configs started at once, the critical-path scheduler finishes some
    early, and the later ones are judged against them.

    ``median_of="reported"`` is the variant of Ray Tune's ``MedianStoppingRule`` instead: the
    median is taken over every *other* trial that has reported at step ``s`` or later
    (running, completed or stopped), so stopping starts before anything completes.

    `space` is a `dt.Grid`, a `dt.Random` or any iterable of configs; all of a finite space
    are run, or as many as `budget` (total trial steps it may request) allows at
    `max_steps` each; an endless space needs a `budget`. Every config is submitted at once,
    so the search plan sees every shared prefix before anything runs.
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
        median_of: str = "completed",
    ):
        super().__init__(metric, mode)
        owner = type(self).__name__
        check_positive(owner, max_steps=max_steps, grace=grace, min_samples=min_samples, budget=budget)
        if grace > max_steps:
            raise ValueError(f"{owner}: grace={grace} must not exceed max_steps={max_steps}")
        if budget is not None and budget < max_steps:
            raise ValueError(f"{owner}: budget={budget} is less than one trial of max_steps={max_steps}")
        if median_of not in ("completed", "reported"):
            raise ValueError(f"{owner}.median_of must be 'completed' or 'reported', got {median_of!r}")
        source = ConfigSource(space, owner)
        if budget is None and not source.sized:
            raise ValueError(f"{owner}: an endless search space needs a budget (total trial steps)")
        self.configs = source.take(None if budget is None else budget // max_steps)
        self.max_steps = max_steps
        self.grace = grace
        self.min_samples = min_samples
        self.median_of = median_of

    def start(self, ctx: Context) -> list[Decision]:
        return [Submit(config, self.max_steps) for config in self.configs]

    def on_result(self, trial: Trial, step: int, metrics: dict[str, float]) -> list[Decision]:
        self.check_metric(metrics)
        if step < self.grace or step >= trial.steps:
            return []
        others = self.peers(trial, step)
        if len(others) < self.min_samples:
            return []
        median = statistics.median(self.running_average(t, step) for t in others)
        best = max(self._score(p.as_dict()) for p in trial.points if p.step <= step)
        return [Stop(trial.id)] if best < median else []

    def peers(self, trial: Trial, step: int) -> list[Trial]:
        """The trials whose running averages at `step` the median is taken of."""
        if self.median_of == "completed":
            return [t for t in self.trials if t.status == COMPLETED and t is not trial]
        return [t for t in self.trials if t is not trial and t.points and t.points[-1].step >= step]

    def running_average(self, trial: Trial, step: int) -> float:
        """The mean score (the metric, negated for ``min``) over the trial's steps ``<= step``."""
        return statistics.fmean(self._score(p.as_dict()) for p in trial.points if p.step <= step)

    def _score(self, metrics: dict[str, float]) -> float:
        score = self.score(metrics)
        return score if math.isfinite(score) else -math.inf
