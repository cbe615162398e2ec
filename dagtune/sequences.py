"""Hyper-parameter sequences and their canonical, comparable form.

A sequence gives a hyper-parameter's value at every step ``t = 0, 1, 2, ...``. Two trials share
a prefix when their values are equal step by step, whatever way the sequences were written, so
every sequence compiles to a *canonical piecewise form*: a list of ``(start, primitive)``
pieces, each primitive a closed-form function of the step (a constant, a geometric decay, a
linear ramp, a cosine arc, a triangle wave). Values are always computed through that form, so
equal primitives guarantee equal values, and comparing two sequences costs one comparison per
piece rather than one per step: a 30,000-step BERT schedule is three pieces.

Primitives are canonical, so that sequences equal by value but written differently meet as
equal primitives rather than being compared step by step: a primitive whose value does not
depend on the step is a constant (a cosine arc or triangle whose two ends are equal, a cosine
of period 1, a geometric piece with ratio 1 or initial value 0, a ramp between equal ends);
a cosine arc keeps its origin modulo its period (its value depends on the step only through
that phase), so SGDR restarted at any multiple of its period is one primitive. A triangle
does so only when its cycle is a power of two: torch's formula rounds differently at
different cycles otherwise, and such triangles really differ in the last bit.

Values must be finite: a value that overflows (``Exponential(0.1, 10.0)`` at step 309) or is
infinite or NaN is a ValueError naming the sequence and the step, on evaluation and when a
comparison (`first_difference`) covers that step.

Equality of values is exact and type-aware: ``128`` (an int) and ``128.0`` are different
values, because a trainer may treat them differently (a batch size must be an int).
"""

from __future__ import annotations

import bisect
import inspect
import itertools
import json
import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from typing import Any, ClassVar, Union

import numpy as np

from dagtune.distributions import Distribution, contains_distribution, sample

__all__ = [
    "Constant",
    "Cosine",
    "Cyclic",
    "Exponential",
    "Linear",
    "MultiStep",
    "Piecewise",
    "Sequence",
    "Steps",
    "Warmup",
    "as_sequence",
    "first_difference",
    "same_value",
]

Scalar = Union[int, float, str, bool, None]  # noqa: UP007 - a runtime alias on 3.10
_SCALAR_TYPES = (bool, int, float, str, type(None))


# --------------------------------------------------------------------------- values


def same_value(a: Scalar, b: Scalar) -> bool:
    """Exact, type-aware equality of two hyper-parameter values."""
    return type(a) is type(b) and a == b


def _typed(value: Any) -> Any:
    """A key that makes equality type-aware (``1 != 1.0 != True``) and recurses into tuples."""
    if isinstance(value, tuple):
        return tuple(_typed(item) for item in value)
    if isinstance(value, _SCALAR_TYPES):
        return (type(value).__name__, value)
    return value


def _scalar(owner: str, name: str, value: Any) -> Any:
    """A JSON scalar (or a distribution), checked; numpy scalars become Python ones."""
    if isinstance(value, Distribution):
        return value
    if isinstance(value, np.generic):
        value = value.item()
    if not isinstance(value, _SCALAR_TYPES):
        raise ValueError(
            f"{owner}.{name} must be a JSON scalar (number, string, bool or None), got {value!r}"
        )
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{owner}.{name} must be finite, got {value!r}")
        if value == 0.0:
            value = 0.0  # -0.0 and 0.0 are one value
    return value


def _number(owner: str, name: str, value: Any) -> Any:
    value = _scalar(owner, name, value)
    if isinstance(value, Distribution):
        return value
    if isinstance(value, (bool, str)) or value is None:
        raise ValueError(f"{owner}.{name} must be a number, got {value!r}")
    return value


def _positive_int(owner: str, name: str, value: Any) -> Any:
    if isinstance(value, Distribution):
        return value
    if isinstance(value, np.integer):
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{owner}.{name} must be a positive int, got {value!r}")
    if value <= 0:
        raise ValueError(f"{owner}.{name} must be positive, got {value!r}")
    return value


def _milestones(owner: str, name: str, values: Any, *, first: int = 1) -> tuple[int, ...]:
    """Strictly increasing ints, the first at least `first`."""
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
        raise ValueError(f"{owner}.{name} must be a list of ints, got {values!r}")
    values = tuple(values)
    for value in values:
        if isinstance(value, np.integer):
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{owner}.{name} must hold ints, got {list(values)!r}")
    values = tuple(int(v) for v in values)
    if values and values[0] < first:
        raise ValueError(f"{owner}.{name} must start at {first} or later, got {list(values)!r}")
    if any(b <= a for a, b in itertools.pairwise(values)):
        raise ValueError(f"{owner}.{name} must be strictly increasing, got {list(values)!r}")
    return values


# --------------------------------------------------------------------------- primitives


def _is_finite(value: Any) -> bool:
    return not isinstance(value, float) or math.isfinite(value)


def _computed(compute: Callable[[], Any]) -> Any:
    """``compute()``, or ``inf`` where the arithmetic overflows (``10.0 ** 400`` raises)."""
    try:
        return compute()
    except OverflowError:
        return math.inf


class _Primitive(ABC):
    """A closed-form function of the absolute step; the unit of the canonical form.

    Primitives are canonical: two equal primitives take equal values at every step, and a
    primitive whose values do not depend on the step is a `_Const` (see the ``_cosine_arc``,
    ``_triangle``, ``_geometric_pieces`` and ``_ramp`` constructors).
    """

    __slots__ = ()

    @abstractmethod
    def value(self, t: int) -> Scalar: ...

    @abstractmethod
    def shifted(self, by: int) -> _Primitive:
        """The same function moved `by` steps later."""

    @abstractmethod
    def _key(self) -> tuple: ...

    def finite_at(self, t: int) -> bool:
        try:
            return _is_finite(self.value(t))
        except OverflowError:
            return False

    def first_nonfinite(self, lo: int, hi: int) -> int | None:
        """The first step in ``[lo, hi)`` (``lo < hi``) whose value is not finite, or None;
        a few evaluations, not one per step."""
        return self._first_nonfinite_suffix(lo, hi)

    def _first_nonfinite_suffix(self, lo: int, hi: int) -> int | None:
        """For a magnitude that is monotone or convex in the step (geometric, linear): the
        non-finite steps after a finite `lo` form a suffix, found by bisection."""
        if not self.finite_at(lo):
            return lo
        if self.finite_at(hi - 1):
            return None
        good, bad = lo, hi - 1
        while bad - good > 1:
            middle = (good + bad) // 2
            if self.finite_at(middle):
                good = middle
            else:
                bad = middle
        return bad

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return f"{type(self).__name__[1:]}{self._key()[1:]}"


class _Const(_Primitive):
    __slots__ = ("v",)

    def __init__(self, v: Scalar):
        self.v = v

    def value(self, t: int) -> Scalar:
        return self.v

    def shifted(self, by: int) -> _Const:
        return self

    def first_nonfinite(self, lo: int, hi: int) -> int | None:
        return None if _is_finite(self.v) else lo

    def _key(self) -> tuple:
        return ("const", _typed(self.v))


class _Geometric(_Primitive):
    """``init * gamma ** (t - origin)``."""

    __slots__ = ("init", "gamma", "origin")

    def __init__(self, init, gamma, origin: int):
        self.init, self.gamma, self.origin = init, gamma, origin

    def value(self, t: int) -> float:
        return self.init * self.gamma ** (t - self.origin)

    def shifted(self, by: int) -> _Geometric:
        return _Geometric(self.init, self.gamma, self.origin + by)

    def _key(self) -> tuple:
        return ("geometric", _typed(self.init), _typed(self.gamma), self.origin)


def _geometric_pieces(init, gamma, origin: int) -> Iterator[Piece]:
    """``init * gamma ** (t - origin)`` from `origin` on, with the degenerate cases constant:
    ``gamma == 1`` and ``init == 0`` (the same value at every step, ``0.0 * g**k`` being
    ``0.0`` or ``-0.0``, which are one value), and ``gamma == 0`` (``init`` once, then
    ``init * 0``). The constant has the type every step has (``1 * 0.5**k`` is a float)."""
    if gamma == 1 or init == 0:
        yield origin, _Const(_computed(lambda: init * gamma**0))
    elif gamma == 0:
        yield origin, _Const(_computed(lambda: init * gamma**0))
        yield origin + 1, _Const(_computed(lambda: init * gamma**1))
    else:
        yield origin, _Geometric(init, gamma, origin)


class _Ramp(_Primitive):
    """``start + (end - start) * (t - origin) / length``."""

    __slots__ = ("start", "end", "length", "origin")

    def __init__(self, start, end, length: int, origin: int):
        self.start, self.end, self.length, self.origin = start, end, length, origin

    def value(self, t: int) -> float:
        return self.start + (self.end - self.start) * (t - self.origin) / self.length

    def shifted(self, by: int) -> _Ramp:
        return _Ramp(self.start, self.end, self.length, self.origin + by)

    def _key(self) -> tuple:
        return ("ramp", _typed(self.start), _typed(self.end), self.length, self.origin)


def _ramp(start, end, length: int, origin: int) -> _Primitive:
    if start == end:  # (end - start) * k / length is 0.0 at every step
        return _Const(_computed(lambda: start + (end - start) * 0 / length))
    return _Ramp(start, end, length, origin)


class _Bounded(_Primitive):
    """A periodic primitive ``low + (high - low) * s`` with ``0 <= s <= 1``, largest at the
    peak ``s = 1``: if the first step and the peak are finite, every step is."""

    __slots__ = ()

    @abstractmethod
    def _peak(self) -> Scalar: ...

    @abstractmethod
    def _cycle(self) -> int: ...

    def first_nonfinite(self, lo: int, hi: int) -> int | None:
        if not self.finite_at(lo):
            return lo
        try:
            if _is_finite(self._peak()):
                return None
        except OverflowError:
            pass
        # values within an ulp of the largest float: look through one cycle, step by step
        return next((t for t in range(lo, min(hi, lo + self._cycle())) if not self.finite_at(t)), None)


class _CosineArc(_Bounded):
    """SGDR's ``low + (high - low) * (1 + cos(pi * T / period)) / 2`` with T = (t - origin)
    modulo `period` (torch's CosineAnnealingWarmRestarts formula).

    The value depends on the step only through its phase ``(t - origin) % period``, computed
    in integers, so `origin` is kept modulo `period`: arcs restarting at any multiple of the
    period are one primitive. (A single SGDR period of a growing schedule is the same arc,
    used over one period only.)
    """

    __slots__ = ("high", "low", "period", "origin")

    def __init__(self, high, low, period: int, origin: int):
        self.high, self.low, self.period, self.origin = high, low, period, origin % period

    def value(self, t: int) -> float:
        elapsed = (t - self.origin) % self.period
        return self.low + (self.high - self.low) * (1 + math.cos(math.pi * elapsed / self.period)) / 2

    def shifted(self, by: int) -> _CosineArc:
        return _CosineArc(self.high, self.low, self.period, self.origin + by)

    def _peak(self) -> Scalar:
        return self.low + (self.high - self.low) * (1 + 1.0) / 2

    def _cycle(self) -> int:
        return self.period

    def _key(self) -> tuple:
        return ("cosine", _typed(self.high), _typed(self.low), self.period, self.origin)


def _cosine_arc(high, low, period: int, origin: int) -> _Primitive:
    # equal ends: low + 0.0 at every step; a period of 1 step: always the top of the arc
    if high == low or period == 1:
        return _Const(_computed(lambda: low + (high - low) * (1 + 1.0) / 2))
    return _CosineArc(high, low, period, origin)


class _Triangle(_Bounded):
    """torch's triangular CyclicLR, with ``last_epoch = t - origin``.

    torch computes ``1.0 + last_epoch / cycle - floor(...)``, whose rounding depends on
    `last_epoch` itself, not only on its phase: two triangles whose origins differ by a
    multiple of the cycle may differ in the last bit, and are different primitives. When the
    cycle (``up + down``) is a power of two every step of that computation is exact, the value
    depends on the phase only, and `origin` is kept modulo the cycle.
    """

    __slots__ = ("base", "peak", "up", "down", "origin")

    def __init__(self, base, peak, up: int, down: int, origin: int):
        total = up + down
        if total & (total - 1) == 0:  # a power of two
            origin %= total
        self.base, self.peak, self.up, self.down, self.origin = base, peak, up, down, origin

    def value(self, t: int) -> float:
        total = self.up + self.down
        ratio = self.up / total
        elapsed = t - self.origin
        cycle = math.floor(1 + elapsed / total)
        x = 1.0 + elapsed / total - cycle
        scale = x / ratio if x <= ratio else (x - 1) / (ratio - 1)
        return self.base + (self.peak - self.base) * scale * 1.0

    def shifted(self, by: int) -> _Triangle:
        return _Triangle(self.base, self.peak, self.up, self.down, self.origin + by)

    def _peak(self) -> Scalar:
        return self.base + (self.peak - self.base) * 1.0 * 1.0

    def _cycle(self) -> int:
        return self.up + self.down

    def _key(self) -> tuple:
        return ("triangle", _typed(self.base), _typed(self.peak), self.up, self.down, self.origin)


def _triangle(base, peak, up: int, down: int, origin: int) -> _Primitive:
    if base == peak:  # base + 0.0 at every step
        return _Const(_computed(lambda: base + (peak - base) * 0.0 * 1.0))
    return _Triangle(base, peak, up, down, origin)


Piece = tuple[int, _Primitive]


# --------------------------------------------------------------------------- sequences


class Sequence(ABC):
    """A hyper-parameter's value as a function of the step.

    Immutable and hashable; ``repr`` evaluates back to an equal sequence in the `dagtune`
    namespace and ``to_json``/``from_json`` round-trip exactly. Arguments may be
    distributions (``loguniform(...)``), making the sequence a *template* that `dt.Random`
    samples; a template cannot be evaluated.

    ``==`` and ``hash`` compare canonical forms: two sequences are equal when their whole
    canonical piecewise forms are equal piece by piece, however they were written
    (``Exponential(0.1, 1.0) == Constant(0.1)``, and
    ``Piecewise((0, Cosine(0.1, 100)), (100, Cosine(0.1, 100))) == Cosine(0.1, 100)``).
    Equal forms take equal values at every step. The converse does not hold: sequences equal
    by value whose canonical forms differ compare unequal, e.g. ``Linear(0.0, 1.0, 2)`` (a
    ramp) and ``Steps([0.0, 0.5, 1.0], [1, 2])`` (constants), or ``Exponential(0.1, 0.5)``
    and ``Piecewise((0, Exponential(0.1, 0.5)), (2000, 0.0))`` (the geometric underflows to
    0.0 long before step 2000). A form that never ends (`Cosine` with ``period_mult > 1``,
    or a sequence ending in one) and a template compare by type and arguments. The exact
    comparison by value is `first_difference`; prefix sharing uses it, never ``==``.
    """

    _fields: ClassVar[tuple[str, ...]] = ()
    _registry: ClassVar[dict[str, type[Sequence]]] = {}

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        Sequence._registry[cls.__name__] = cls

    def _store(self, **values: Any) -> None:
        for name, value in values.items():
            object.__setattr__(self, name, value)
        object.__setattr__(self, "_is_template", contains_distribution(self._args()))
        object.__setattr__(self, "_pieces", ())
        object.__setattr__(self, "_horizon", 0)
        object.__setattr__(self, "_checked", 0)
        object.__setattr__(self, "_nonfinite", None)
        object.__setattr__(self, "_identity", None)
        object.__setattr__(self, "_hash", None)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable")

    def __getstate__(self) -> dict:
        return {name: getattr(self, name) for name in self._fields}

    def __setstate__(self, state: dict) -> None:
        self._store(**state)

    def _args(self) -> tuple:
        return tuple(getattr(self, name) for name in self._fields)

    # ---- identity

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if not isinstance(other, Sequence):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        if self._hash is None:
            object.__setattr__(self, "_hash", hash(self._key()))
        return self._hash

    def _key(self) -> tuple:
        """What `==` compares: the whole canonical form when it is finite, else (SGDR restarts
        of growing length, and templates) the type and the arguments."""
        if self._identity is None:
            extent = None if self._is_template else self._extent()
            if extent is None:
                key = ("written", type(self).__name__, _typed(self._args()))
            else:
                key = ("pieces", self.pieces(extent))
            object.__setattr__(self, "_identity", key)
        return self._identity

    def _extent(self) -> int | None:
        """A horizon past which the canonical form has no new piece, or None if it has new
        pieces forever. The default: the form is one piece."""
        return 1

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(_repr_arg(a) for a in self._args())})"

    # ---- values

    def __call__(self, t: int) -> Scalar:
        """The value at step `t` (t >= 0); a ValueError if it is not finite."""
        if isinstance(t, np.integer):
            t = int(t)
        if isinstance(t, bool) or not isinstance(t, int) or t < 0:
            raise ValueError(f"step must be an int >= 0, got {t!r}")
        value = self._computed_value(t)
        if not _is_finite(value):
            raise self._nonfinite_error(t, value)
        return value

    def _computed_value(self, t: int) -> Any:
        """The value at `t` as computed, ``inf`` where the arithmetic overflows."""
        pieces = self.pieces(t + 1)
        index = bisect.bisect_right(pieces, t, key=lambda piece: piece[0]) - 1
        return _computed(lambda: pieces[index][1].value(t))

    def _nonfinite_error(self, t: int, value: Any) -> ValueError:
        what = "overflows" if value == math.inf else f"is {value!r}"
        return ValueError(f"{self!r} has no finite value at step {t} (its value {what})")

    def values(self, start: int, stop: int) -> list[Scalar]:
        """Values at steps ``start, ..., stop - 1``."""
        return [self(t) for t in range(start, stop)]

    def pieces(self, horizon: int) -> tuple[Piece, ...]:
        """The canonical form over at least ``[0, horizon)``: ``(start, primitive)`` pairs with
        increasing starts, the first at 0, no two neighbours equal."""
        if self._is_template:
            raise ValueError(f"{self!r} holds a distribution; sample it (dt.Random) before use")
        if horizon > self._horizon:
            target = max(horizon, 2 * self._horizon, 64)
            merged: list[Piece] = []
            finite = True
            for start, primitive in self._generate(target):
                if start >= target:
                    finite = False
                    break
                if merged and merged[-1][1] == primitive:
                    continue
                merged.append((start, primitive))
            else:
                finite = not self._infinite
            object.__setattr__(self, "_pieces", tuple(merged))
            object.__setattr__(self, "_horizon", math.inf if finite else target)
        return self._pieces

    def first_nonfinite(self, stop: int) -> int | None:
        """The first step before `stop` where the value is not finite (it overflows, or is
        infinite or NaN), or None. A few evaluations per piece, not one per step."""
        if self._nonfinite is not None:
            return self._nonfinite if self._nonfinite < stop else None
        if stop > self._checked:
            checked, target = self._checked, max(stop, 2 * self._checked, 64)
            pieces = self.pieces(target)
            ends = [start for start, _ in pieces[1:]] + [target]
            found = None
            for (start, primitive), end in zip(pieces, ends):
                lo, hi = max(start, checked), min(end, target)
                if lo < hi and (found := primitive.first_nonfinite(lo, hi)) is not None:
                    break
            object.__setattr__(self, "_checked", target)
            object.__setattr__(self, "_nonfinite", found)
        return self.first_nonfinite(stop) if self._nonfinite is not None else None

    def check_finite(self, stop: int) -> None:
        """Raise a ValueError naming the sequence and the step if a value before `stop` is
        not finite."""
        bad = self.first_nonfinite(stop)
        if bad is not None:
            raise self._nonfinite_error(bad, self._computed_value(bad))

    # whether the pieces `_generate` yielded, having run to its end, may still go on past the
    # horizon (checked after the run: a wrapper asks whether its inner form was complete)
    _infinite: ClassVar[bool] = False

    @abstractmethod
    def _generate(self, horizon: int) -> Iterator[Piece]:
        """Pieces in order; may stop once a piece starts at or after `horizon`."""

    # ---- serialization and sampling

    def to_json(self) -> dict:
        """A JSON-ready dict that `Sequence.from_json` turns back into an equal sequence."""
        if self._is_template:
            raise ValueError(f"{self!r} holds a distribution and has no JSON form")
        return {"type": type(self).__name__, **{n: _json_arg(getattr(self, n)) for n in self._fields}}

    @staticmethod
    def from_json(data: dict) -> Sequence:
        """The sequence `to_json` gave `data` for; a ValueError names the type and the field
        that is missing or unexpected (fields with a default, like Cosine's ``min_value``, may
        be left out)."""
        if not isinstance(data, dict) or data.get("type") not in Sequence._registry:
            raise ValueError(f"not a serialized dagtune sequence: {data!r}")
        cls = Sequence._registry[data["type"]]
        optional = cls._optional_fields()
        for name in cls._fields:
            if name not in data and name not in optional:
                raise ValueError(f"serialized {cls.__name__} is missing field {name!r}: {data!r}")
        for name in data:
            if name != "type" and name not in cls._fields:
                raise ValueError(f"serialized {cls.__name__} has an unexpected field {name!r}: {data!r}")
        return cls._from_json_args(data)

    @classmethod
    def _optional_fields(cls) -> frozenset[str]:
        """The fields whose constructor argument has a default."""
        optional = cls.__dict__.get("_optional")
        if optional is None:
            parameters = inspect.signature(cls.__init__).parameters.values()
            optional = frozenset(p.name for p in parameters if p.default is not inspect.Parameter.empty)
            cls._optional = optional
        return optional

    @classmethod
    def _from_json_args(cls, data: dict) -> Sequence:
        return cls(**{name: _from_json_arg(data[name]) for name in cls._fields if name in data})

    def _sample_params(self, rng: np.random.Generator) -> Sequence:
        if not self._is_template:
            return self
        return type(self)(*sample(self._args(), rng))


def _repr_arg(value: Any) -> str:
    return repr(list(value)) if isinstance(value, tuple) else repr(value)


def _json_arg(value: Any) -> Any:
    if isinstance(value, Sequence):
        return value.to_json()
    if isinstance(value, tuple):
        return [_json_arg(item) for item in value]
    return value


def _from_json_arg(value: Any) -> Any:
    if isinstance(value, dict):
        return Sequence.from_json(value)
    if isinstance(value, list):
        return [_from_json_arg(item) for item in value]
    return value


def as_sequence(value: Any, owner: str = "config", name: str = "value") -> Sequence:
    """`value` itself if it is a sequence, else the `Constant` of the scalar `value`."""
    if isinstance(value, Sequence):
        return value
    return Constant(_scalar(owner, name, value))


class Constant(Sequence):
    """``value`` at every step; any JSON scalar (0.1, 128, "sgd")."""

    _fields = ("value",)

    def __init__(self, value: Scalar):
        self._store(value=_scalar("Constant", "value", value))

    def _generate(self, horizon: int) -> Iterator[Piece]:
        yield 0, _Const(self.value)


class Steps(Sequence):
    """``values[k]`` where k is the number of milestones <= t: ``Steps([128, 256], [70])``."""

    _fields = ("values", "milestones")

    def __init__(self, values, milestones):
        milestones = _milestones("Steps", "milestones", milestones)
        if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
            raise ValueError(f"Steps.values must be a list, got {values!r}")
        values = tuple(_scalar("Steps", "values", v) for v in values)
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
            yield start, _Const(value)


class MultiStep(Sequence):
    """``init * gamma ** k`` where k is the number of milestones <= t (torch MultiStepLR)."""

    _fields = ("init", "milestones", "gamma")

    def __init__(self, init, milestones, gamma):
        self._store(
            init=_number("MultiStep", "init", init),
            milestones=_milestones("MultiStep", "milestones", milestones),
            gamma=_number("MultiStep", "gamma", gamma),
        )

    def _extent(self) -> int | None:
        return (self.milestones[-1] if self.milestones else 0) + 1

    def _generate(self, horizon: int) -> Iterator[Piece]:
        for k, start in enumerate((0, *self.milestones)):  # k = 0 too: 1 * 0.1**0 is 1.0, not 1
            yield start, _Const(_computed(lambda k=k: self.init * self.gamma**k))


class Exponential(Sequence):
    """``init * gamma ** t`` (torch ExponentialLR)."""

    _fields = ("init", "gamma")

    def __init__(self, init, gamma):
        self._store(init=_number("Exponential", "init", init), gamma=_number("Exponential", "gamma", gamma))

    def _extent(self) -> int | None:
        return 2  # gamma == 0: init, then init * 0

    def _generate(self, horizon: int) -> Iterator[Piece]:
        yield from _geometric_pieces(self.init, self.gamma, 0)


class Linear(Sequence):
    """``start + (end - start) * t / steps`` for t < steps, then ``end``."""

    _fields = ("start", "end", "steps")

    def __init__(self, start, end, steps: int):
        self._store(
            start=_number("Linear", "start", start),
            end=_number("Linear", "end", end),
            steps=_positive_int("Linear", "steps", steps),
        )

    def _extent(self) -> int | None:
        return self.steps + 1

    def _generate(self, horizon: int) -> Iterator[Piece]:
        yield 0, _ramp(self.start, self.end, self.steps, 0)
        yield self.steps, _Const(self.end)


class Cosine(Sequence):
    """SGDR cosine annealing from ``init`` to ``min_value`` over ``period`` steps, restarting
    every period, each period ``period_mult`` times longer (torch CosineAnnealingWarmRestarts)."""

    _fields = ("init", "period", "min_value", "period_mult")

    def __init__(self, init, period: int, min_value=0.0, period_mult: int = 1):
        self._store(
            init=_number("Cosine", "init", init),
            period=_positive_int("Cosine", "period", period),
            min_value=_number("Cosine", "min_value", min_value),
            period_mult=_positive_int("Cosine", "period_mult", period_mult),
        )

    @property
    def _infinite(self) -> bool:  # restarts of growing length never end (unless all constant)
        return self.period_mult > 1 and self.init != self.min_value

    def _extent(self) -> int | None:
        return None if self._infinite else 1

    def _generate(self, horizon: int) -> Iterator[Piece]:
        if self.period_mult == 1:
            yield 0, _cosine_arc(self.init, self.min_value, self.period, 0)
            return
        start, period = 0, self.period
        while True:
            yield start, _cosine_arc(self.init, self.min_value, period, start)
            if start >= horizon:
                return
            start, period = start + period, period * self.period_mult


class Cyclic(Sequence):
    """Triangular cycles between ``base`` and ``max_value``: up in ``step_up`` steps, down in
    ``step_down`` (default: ``step_up``) (torch CyclicLR, mode "triangular")."""

    _fields = ("base", "max_value", "step_up", "step_down")

    def __init__(self, base, max_value, step_up: int, step_down: int | None = None):
        step_up = _positive_int("Cyclic", "step_up", step_up)
        self._store(
            base=_number("Cyclic", "base", base),
            max_value=_number("Cyclic", "max_value", max_value),
            step_up=step_up,
            step_down=step_up if step_down is None else _positive_int("Cyclic", "step_down", step_down),
        )

    def _generate(self, horizon: int) -> Iterator[Piece]:
        yield 0, _triangle(self.base, self.max_value, self.step_up, self.step_down, 0)


class Warmup(Sequence):
    """Linear warm-up from ``start`` to ``then(0)`` over ``steps`` steps, then ``then(t - steps)``:
    ``Warmup(5, MultiStep(0.1, [90, 135], 0.1))``."""

    _fields = ("steps", "then", "start")

    def __init__(self, steps: int, then, start=0.0):
        self._store(
            steps=_positive_int("Warmup", "steps", steps),
            then=as_sequence(then, "Warmup", "then"),
            start=_number("Warmup", "start", start),
        )
        if not self._is_template:  # the ramp computes then(0) - start
            _number("Warmup", "then(0)", self.then(0))

    @property
    def _infinite(self) -> bool:  # `then`'s form was cut at the horizon
        return self.then._horizon != math.inf

    def _extent(self) -> int | None:
        extent = self.then._extent()
        return None if extent is None else self.steps + extent

    def _generate(self, horizon: int) -> Iterator[Piece]:
        yield 0, _ramp(self.start, self.then(0), self.steps, 0)
        for start, primitive in self.then.pieces(max(horizon - self.steps, 1)):
            yield start + self.steps, primitive.shifted(self.steps)

    def _sample_params(self, rng: np.random.Generator) -> Sequence:
        if not self._is_template:
            return self
        return Warmup(sample(self.steps, rng), sample(self.then, rng), sample(self.start, rng))


class Piecewise(Sequence):
    """``a`` until ``m1``, then ``b(t - m1)`` until ``m2``, ...: ``Piecewise((0, a), (m1, b))``.

    Each part is a sequence or a plain value and restarts its own clock at its milestone, so a
    PBT lineage (explore from step m on) is exactly ``Piecewise((0, old), (m, new))``.
    """

    _fields = ("items",)

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
        milestones = _milestones("Piecewise", "milestones", [m for m, _ in parsed], first=0)
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

    def _sample_params(self, rng: np.random.Generator) -> Sequence:
        if not self._is_template:
            return self
        return Piecewise(*((m, sample(s, rng)) for m, s in self.items))


# --------------------------------------------------------------------------- comparison


def first_difference(a: Sequence, b: Sequence, lo: int, hi: int) -> int:
    """The first step in ``[lo, hi)`` where `a` and `b` take different values, or `hi`.

    Walks both canonical forms piece by piece; only where two pieces have different
    primitives are steps evaluated, and the scan stops at the first difference (almost always
    the first step of the piece). This is the exact comparison by value; ``==`` on sequences
    is a cheaper, coarser one (see `Sequence`).

    Raises a ValueError if `a` or `b` has a value that is not finite before `hi`: no prefix
    of such a sequence is trainable.
    """
    if lo >= hi:
        return hi
    a.check_finite(hi)
    if a is b:
        return hi
    b.check_finite(hi)
    pieces_a, pieces_b = a.pieces(hi), b.pieces(hi)
    i = bisect.bisect_right(pieces_a, lo, key=lambda piece: piece[0]) - 1
    j = bisect.bisect_right(pieces_b, lo, key=lambda piece: piece[0]) - 1
    x = lo
    while x < hi:
        end_a = pieces_a[i + 1][0] if i + 1 < len(pieces_a) else hi
        end_b = pieces_b[j + 1][0] if j + 1 < len(pieces_b) else hi
        y = min(end_a, end_b, hi)
        prim_a, prim_b = pieces_a[i][1], pieces_b[j][1]
        if prim_a != prim_b:
            for t in range(x, y):
                if not same_value(prim_a.value(t), prim_b.value(t)):
                    return t
        x = y
        if end_a == y:
            i += 1
        if end_b == y:
            j += 1
    return hi


def dumps(sequence: Sequence) -> str:
    """Canonical JSON text of a sequence (sorted keys, no spaces)."""
    return json.dumps(sequence.to_json(), sort_keys=True, separators=(",", ":"))
