"""Search spaces: iterating one yields configs (``dict`` name -> sequence).

`Grid` is the cartesian product of lists of candidates; `Random` draws `n` configs from
distributions with a seeded generator. Both are re-iterable and give the same configs every
time, so algorithms and benchmarks are reproducible.

A ``where=`` filter (conditional spaces) sees each config as `filter_view` gives it: the
plain value of a constant hyper-parameter (``c["opt"] == "adam"``, ``c["lr"] < 0.1``) and
the sequence of a schedule (``c["lr"](0)``, ``isinstance(c["lr"], dt.Cosine)``).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np

from dagtune.config import Config, normalize_config
from dagtune.distributions import contains_distribution, sample
from dagtune.sequences import Constant
from dagtune.validation import check_int

__all__ = ["Grid", "Random", "SearchSpace", "filter_view"]


def filter_view(config: Config) -> dict[str, Any]:
    """What a ``where=`` filter gets for `config`: each constant hyper-parameter (a plain
    value or `Constant`) as its plain value, every other as its sequence."""
    return {name: seq.value if isinstance(seq, Constant) else seq for name, seq in config.items()}


class SearchSpace:
    """Base of search spaces: an iterable of configs with a known hyper-parameter set.

    Iterating yields normalized configs (`dagtune.config.normalize_config`). `finite` tells
    whether the space ends (then ``len`` works, though it may cost a pass over the space).
    """

    names: tuple[str, ...]
    finite = True

    def __iter__(self) -> Iterator[Config]:
        raise NotImplementedError

    def __len__(self) -> int:
        return sum(1 for _ in self)


class Grid(SearchSpace):
    """Every combination of the candidates: ``Grid({"lr": [Constant(0.1), ...], "wd": [1e-4, 1e-3]})``.

    `where` keeps only the configs for which it returns true (conditional spaces); it gets
    each config as `filter_view` gives it: plain values for constant hyper-parameters
    (``where=lambda c: c["opt"] == "sgd" or c["momentum"] == 0.0``), sequences for schedules.
    Candidates are sequences or plain values; a non-list value is a single candidate.

    The product is iterated lazily, in the same order every time (the last name varies
    fastest): building a grid of a million configs checks each candidate once, and iterating
    it holds one config at a time. ``len`` is the product of the candidate counts; with
    `where` it counts the configs the filter keeps, one pass over the product (then cached).
    A filter that keeps nothing is an error at construction, found by iterating up to the
    first config it keeps.
    """

    def __init__(self, candidates: Mapping[str, Any], where: Callable[[dict[str, Any]], bool] | None = None):
        if not isinstance(candidates, Mapping) or not candidates:
            raise ValueError(f"Grid needs a non-empty dict of name -> candidates, got {candidates!r}")
        self.candidates: dict[str, list] = {}
        self._sequences: list[list] = []  # each name's candidates as sequences, in `candidates` order
        for name, values in candidates.items():
            values = list(values) if isinstance(values, (list, tuple)) else [values]
            if not values:
                raise ValueError(f"Grid[{name!r}] has no candidates, got []")
            for value in values:
                if contains_distribution(value):
                    raise ValueError(
                        f"Grid[{name!r}] holds a distribution ({value!r}); use dt.Random for those"
                    )
            self.candidates[name] = values
            self._sequences.append([normalize_config({name: v}, owner="Grid")[name] for v in values])
        self.where = where
        self.names = tuple(sorted(self.candidates))
        self._size: int | None = (
            math.prod(len(v) for v in self.candidates.values()) if where is None else None
        )
        if where is not None and next(self._product(), None) is None:
            raise ValueError(
                f"Grid: the where= filter {where!r} removed all "
                f"{math.prod(len(v) for v in self.candidates.values())} configs"
            )

    def _product(self) -> Iterator[Config]:
        given = list(self.candidates)
        order = sorted(range(len(given)), key=lambda i: given[i])  # configs list names sorted
        names = [given[i] for i in order]
        for combo in itertools.product(*self._sequences):
            config = {name: combo[i] for name, i in zip(names, order)}
            if self.where is None or self.where(filter_view(config)):
                yield config

    def __iter__(self) -> Iterator[Config]:
        return self._product()

    def __len__(self) -> int:
        if self._size is None:
            self._size = sum(1 for _ in self._product())
        return self._size

    def __repr__(self) -> str:
        return f"Grid({self.candidates!r}{'' if self.where is None else ', where=...'})"


class Random(SearchSpace):
    """`n` configs drawn from distributions with a seeded generator.

    Values may be distributions (``loguniform(1e-3, 1e-1)``), sequences whose arguments are
    distributions (``MultiStep(loguniform(1e-3, 1e-1), [30, 45], 0.1)``), `choice` among
    sequences, or plain values. `n=None` makes the space endless (for algorithms that draw as
    they go); `where` rejects draws, which are drawn again (it gets each draw as
    `filter_view` gives it: plain values for constants, sequences for schedules).
    """

    def __init__(
        self,
        space: Mapping[str, Any],
        n: int | None = 10,
        seed: int = 0,
        where: Callable[[dict[str, Any]], bool] | None = None,
        max_rejections: int = 10_000,
    ):
        if not isinstance(space, Mapping) or not space:
            raise ValueError(f"Random needs a non-empty dict of name -> distribution, got {space!r}")
        for name, value in space.items():
            if isinstance(value, (list, tuple)):
                raise ValueError(
                    f"Random[{name!r}] is a list ({value!r}); write dt.choice({value!r}) to pick among them"
                )
        check_int("Random.n", n, minimum=1, optional=True)
        self.space = dict(space)
        self.n = n
        self.seed = seed
        self.where = where
        self.max_rejections = max_rejections
        self.names = tuple(sorted(self.space))
        first = next(iter(self.sampler()))  # fail early on a space that can't be sampled
        del first

    def sampler(self, seed: int | None = None) -> Iterator[Config]:
        """An endless stream of configs, reproducible for a given seed."""
        rng = np.random.default_rng(self.seed if seed is None else seed)
        rejected = 0
        while True:
            config = normalize_config(sample(self.space, rng), owner="Random")
            if self.where is None or self.where(filter_view(config)):
                rejected = 0
                yield config
                continue
            rejected += 1
            if rejected >= self.max_rejections:
                raise ValueError(
                    f"Random: the where= filter {self.where!r} rejected {rejected} draws in a row"
                )

    @property
    def finite(self) -> bool:  # type: ignore[override]
        return self.n is not None

    def __iter__(self) -> Iterator[Config]:
        stream = self.sampler()
        return stream if self.n is None else itertools.islice(stream, self.n)

    def __len__(self) -> int:
        if self.n is None:
            raise TypeError("Random(n=None) is endless")
        return self.n

    def __repr__(self) -> str:
        return f"Random({self.space!r}, n={self.n!r}, seed={self.seed!r})"
