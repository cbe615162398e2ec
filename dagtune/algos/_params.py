"""The tunable parameters of a random search space, for model-based algorithms.

`dt.Random` draws configs; a model-based algorithm (Bayesian optimization, an Optuna
sampler, MLtuner's re-tuning) instead needs to *see* the distributions inside the space's
template, choose their values itself and build the config those values make. `ParamSpace`
does both without touching `dagtune.space`: it walks the template (plain distributions,
distributions as arguments of sequences, `choice` among sequences that hold distributions
themselves) and names every distribution by a stable path::

    Random({"lr": MultiStep(loguniform(1e-3, 1e-1), [30, 45], 0.1), "bs": choice([64, 128])})
    # params: "bs" (categorical: 64, 128), "lr.init" (log: 1e-3 .. 1e-1)

Paths are the hyper-parameter name, then ``.field`` for a sequence's argument and ``[i]``
for an item of a list argument or the i-th option of a `choice`. A distribution inside a
choice's option is a parameter too; its value is ignored when another option is chosen.

Numeric parameters map to the unit interval (log-scaled for `loguniform` and
`qloguniform`, an equal-width cell per integer for `randint`, through the normal CDF for
`normal`; `quniform` and `qloguniform` round the value back to their multiples of q), and a
categorical one to a one-hot block, so an algorithm can model the space as the unit cube and
draw uniformly from it with the same distribution as `dt.Random`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

import numpy as np

from dagtune.config import Config, normalize_config
from dagtune.distributions import (
    Distribution,
    choice,
    loguniform,
    normal,
    qloguniform,
    quniform,
    randint,
    uniform,
)
from dagtune.sequences import Piecewise, Sequence
from dagtune.space import Random, filter_view

__all__ = ["CATEGORICAL", "CONTINUOUS", "INT", "LOG", "NORMAL", "Param", "ParamSpace"]

CONTINUOUS, LOG, INT, CATEGORICAL, NORMAL = "continuous", "log", "int", "categorical", "normal"
_EDGE = 1e-12  # the normal's unit positions stay inside (0, 1): its inverse CDF is infinite there

_CHOICE_SCALARS = (bool, int, float, str, type(None))


@dataclass(frozen=True)
class Param:
    """One distribution of a space: its path, kind and range.

    `low`/`high` bound a numeric parameter (`high` excluded for ``int``, as `randint` does);
    a ``normal`` one has a `mean` and `sd` instead; `quantized` is the `quniform` or
    `qloguniform` that rounds a value to its multiples. `options` are a categorical
    parameter's options, whose value is the option's index.
    """

    path: str
    kind: str
    low: float = 0.0
    high: float = 1.0
    options: tuple = ()
    mean: float = 0.0
    sd: float = 1.0
    quantized: Any = None

    @property
    def width(self) -> int:
        """Columns in the unit-cube encoding: 1, or one per option of a categorical."""
        return len(self.options) if self.kind == CATEGORICAL else 1

    @property
    def choices(self) -> tuple:
        """A categorical's options as plain values when they all are JSON scalars, else
        their indices (for libraries that only accept scalars as categories)."""
        if all(isinstance(o, _CHOICE_SCALARS) for o in self.options):
            return self.options
        return tuple(range(len(self.options)))

    def to_unit(self, value: Any) -> float:
        """A numeric value's position in [0, 1]."""
        if self.kind == NORMAL:
            return NormalDist(self.mean, self.sd).cdf(value)
        if self.kind == LOG:
            return (math.log(value) - math.log(self.low)) / (math.log(self.high) - math.log(self.low))
        if self.kind == INT:
            return (value - self.low + 0.5) / (self.high - self.low)
        return (value - self.low) / (self.high - self.low)

    def from_unit(self, u: float) -> float | int:
        """The numeric value at position `u` of [0, 1] (clipped into the range)."""
        u = min(max(float(u), 0.0), 1.0)
        if self.kind == NORMAL:
            return NormalDist(self.mean, self.sd).inv_cdf(min(max(u, _EDGE), 1.0 - _EDGE))
        if self.kind == LOG:
            value = math.exp(math.log(self.low) + u * (math.log(self.high) - math.log(self.low)))
            return self.snap(min(max(value, self.low), self.high))
        if self.kind == INT:
            return int(min(self.low + math.floor(u * (self.high - self.low)), self.high - 1))
        return self.snap(self.low + u * (self.high - self.low))

    def snap(self, value: float) -> Any:
        """`value` as the distribution gives it: rounded to a multiple of q if quantized."""
        return value if self.quantized is None else self.quantized.quantize(value)


def _param(path: str, dist: Distribution) -> Param:
    if isinstance(dist, quniform):
        return Param(path, CONTINUOUS, dist.low, dist.high, quantized=dist)
    if isinstance(dist, qloguniform):
        return Param(path, LOG, dist.low, dist.high, quantized=dist)
    if isinstance(dist, normal):
        return Param(path, NORMAL, mean=dist.mean, sd=dist.sd)
    if isinstance(dist, loguniform):
        return Param(path, LOG, dist.low, dist.high)
    if isinstance(dist, uniform):
        return Param(path, CONTINUOUS, dist.low, dist.high)
    if isinstance(dist, randint):
        return Param(path, INT, dist.low, dist.high)
    if isinstance(dist, choice):
        return Param(path, CATEGORICAL, options=dist.options)
    raise ValueError(f"{path}: {type(dist).__name__} is not a distribution a model-based algorithm knows")


def _walk(obj: Any, path: str, found: list[Param]) -> None:
    """Collect the distributions in `obj`, depth first, in argument order."""
    if isinstance(obj, Distribution):
        found.append(_param(path, obj))
        if isinstance(obj, choice):
            for i, option in enumerate(obj.options):
                _walk(option, f"{path}[{i}]", found)
    elif isinstance(obj, Sequence):
        if obj.is_template:
            for field, value in obj.arguments().items():
                _walk(value, f"{path}.{field}", found)
    elif isinstance(obj, (list, tuple)):
        for i, item in enumerate(obj):
            _walk(item, f"{path}[{i}]", found)


def _build(obj: Any, path: str, values: Mapping[str, Any]) -> Any:
    """`obj` with every distribution replaced by its value in `values` (the inverse of `_walk`)."""
    if isinstance(obj, choice):
        index = values[path]
        return _build(obj.options[index], f"{path}[{index}]", values)
    if isinstance(obj, Distribution):
        return values[path]
    if isinstance(obj, Sequence):
        if not obj.is_template:
            return obj
        args = [_build(value, f"{path}.{field}", values) for field, value in obj.arguments().items()]
        # Piecewise takes its (milestone, part) items as separate arguments
        return Piecewise(*args[0]) if isinstance(obj, Piecewise) else type(obj)(*args)
    if isinstance(obj, (list, tuple)):
        return type(obj)(_build(item, f"{path}[{i}]", values) for i, item in enumerate(obj))
    return obj


class ParamSpace:
    """The parameters of a `dt.Random` space (or of a dict of distributions) and the way
    back from chosen values to a config.

    `owner` names the algorithm in error messages.
    """

    def __init__(self, space: Random | Mapping[str, Any], owner: str):
        if isinstance(space, Random):
            template, self.where = space.space, space.where
        elif isinstance(space, Mapping) and space:
            Random(space, n=1)  # the same checks and error messages as dt.Random
            template, self.where = dict(space), None
        else:
            raise ValueError(
                f"{owner}.space must be a dt.Random or a dict of name -> distribution, got {space!r}"
            )
        self.owner = owner
        self.template = dict(template)
        found: list[Param] = []
        for name in sorted(self.template):
            _walk(self.template[name], name, found)
        if not found:
            raise ValueError(f"{owner}.space has no distribution to tune: {space!r}")
        self.params: tuple[Param, ...] = tuple(found)
        self.dims = sum(p.width for p in self.params)

    def __len__(self) -> int:
        return len(self.params)

    def config(self, values: Mapping[str, Any]) -> Config:
        """The config that `values` (path -> value; a categorical's value is its option's
        index) make of the template."""
        built = {name: _build(value, name, values) for name, value in self.template.items()}
        return normalize_config(built, owner=self.owner)

    def accepts(self, config: Config) -> bool:
        """Whether the space's `where` filter keeps `config` (seen as `filter_view` gives it)."""
        return self.where is None or bool(self.where(filter_view(config)))

    def sample_unit(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """`n` points of the unit-cube encoding, distributed as `dt.Random` draws."""
        columns = []
        for param in self.params:
            if param.kind == CATEGORICAL:
                columns.append(np.eye(param.width)[rng.integers(param.width, size=n)])
            else:
                columns.append(rng.uniform(size=(n, 1)))
        return np.hstack(columns)

    def decode(self, x: np.ndarray) -> dict[str, Any]:
        """The values (path -> value) at a point of the unit-cube encoding."""
        values: dict[str, Any] = {}
        column = 0
        for param in self.params:
            block = x[column : column + param.width]
            if param.kind == CATEGORICAL:
                values[param.path] = int(np.argmax(block))
            else:
                values[param.path] = param.from_unit(block[0])
            column += param.width
        return values

    def encode(self, values: Mapping[str, Any]) -> np.ndarray:
        """The unit-cube point of `values` (the inverse of `decode` up to rounding)."""
        columns: list[float] = []
        for param in self.params:
            if param.kind == CATEGORICAL:
                columns.extend(float(i == values[param.path]) for i in range(param.width))
            else:
                columns.append(param.to_unit(values[param.path]))
        return np.asarray(columns)

    def __repr__(self) -> str:
        return f"ParamSpace({[f'{p.path}:{p.kind}' for p in self.params]})"
