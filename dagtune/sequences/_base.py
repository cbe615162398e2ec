"""The `Sequence` base: canonical form, equality, values, finiteness, JSON; and the exact
comparison of two sequences by value (`first_difference`)."""

from __future__ import annotations

import bisect
import inspect
import json
import math
from abc import ABC, abstractmethod
from collections.abc import Iterator
from typing import Any, ClassVar

import numpy as np

from dagtune.distributions import contains_distribution, sample
from dagtune.sequences._checks import Scalar, computed, is_finite, same_value, typed
from dagtune.sequences._primitives import Piece
from dagtune.validation import check_int

__all__ = ["Sequence", "dumps", "first_difference"]


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
    # every config of a study holds its sequences: no __dict__ per instance (a subclass lists
    # its `_fields` as its own slots; one that doesn't gets a __dict__ and works the same)
    __slots__ = ("is_template", "_pieces", "_horizon", "_checked", "_nonfinite", "_identity", "_hash")
    #: whether an argument still holds a distribution (a template for random search)
    is_template: bool
    _registry: ClassVar[dict[str, type[Sequence]]] = {}

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        Sequence._registry[cls.__name__] = cls

    #: where a new sequence's canonical form is known up to (`Constant`: whole, made when asked)
    _first_horizon: ClassVar[float] = 0

    def _store(self, **values: Any) -> None:
        for name, value in values.items():
            object.__setattr__(self, name, value)
        # a template: an argument still holds a distribution (`dt.uniform`, ...), so the
        # sequence has no value until `sample_distributions` draws one
        _blank(self, contains_distribution(tuple(self.arguments().values())))

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable")

    def __getstate__(self) -> tuple[tuple[Any, ...], bool]:
        """Its arguments in `_fields` order and whether it is a template: what a copy needs
        (its caches are made again when asked). A study's resume state holds a sequence or
        two per trial (`dagtune.resume_state`), so making one back is a few attribute sets,
        not a walk of its arguments."""
        return tuple(getattr(self, name) for name in self._fields), self.is_template

    def __setstate__(self, state: tuple[tuple[Any, ...], bool] | dict) -> None:
        if isinstance(state, dict):  # pickled by an earlier dagtune: its arguments by name
            self._store(**state)
            return
        arguments, template = state
        for name, value in zip(self._fields, arguments, strict=True):
            object.__setattr__(self, name, value)
        _blank(self, template)

    def arguments(self) -> dict[str, Any]:
        """The arguments the sequence was written with, by name, in order."""
        return {name: getattr(self, name) for name in self._fields}

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
            extent = None if self.is_template else self._extent()
            if extent is None:
                key = ("written", type(self).__name__, typed(tuple(self.arguments().values())))
            else:
                key = ("pieces", self.pieces(extent))
            object.__setattr__(self, "_identity", key)
        return self._identity

    def _extent(self) -> int | None:
        """A horizon past which the canonical form has no new piece, or None if it has new
        pieces forever. The default: the form is one piece."""
        return 1

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(_repr_arg(a) for a in tuple(self.arguments().values()))})"

    # ---- values

    def __call__(self, t: int) -> Scalar:
        """The value at step `t` (t >= 0); a ValueError if it is not finite."""
        if type(t) is not int or t < 0:  # a plain step count needs no conversion or check
            if isinstance(t, np.integer):
                t = int(t)
            check_int("step", t, minimum=0)
        value = self._computed_value(t)
        if not is_finite(value):
            raise self._nonfinite_error(t, value)
        return value

    def _computed_value(self, t: int) -> Any:
        """The value at `t` as computed, ``inf`` where the arithmetic overflows."""
        pieces = self.pieces(t + 1)
        index = bisect.bisect_right(pieces, t, key=lambda piece: piece[0]) - 1
        return computed(lambda: pieces[index][1].value(t))

    def _nonfinite_error(self, t: int, value: Any) -> ValueError:
        what = "overflows" if value == math.inf else f"is {value!r}"
        return ValueError(f"{self!r} has no finite value at step {t} (its value {what})")

    def values(self, start: int, stop: int) -> list[Scalar]:
        """Values at steps ``start, ..., stop - 1``."""
        return [self(t) for t in range(start, stop)]

    def pieces(self, horizon: int) -> tuple[Piece, ...]:
        """The canonical form over at least ``[0, horizon)``: ``(start, primitive)`` pairs with
        increasing starts, the first at 0, no two neighbours equal."""
        if self.is_template:
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
        if self.is_template:
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

    def sample_distributions(self, rng: np.random.Generator) -> Sequence:
        """This sequence with every distribution in its arguments drawn from `rng` (itself
        when it holds none)."""
        if not self.is_template:
            return self
        return type(self)(*sample(tuple(self.arguments().values()), rng))


def _blank(sequence: Sequence, template: bool) -> None:
    """Set `sequence`'s `is_template` and empty its caches (what it computed of itself)."""
    setter = object.__setattr__
    setter(sequence, "is_template", template)
    setter(sequence, "_pieces", ())
    setter(sequence, "_horizon", sequence._first_horizon)
    setter(sequence, "_checked", 0)
    setter(sequence, "_nonfinite", None)
    setter(sequence, "_identity", None)
    setter(sequence, "_hash", None)


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
