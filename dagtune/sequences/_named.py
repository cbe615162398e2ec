"""The named sequences: `Constant`, `Steps`, `MultiStep`, `Exponential`, `Linear`, `Cosine`,
`Cyclic`, `Warmup`, `Piecewise`, each its arguments checked and its canonical form generated."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import numpy as np

from dagtune.distributions import Distribution, sample
from dagtune.sequences._base import Sequence
from dagtune.sequences._checks import (
    Scalar,
    check_milestones,
    check_number,
    check_positive_int,
    check_scalar,
    computed,
)
from dagtune.sequences._primitives import Const, Piece, cosine_arc, geometric_pieces, ramp, triangle

__all__ = [
    "Constant",
    "Cosine",
    "Cyclic",
    "Exponential",
    "Linear",
    "MultiStep",
    "Piecewise",
    "Steps",
    "Warmup",
    "as_sequence",
]


#: the `Constant`s `as_sequence` made, by the type of their scalar, then its value: the trials
#: of a grid repeat each value many times, and one immutable `Constant` serves them all (96
#: bytes each, per trial and hyper-parameter, otherwise). Bounded: a type's table is emptied
#: when it holds `_CONSTANTS_HELD` (a random search's values are all distinct; kept small so
#: that what it holds for them costs little).
_CONSTANTS: dict[type, dict[Scalar, Constant]] = {}
_CONSTANTS_HELD = 1024


def as_sequence(value: Any, owner: str = "config", name: str = "value") -> Sequence:
    """`value` itself if it is a sequence, else the `Constant` of the scalar `value` (an
    equal one of the same type made before, if `_CONSTANTS` still holds it)."""
    if isinstance(value, Sequence):
        return value
    scalar = check_scalar(owner, name, value)
    if isinstance(scalar, Distribution):  # a template, sampled later: never shared
        return Constant(scalar)
    table = _CONSTANTS.setdefault(type(scalar), {})  # by type: True, 1 and 1.0 are equal keys
    constant = table.get(scalar)  # after `check_scalar`: finite, -0.0 made 0.0, so equal is same
    if constant is None:
        if len(table) >= _CONSTANTS_HELD:
            table.clear()
        constant = table[scalar] = Constant(scalar)
    return constant


class Constant(Sequence):
    """``value`` at every step; any JSON scalar (0.1, 128, "sgd")."""

    _fields = ("value",)
    __slots__ = _fields

    _first_horizon = math.inf  # its form is whole (made when asked)

    def __init__(self, value: Scalar):
        self._store(value=check_scalar("Constant", "value", value))

    @classmethod
    def _from_json_args(cls, data: dict) -> Sequence:
        """The shared `Constant` of a scalar (`as_sequence`): a study's journals hold one per
        trial and hyper-parameter, most of them equal."""
        value = data["value"]
        if isinstance(value, (dict, list)):  # no scalar: refused as the constructor refuses it
            return super()._from_json_args(data)
        return as_sequence(value, "Constant", "value")

    def pieces(self, horizon: int) -> tuple[Piece, ...]:
        """Its one piece, made when asked rather than kept: a study holds a `Constant` per
        trial and hyper-parameter, and keeping the piece would hold three objects more each."""
        if self.is_template:
            return super().pieces(horizon)  # which refuses it
        return ((0, Const(self.value)),)

    def _computed_value(self, t: int) -> Any:
        return self.value  # what its one piece says at every step, without making it

    def _generate(self, horizon: int) -> Iterator[Piece]:
        yield 0, Const(self.value)


class Steps(Sequence):
    """``values[k]`` where k is the number of milestones <= t: ``Steps([128, 256], [70])``."""

    _fields = ("values", "milestones")
    __slots__ = _fields

    def __init__(self, values, milestones):
        milestones = check_milestones("Steps", "milestones", milestones)
        if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
            raise ValueError(f"Steps.values must be a list, got {values!r}")
        values = tuple(check_scalar("Steps", "values", v) for v in values)
        if len(values) != len(milestones) + 1:
            raise ValueError(
                f"Steps.values must have one more entry than milestones, got "
                f"{len(values)} values for milestones {list(milestones)!r}"
            )
        self._store(values=values, milestones=milestones)

    def _extent(self) -> int | None:
        return (self.milestones[-1] if self.milestones else 0) + 1

    def _generate(self, horizon: int) -> Iterator[Piece]:
        for start, value in zip((0, *self.milestones), self.values):
            yield start, Const(value)


class MultiStep(Sequence):
    """``init * gamma ** k`` where k is the number of milestones <= t (torch MultiStepLR)."""

    _fields = ("init", "milestones", "gamma")
    __slots__ = _fields

    def __init__(self, init, milestones, gamma):
        self._store(
            init=check_number("MultiStep", "init", init),
            milestones=check_milestones("MultiStep", "milestones", milestones),
            gamma=check_number("MultiStep", "gamma", gamma),
        )

    def _extent(self) -> int | None:
        return (self.milestones[-1] if self.milestones else 0) + 1

    def _generate(self, horizon: int) -> Iterator[Piece]:
        for k, start in enumerate((0, *self.milestones)):  # k = 0 too: 1 * 0.1**0 is 1.0, not 1
            yield start, Const(computed(lambda k=k: self.init * self.gamma**k))


class Exponential(Sequence):
    """``init * gamma ** t`` (torch ExponentialLR)."""

    _fields = ("init", "gamma")
    __slots__ = _fields

    def __init__(self, init, gamma):
        self._store(
            init=check_number("Exponential", "init", init), gamma=check_number("Exponential", "gamma", gamma)
        )

    def _extent(self) -> int | None:
        return 2  # gamma == 0: init, then init * 0

    def _generate(self, horizon: int) -> Iterator[Piece]:
        yield from geometric_pieces(self.init, self.gamma, 0)


class Linear(Sequence):
    """``start + (end - start) * t / steps`` for t < steps, then ``end``."""

    _fields = ("start", "end", "steps")
    __slots__ = _fields

    def __init__(self, start, end, steps: int):
        self._store(
            start=check_number("Linear", "start", start),
            end=check_number("Linear", "end", end),
            steps=check_positive_int("Linear", "steps", steps),
        )

    def _extent(self) -> int | None:
        return self.steps + 1

    def _generate(self, horizon: int) -> Iterator[Piece]:
        yield 0, ramp(self.start, self.end, self.steps, 0)
        yield self.steps, Const(self.end)


class Cosine(Sequence):
    """SGDR cosine annealing from ``init`` to ``min_value`` over ``period`` steps, restarting
    every period, each period ``period_mult`` times longer (torch CosineAnnealingWarmRestarts)."""

    _fields = ("init", "period", "min_value", "period_mult")
    __slots__ = _fields

    def __init__(self, init, period: int, min_value=0.0, period_mult: int = 1):
        self._store(
            init=check_number("Cosine", "init", init),
            period=check_positive_int("Cosine", "period", period),
            min_value=check_number("Cosine", "min_value", min_value),
            period_mult=check_positive_int("Cosine", "period_mult", period_mult),
        )

    @property
    def _infinite(self) -> bool:  # restarts of growing length never end (unless all constant)
        return self.period_mult > 1 and self.init != self.min_value

    def _extent(self) -> int | None:
        return None if self._infinite else 1

    def _generate(self, horizon: int) -> Iterator[Piece]:
        if self.period_mult == 1:
            yield 0, cosine_arc(self.init, self.min_value, self.period, 0)
            return
        start, period = 0, self.period
        while True:
            yield start, cosine_arc(self.init, self.min_value, period, start)
            if start >= horizon:
                return
            start, period = start + period, period * self.period_mult


class Cyclic(Sequence):
    """Triangular cycles between ``base`` and ``max_value``: up in ``step_up`` steps, down in
    ``step_down`` (default: ``step_up``) (torch CyclicLR, mode "triangular")."""

    _fields = ("base", "max_value", "step_up", "step_down")
    __slots__ = _fields

    def __init__(self, base, max_value, step_up: int, step_down: int | None = None):
        step_up = check_positive_int("Cyclic", "step_up", step_up)
        self._store(
            base=check_number("Cyclic", "base", base),
            max_value=check_number("Cyclic", "max_value", max_value),
            step_up=step_up,
            step_down=step_up if step_down is None else check_positive_int("Cyclic", "step_down", step_down),
        )

    def _generate(self, horizon: int) -> Iterator[Piece]:
        yield 0, triangle(self.base, self.max_value, self.step_up, self.step_down, 0)


class Warmup(Sequence):
    """Linear warm-up from ``start`` to ``then(0)`` over ``steps`` steps, then ``then(t - steps)``:
    ``Warmup(5, MultiStep(0.1, [90, 135], 0.1))``."""

    _fields = ("steps", "then", "start")
    __slots__ = _fields

    def __init__(self, steps: int, then, start=0.0):
        self._store(
            steps=check_positive_int("Warmup", "steps", steps),
            then=as_sequence(then, "Warmup", "then"),
            start=check_number("Warmup", "start", start),
        )
        if not self.is_template:  # the ramp computes then(0) - start
            check_number("Warmup", "then(0)", self.then(0))

    @property
    def _infinite(self) -> bool:  # `then`'s form was cut at the horizon
        return self.then._horizon != math.inf

    def _extent(self) -> int | None:
        extent = self.then._extent()
        return None if extent is None else self.steps + extent

    def _generate(self, horizon: int) -> Iterator[Piece]:
        yield 0, ramp(self.start, self.then(0), self.steps, 0)
        for start, primitive in self.then.pieces(max(horizon - self.steps, 1)):
            yield start + self.steps, primitive.shifted(self.steps)

    def sample_distributions(self, rng: np.random.Generator) -> Sequence:
        if not self.is_template:
            return self
        return Warmup(sample(self.steps, rng), sample(self.then, rng), sample(self.start, rng))


class Piecewise(Sequence):
    """``a`` until ``m1``, then ``b(t - m1)`` until ``m2``, ...: ``Piecewise((0, a), (m1, b))``.

    Each part is a sequence or a plain value and restarts its own clock at its milestone, so a
    PBT lineage (explore from step m on) is exactly ``Piecewise((0, old), (m, new))``.
    """

    _fields = ("items",)
    __slots__ = _fields

    def __init__(self, *items):
        if len(items) == 1 and isinstance(items[0], list):
            items = tuple(items[0])
        if not items:
            raise ValueError("Piecewise needs at least one (milestone, sequence) item, got none")
        parsed = []
        for item in items:
            if not isinstance(item, (tuple, list)) or len(item) != 2:
                raise ValueError(f"Piecewise items must be (milestone, sequence) pairs, got {item!r}")
            parsed.append(item)
        milestones = check_milestones("Piecewise", "milestones", [m for m, _ in parsed], first=0)
        if milestones[0] != 0:
            raise ValueError(f"Piecewise.milestones must start at 0, got {list(milestones)!r}")
        parts = tuple(
            (m, as_sequence(part, "Piecewise", f"items[{i}]"))
            for i, (m, (_, part)) in enumerate(zip(milestones, parsed))
        )
        self._store(items=parts)

    def __repr__(self) -> str:
        return f"Piecewise({', '.join(f'({m}, {s!r})' for m, s in self.items)})"

    @property
    def _infinite(self) -> bool:  # the last part's form was cut at the horizon
        return self.items[-1][1]._horizon != math.inf

    def _extent(self) -> int | None:
        milestone, last = self.items[-1]
        extent = last._extent()
        return None if extent is None else milestone + extent

    def _generate(self, horizon: int) -> Iterator[Piece]:
        bounds = [m for m, _ in self.items[1:]] + [None]
        for (offset, part), stop in zip(self.items, bounds):
            limit = horizon if stop is None else min(stop, horizon)
            for start, primitive in part.pieces(max(limit - offset, 1)):
                begin = start + offset
                if stop is not None and begin >= stop:
                    break
                yield max(begin, offset), primitive.shifted(offset)

    @classmethod
    def _from_json_args(cls, data: dict) -> Sequence:
        items = data["items"]
        if not isinstance(items, list) or not all(isinstance(i, list) and len(i) == 2 for i in items):
            raise ValueError(
                f"serialized Piecewise.items must be a list of [milestone, sequence], got {items!r}"
            )
        return cls(*((m, Sequence.from_json(s)) for m, s in items))

    def sample_distributions(self, rng: np.random.Generator) -> Sequence:
        if not self.is_template:
            return self
        return Piecewise(*((m, sample(s, rng)) for m, s in self.items))
