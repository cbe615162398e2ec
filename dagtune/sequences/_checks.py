"""The values a sequence takes and the checks of its arguments.

A value is a JSON scalar; equality of values is exact and type-aware (``128`` and ``128.0``
differ: a trainer may treat them differently). Arguments are checked where a sequence is
built, with a ValueError naming the sequence, the argument and the value.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from typing import Any, Union

import numpy as np

from dagtune.distributions import Distribution
from dagtune.validation import check_int, is_int

__all__ = [
    "SCALAR_TYPES",
    "Scalar",
    "check_milestones",
    "check_number",
    "check_positive_int",
    "check_scalar",
    "computed",
    "is_finite",
    "same_value",
    "typed",
]

Scalar = Union[int, float, str, bool, None]  # noqa: UP007 - a runtime alias on 3.10
SCALAR_TYPES = (bool, int, float, str, type(None))


def same_value(a: Scalar, b: Scalar) -> bool:
    """Exact, type-aware equality of two hyper-parameter values."""
    return type(a) is type(b) and a == b


def typed(value: Any) -> Any:
    """A key that makes equality type-aware (``1 != 1.0 != True``) and recurses into tuples."""
    if isinstance(value, tuple):
        return tuple(typed(item) for item in value)
    if isinstance(value, SCALAR_TYPES):
        return (type(value).__name__, value)
    return value


def check_scalar(owner: str, name: str, value: Any) -> Any:
    """A JSON scalar (or a distribution), checked; numpy scalars become Python ones."""
    if isinstance(value, Distribution):
        return value
    if isinstance(value, np.generic):
        value = value.item()
    if not isinstance(value, SCALAR_TYPES):
        raise ValueError(
            f"{owner}.{name} must be a JSON scalar (number, string, bool or None), got {value!r}"
        )
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{owner}.{name} must be finite, got {value!r}")
        if value == 0.0:
            value = 0.0  # -0.0 and 0.0 are one value
    return value


def check_number(owner: str, name: str, value: Any) -> Any:
    """A number (or a distribution), checked as `check_scalar` does."""
    value = check_scalar(owner, name, value)
    if isinstance(value, Distribution):
        return value
    if isinstance(value, (bool, str)) or value is None:
        raise ValueError(f"{owner}.{name} must be a number, got {value!r}")
    return value


def check_positive_int(owner: str, name: str, value: Any) -> Any:
    """An int > 0 (or a distribution); numpy ints become Python ones."""
    if isinstance(value, Distribution):
        return value
    if isinstance(value, np.integer):
        value = int(value)
    return check_int(f"{owner}.{name}", value, minimum=1)


def check_milestones(owner: str, name: str, values: Any, *, first: int = 1) -> tuple[int, ...]:
    """Strictly increasing ints, the first at least `first`."""
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
        raise ValueError(f"{owner}.{name} must be a list of ints, got {values!r}")
    values = tuple(values)
    for value in values:
        if isinstance(value, np.integer):
            value = int(value)
        if not is_int(value):
            raise ValueError(f"{owner}.{name} must hold ints, got {list(values)!r}")
    values = tuple(int(v) for v in values)
    if values and values[0] < first:
        raise ValueError(f"{owner}.{name} must start at {first} or later, got {list(values)!r}")
    if any(b <= a for a, b in itertools.pairwise(values)):
        raise ValueError(f"{owner}.{name} must be strictly increasing, got {list(values)!r}")
    return values


def is_finite(value: Any) -> bool:
    """Whether a value is finite (only a float can be infinite or NaN)."""
    return not isinstance(value, float) or math.isfinite(value)


def computed(compute: Callable[[], Any]) -> Any:
    """``compute()``, or ``inf`` where the arithmetic overflows (``10.0 ** 400`` raises)."""
    try:
        return compute()
    except OverflowError:
        return math.inf
