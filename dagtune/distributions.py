"""Distributions for random search spaces.

A distribution stands where a value would: as a hyper-parameter of `dt.Random`, or as an
argument of a sequence (``MultiStep(loguniform(1e-3, 1e-1), [30, 45], 0.1)``). Sampling
replaces every distribution by a drawn value, recursively, so a sampled config is made of
plain sequences only.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from decimal import Decimal
from typing import Any

import numpy as np

from dagtune.validation import is_number

__all__ = [
    "Distribution",
    "choice",
    "loguniform",
    "normal",
    "qloguniform",
    "quniform",
    "randint",
    "sample",
    "uniform",
]


def _finite_number(owner: str, name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ValueError(f"{owner}.{name} must be a number, got {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"{owner}.{name} must be finite, got {value!r}")
    return value.item() if isinstance(value, np.generic) else value


def _frozen(value: Any) -> Any:
    """A hashable, type-aware stand-in for `value`: lists and tuples become tuples, dicts and
    sets frozensets, scalars carry their type (``1``, ``1.0`` and ``True`` stay apart)."""
    if isinstance(value, (list, tuple)):
        return ("seq", tuple(_frozen(item) for item in value))
    if isinstance(value, dict):
        return ("dict", frozenset((key, _frozen(item)) for key, item in value.items()))
    if isinstance(value, (set, frozenset)):
        return ("set", frozenset(_frozen(item) for item in value))
    if isinstance(value, (bool, int, float, str, type(None))):
        return (type(value).__name__, value)
    return value  # a sequence or a distribution: hashable itself


class Distribution(ABC):
    """A source of random values; immutable, comparable and hashable by its parameters (so a
    sequence template holding one is hashable too)."""

    @abstractmethod
    def draw(self, rng: np.random.Generator) -> Any:
        """One value drawn with `rng`."""

    @abstractmethod
    def _args(self) -> tuple:
        """Constructor arguments, in order (for equality, hashing and repr)."""

    def _key(self) -> tuple:
        return (type(self).__name__, _frozen(self._args()))

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(map(repr, self._args()))})"


class uniform(Distribution):  # noqa: N801 - lower-case like numpy/scipy/Ray Tune
    """A float drawn uniformly from [low, high)."""

    def __init__(self, low: float, high: float):
        self.low = _finite_number("uniform", "low", low)
        self.high = _finite_number("uniform", "high", high)
        if not self.low < self.high:
            raise ValueError(f"uniform.high must be greater than low, got low={low!r}, high={high!r}")

    def draw(self, rng: np.random.Generator) -> float:
        return float(rng.uniform(self.low, self.high))

    def _args(self) -> tuple:
        return (self.low, self.high)


class loguniform(Distribution):  # noqa: N801
    """A float whose logarithm is uniform on [log(low), log(high)); for learning rates."""

    def __init__(self, low: float, high: float):
        self.low = _finite_number("loguniform", "low", low)
        self.high = _finite_number("loguniform", "high", high)
        if self.low <= 0:
            raise ValueError(f"loguniform.low must be positive, got {low!r}")
        if not self.low < self.high:
            raise ValueError(f"loguniform.high must be greater than low, got low={low!r}, high={high!r}")

    def draw(self, rng: np.random.Generator) -> float:
        return float(math.exp(rng.uniform(math.log(self.low), math.log(self.high))))

    def _args(self) -> tuple:
        return (self.low, self.high)


class randint(Distribution):  # noqa: N801
    """An int drawn uniformly from [low, high) (high excluded, as numpy and Ray Tune do)."""

    def __init__(self, low: int, high: int):
        for name, value in (("low", low), ("high", high)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise ValueError(f"randint.{name} must be an int, got {value!r}")
        self.low, self.high = int(low), int(high)
        if not self.low < self.high:
            raise ValueError(f"randint.high must be greater than low, got low={low!r}, high={high!r}")

    def draw(self, rng: np.random.Generator) -> int:
        return int(rng.integers(self.low, self.high))

    def _args(self) -> tuple:
        return (self.low, self.high)


class _Quantized(Distribution):
    """A continuous draw rounded to the nearest multiple of `q` in ``[low, high]`` (as
    hyperopt and Ray Tune round): with int `low`, `high` and `q` the values are ints, else
    floats written as the multiples read (``0.1 * 3`` is ``0.3``, not ``0.30000000000000004``),
    so equal draws give equal values and their trials share prefixes."""

    _name = ""

    def _check(self, low: Any, high: Any, q: Any) -> None:
        name = self._name
        self.low = _finite_number(name, "low", low)
        self.high = _finite_number(name, "high", high)
        self.q = _finite_number(name, "q", q)
        if self.q <= 0:
            raise ValueError(f"{name}.q must be positive, got {q!r}")
        if not self.low < self.high:
            raise ValueError(f"{name}.high must be greater than low, got low={low!r}, high={high!r}")
        self.integral = all(isinstance(v, int) for v in (self.low, self.high, self.q))
        self.first, self.last = math.ceil(self.low / self.q), math.floor(self.high / self.q)
        if self.first > self.last:
            raise ValueError(
                f"{name}: no multiple of q={q!r} lies in [low, high] = [{low!r}, {high!r}]; widen it or use a smaller q"
            )

    def multiple(self, k: int) -> float | int:
        """The `k`-th multiple of q, as plainly as it reads."""
        if self.integral:
            return int(k * self.q)
        return float(Decimal(repr(float(self.q))) * k)

    def quantize(self, value: float) -> float | int:
        """`value` rounded to the nearest multiple of q, kept within ``[low, high]``."""
        k = min(max(round(value / self.q), self.first), self.last)
        return self.multiple(k)

    def _args(self) -> tuple:
        return (self.low, self.high, self.q)


class quniform(_Quantized):  # noqa: N801
    """A value drawn uniformly from [low, high), rounded to the nearest multiple of `q` in
    [low, high] (``quniform(32, 256, 32)``: 32, 64, ..., 256 as ints; ``quniform(0.0, 0.5,
    0.1)``: 0.0, 0.1, ..., 0.5)."""

    _name = "quniform"

    def __init__(self, low: float, high: float, q: float):
        self._check(low, high, q)

    def draw(self, rng: np.random.Generator) -> float | int:
        return self.quantize(float(rng.uniform(self.low, self.high)))


class qloguniform(_Quantized):  # noqa: N801
    """A value whose logarithm is uniform on [log(low), log(high)), rounded to the nearest
    multiple of `q` in [low, high] (``qloguniform(1e-4, 1e-1, 1e-4)``)."""

    _name = "qloguniform"

    def __init__(self, low: float, high: float, q: float):
        if is_number(low) and low <= 0:
            raise ValueError(f"qloguniform.low must be positive, got {low!r}")
        self._check(low, high, q)

    def draw(self, rng: np.random.Generator) -> float | int:
        return self.quantize(math.exp(rng.uniform(math.log(self.low), math.log(self.high))))


class normal(Distribution):  # noqa: N801
    """A float drawn from the normal distribution of mean `mean` and standard deviation `sd`
    (Ray Tune's ``randn``); unbounded, so use it where any value is valid (a log-scale
    exponent, a shift), not for a learning rate."""

    def __init__(self, mean: float = 0.0, sd: float = 1.0):
        self.mean = _finite_number("normal", "mean", mean)
        self.sd = _finite_number("normal", "sd", sd)
        if self.sd <= 0:
            raise ValueError(f"normal.sd must be positive, got {sd!r}")

    def draw(self, rng: np.random.Generator) -> float:
        return float(rng.normal(self.mean, self.sd))

    def _args(self) -> tuple:
        return (self.mean, self.sd)


class choice(Distribution):  # noqa: N801
    """One of `options`, each equally likely; options may be values, sequences or distributions."""

    def __init__(self, options):
        options = tuple(options)
        if not options:
            raise ValueError("choice.options must not be empty, got []")
        self.options = options

    def draw(self, rng: np.random.Generator) -> Any:
        return sample(self.options[int(rng.integers(len(self.options)))], rng)

    def _args(self) -> tuple:
        return (self.options,)

    def __repr__(self) -> str:
        return f"choice({list(self.options)!r})"


def sample(obj: Any, rng: np.random.Generator) -> Any:
    """`obj` with every distribution in it replaced by a drawn value.

    Understands distributions, sequences (anything with ``sample_distributions``), lists, tuples
    and dicts; anything else is returned as it is.
    """
    if isinstance(obj, Distribution):
        return obj.draw(rng)
    if hasattr(obj, "sample_distributions"):
        return obj.sample_distributions(rng)
    if isinstance(obj, dict):
        return {key: sample(value, rng) for key, value in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(sample(value, rng) for value in obj)
    return obj


def contains_distribution(obj: Any) -> bool:
    """Whether `obj` still holds a distribution anywhere inside it."""
    if isinstance(obj, Distribution):
        return True
    if hasattr(obj, "is_template"):
        return obj.is_template
    if isinstance(obj, dict):
        return any(contains_distribution(value) for value in obj.values())
    if isinstance(obj, (list, tuple)):
        return any(contains_distribution(value) for value in obj)
    return False
