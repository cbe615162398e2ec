"""The canonical primitives: closed-form functions of the step that every sequence compiles to.

A sequence's canonical form is a list of ``(start, primitive)`` pieces. Primitives are
canonical, so that sequences equal by value but written differently meet as equal primitives
rather than being compared step by step: a primitive whose value does not depend on the step
is a `Const` (the `geometric_pieces`, `ramp`, `cosine_arc` and `triangle` constructors see
to it).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Iterator

from dagtune.sequences._checks import Scalar, computed, is_finite, typed

__all__ = [
    "Bounded",
    "Const",
    "CosineArc",
    "Geometric",
    "Piece",
    "Primitive",
    "Ramp",
    "Triangle",
    "cosine_arc",
    "geometric_pieces",
    "ramp",
    "triangle",
]


class Primitive(ABC):
    """A closed-form function of the absolute step; the unit of the canonical form.

    Primitives are canonical: two equal primitives take equal values at every step, and a
    primitive whose values do not depend on the step is a `Const` (see the ``cosine_arc``,
    ``triangle``, ``geometric_pieces`` and ``ramp`` constructors).
    """

    __slots__ = ()

    @abstractmethod
    def value(self, t: int) -> Scalar: ...

    @abstractmethod
    def shifted(self, by: int) -> Primitive:
        """The same function moved `by` steps later."""

    @abstractmethod
    def _key(self) -> tuple: ...

    def finite_at(self, t: int) -> bool:
        try:
            return is_finite(self.value(t))
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
        return f"{type(self).__name__}{self._key()[1:]}"


class Const(Primitive):
    __slots__ = ("v",)

    def __init__(self, v: Scalar):
        self.v = v

    def value(self, t: int) -> Scalar:
        return self.v

    def shifted(self, by: int) -> Const:
        return self

    def first_nonfinite(self, lo: int, hi: int) -> int | None:
        return None if is_finite(self.v) else lo

    def _key(self) -> tuple:
        return ("const", typed(self.v))


class Geometric(Primitive):
    """``init * gamma ** (t - origin)``."""

    __slots__ = ("init", "gamma", "origin")

    def __init__(self, init, gamma, origin: int):
        self.init, self.gamma, self.origin = init, gamma, origin

    def value(self, t: int) -> float:
        return self.init * self.gamma ** (t - self.origin)

    def shifted(self, by: int) -> Geometric:
        return Geometric(self.init, self.gamma, self.origin + by)

    def _key(self) -> tuple:
        return ("geometric", typed(self.init), typed(self.gamma), self.origin)


def geometric_pieces(init, gamma, origin: int) -> Iterator[Piece]:
    """``init * gamma ** (t - origin)`` from `origin` on, with the degenerate cases constant:
    ``gamma == 1`` and ``init == 0`` (the same value at every step, ``0.0 * g**k`` being
    ``0.0`` or ``-0.0``, which are one value), and ``gamma == 0`` (``init`` once, then
    ``init * 0``). The constant has the type every step has (``1 * 0.5**k`` is a float)."""
    if gamma == 1 or init == 0:
        yield origin, Const(computed(lambda: init * gamma**0))
    elif gamma == 0:
        yield origin, Const(computed(lambda: init * gamma**0))
        yield origin + 1, Const(computed(lambda: init * gamma**1))
    else:
        yield origin, Geometric(init, gamma, origin)


class Ramp(Primitive):
    """``start + (end - start) * (t - origin) / length``."""

    __slots__ = ("start", "end", "length", "origin")

    def __init__(self, start, end, length: int, origin: int):
        self.start, self.end, self.length, self.origin = start, end, length, origin

    def value(self, t: int) -> float:
        return self.start + (self.end - self.start) * (t - self.origin) / self.length

    def shifted(self, by: int) -> Ramp:
        return Ramp(self.start, self.end, self.length, self.origin + by)

    def _key(self) -> tuple:
        return ("ramp", typed(self.start), typed(self.end), self.length, self.origin)


def ramp(start, end, length: int, origin: int) -> Primitive:
    if start == end:  # (end - start) * k / length is 0.0 at every step
        return Const(computed(lambda: start + (end - start) * 0 / length))
    return Ramp(start, end, length, origin)


class Bounded(Primitive):
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
            if is_finite(self._peak()):
                return None
        except OverflowError:
            pass
        # values within an ulp of the largest float: look through one cycle, step by step
        return next((t for t in range(lo, min(hi, lo + self._cycle())) if not self.finite_at(t)), None)


class CosineArc(Bounded):
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

    def shifted(self, by: int) -> CosineArc:
        return CosineArc(self.high, self.low, self.period, self.origin + by)

    def _peak(self) -> Scalar:
        return self.low + (self.high - self.low) * (1 + 1.0) / 2

    def _cycle(self) -> int:
        return self.period

    def _key(self) -> tuple:
        return ("cosine", typed(self.high), typed(self.low), self.period, self.origin)


def cosine_arc(high, low, period: int, origin: int) -> Primitive:
    # equal ends: low + 0.0 at every step; a period of 1 step: always the top of the arc
    if high == low or period == 1:
        return Const(computed(lambda: low + (high - low) * (1 + 1.0) / 2))
    return CosineArc(high, low, period, origin)


class Triangle(Bounded):
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

    def shifted(self, by: int) -> Triangle:
        return Triangle(self.base, self.peak, self.up, self.down, self.origin + by)

    def _peak(self) -> Scalar:
        return self.base + (self.peak - self.base) * 1.0 * 1.0

    def _cycle(self) -> int:
        return self.up + self.down

    def _key(self) -> tuple:
        return ("triangle", typed(self.base), typed(self.peak), self.up, self.down, self.origin)


def triangle(base, peak, up: int, down: int, origin: int) -> Primitive:
    if base == peak:  # base + 0.0 at every step
        return Const(computed(lambda: base + (peak - base) * 0.0 * 1.0))
    return Triangle(base, peak, up, down, origin)


Piece = tuple[int, Primitive]
