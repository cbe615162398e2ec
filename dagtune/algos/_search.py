"""Grid search and random search: every config trained to the same number of steps.

All trials are submitted at once, so the search plan sees every shared prefix before
anything runs and the critical-path scheduler can order the whole stage tree. The space is
read lazily: building the algorithm takes its first config only (an empty space is an error
then), and `start` hands the submissions over one config at a time.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from typing import Any

from dagtune.algos._base import Algorithm, Context, Decision, Submit, check_positive, configs_of
from dagtune.space import Random

__all__ = ["GridSearch", "RandomSearch"]


class GridSearch(Algorithm):
    """Train every config of `space` (a `dt.Grid` or any iterable of configs) for `steps`."""

    def __init__(self, space: Iterable[Any], metric: str, mode: str = "max", steps: int = 1):
        super().__init__(metric, mode)
        check_positive(type(self).__name__, steps=steps)
        self.space = space
        self.steps = steps
        self._configs = configs_of(space, owner=type(self).__name__)
        first = next(self._configs, None)
        if first is None:
            raise ValueError(f"{type(self).__name__}: the search space is empty")
        self._configs = itertools.chain([first], self._configs)

    def start(self, ctx: Context) -> Iterator[Decision]:
        return (Submit(config, self.steps) for config in self._configs)

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
