"""Grid search and random search: every config trained to the same number of steps.

All trials are submitted at once, so the search plan sees every shared prefix before
anything runs and the critical-path scheduler can order the whole stage tree.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from dagtune.algos._base import Algorithm, Context, Decision, Submit, check_positive, configs_of
from dagtune.space import Random

__all__ = ["GridSearch", "RandomSearch"]


class GridSearch(Algorithm):
    """Train every config of `space` (a `dt.Grid` or any iterable of configs) for `steps`."""

    def __init__(self, space: Iterable[Any], metric: str, mode: str = "max", steps: int = 1):
        super().__init__(metric, mode)
        check_positive(type(self).__name__, steps=steps)
        self.configs = list(configs_of(space, owner=type(self).__name__))
        if not self.configs:
            raise ValueError(f"{type(self).__name__}: the search space is empty")
        self.steps = steps

    def start(self, ctx: Context) -> list[Decision]:
        return [Submit(config, self.steps) for config in self.configs]

    def on_result(self, trial, step, metrics):
        self.check_metric(metrics)


class RandomSearch(GridSearch):
    """Train `n` configs drawn from `space` (a `dt.Random`, or a dict of distributions)."""

    def __init__(
        self, space: Any, metric: str, mode: str = "max", steps: int = 1, n: int | None = None, seed: int = 0
    ):
        if not isinstance(space, Random):
            check_positive("RandomSearch", n=n)
            space = Random(space, n=n or 10, seed=seed)
        elif n is not None:
            check_positive("RandomSearch", n=n)
            space = Random(space.space, n=n, seed=space.seed, where=space.where)
        super().__init__(space, metric, mode, steps)
