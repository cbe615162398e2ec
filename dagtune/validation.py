"""The one check of a count or a number a user gives: its type and its range, with an
error naming the field and the value.

An int here is an int and not a bool (``True`` is an int to Python, never a step count
to dagtune), and a number is an int or a float and not a bool; numpy scalars are neither,
as in every check dagtune made before this module. Each check returns the value, so a
constructor checks and stores in one line::

    self.eta = check_int("ASHA.eta", eta, minimum=2)
"""

from __future__ import annotations

import math
from typing import Any

from dagtune.errors import DagtuneError

__all__ = ["InvalidValueError", "check_int", "check_number", "is_int", "is_number"]


class InvalidValueError(DagtuneError, ValueError):
    """A value of the wrong type or out of range (a `ValueError`)."""


def is_int(value: Any) -> bool:
    """An int and not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    """An int or a float and not a bool (NaN and infinities included)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _range(kind: str, minimum: float | None, maximum: float | None, above: float | None) -> str:
    if above is not None:
        return f"a positive {kind}" if above == 0 and maximum is None else f"a {kind} > {above}"
    if minimum is not None and maximum is not None:
        return (
            f"an {kind} from {minimum} to {maximum}"
            if kind == "int"
            else f"a {kind} in [{minimum}, {maximum}]"
        )
    if minimum is not None:
        if minimum == 1 and kind == "int":
            return "a positive int"
        return f"{'an' if kind == 'int' else 'a'} {kind} >= {minimum}"
    if maximum is not None:
        return f"{'an' if kind == 'int' else 'a'} {kind} <= {maximum}"
    return "an int" if kind == "int" else f"a {kind}"


def _refuse(name: str, value: Any, expected: str, optional: bool, note: str | None) -> InvalidValueError:
    wanted = expected + (" or None" if optional else "") + (f" ({note})" if note else "")
    return InvalidValueError(f"{name} must be {wanted}, got {value!r}")


def check_int(
    name: str,
    value: Any,
    *,
    minimum: int | None = None,
    maximum: int | None = None,
    optional: bool = False,
    note: str | None = None,
    expected: str | None = None,
) -> Any:
    """`value` if it is an int (not a bool) in ``[minimum, maximum]`` (either bound may be
    left out), or None with `optional`; else an `InvalidValueError` such as ``ASHA.eta must
    be an int >= 2, got 1``. `note` adds why in brackets; `expected` replaces the wording of
    the range (``"an int in [0, 2**64)"``)."""
    if optional and value is None:
        return None
    if (
        not is_int(value)
        or (minimum is not None and value < minimum)
        or (maximum is not None and value > maximum)
    ):
        raise _refuse(name, value, expected or _range("int", minimum, maximum, None), optional, note)
    return value


def check_number(
    name: str,
    value: Any,
    *,
    minimum: float | None = None,
    above: float | None = None,
    maximum: float | None = None,
    optional: bool = False,
    finite: bool = True,
    note: str | None = None,
    expected: str | None = None,
) -> Any:
    """`value` if it is a finite number (an int or a float, not a bool) ``>= minimum`` or
    ``> above``, and ``<= maximum`` (each bound optional), or None with `optional`; else an
    `InvalidValueError` naming `name` and the value. With ``finite=False`` an infinity in
    range passes (NaN never does)."""
    if optional and value is None:
        return None
    if (
        not is_number(value)
        or math.isnan(value)
        or (finite and math.isinf(value))
        or (minimum is not None and not value >= minimum)
        or (above is not None and not value > above)
        or (maximum is not None and not value <= maximum)
    ):
        raise _refuse(name, value, expected or _range("number", minimum, maximum, above), optional, note)
    return value
