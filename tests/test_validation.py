"""One check for ints and ranges (`dagtune.validation`): errors name the field and the value."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest

import dagtune as dt
from dagtune.validation import InvalidValueError, check_int, check_number, is_int, is_number

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(
    ("kwargs", "value", "message"),
    [
        ({}, True, "eta must be an int, got True"),
        ({}, 2.0, "eta must be an int, got 2.0"),
        ({}, np.int64(3), r"eta must be an int, got np\.int64\(3\)"),
        ({"minimum": 1}, 0, "eta must be a positive int, got 0"),
        ({"minimum": 2}, 1, "eta must be an int >= 2, got 1"),
        ({"maximum": 5}, 6, "eta must be an int <= 5, got 6"),
        ({"minimum": 0, "maximum": 3}, 4, "eta must be an int from 0 to 3, got 4"),
        ({"minimum": 1, "optional": True}, "x", "eta must be a positive int or None, got 'x'"),
        ({"minimum": 0, "note": "0: none"}, -1, r"eta must be an int >= 0 \(0: none\), got -1"),
        ({"expected": "an int in [0, 2**64)"}, 1.5, r"eta must be an int in \[0, 2\*\*64\), got 1.5"),
    ],
)
def test_check_int_names_the_field_the_rule_and_the_value(kwargs, value, message):
    with pytest.raises(InvalidValueError, match=f"^{message}$"):
        check_int("eta", value, **kwargs)


def test_check_int_gives_the_value_back_and_takes_none_when_optional():
    assert check_int("n", 3, minimum=1, maximum=3) == 3
    assert check_int("n", None, optional=True) is None
    with pytest.raises(ValueError, match="n must be an int, got None"):
        check_int("n", None)


def test_check_number_takes_finite_numbers_in_range():
    assert check_number("lr", 0.5, above=0) == 0.5
    assert check_number("xi", math.inf, minimum=0, finite=False) == math.inf
    for value, message in [
        (0, "lr must be a positive number, got 0"),
        (math.nan, "lr must be a positive number, got nan"),
        (math.inf, "lr must be a positive number, got inf"),
        (True, "lr must be a positive number, got True"),
    ]:
        with pytest.raises(InvalidValueError, match=f"^{message}$"):
            check_number("lr", value, above=0)
    with pytest.raises(InvalidValueError, match=r"xi must be a number >= 0, got nan"):
        check_number("xi", math.nan, minimum=0, finite=False)


def test_the_predicates_refuse_bools():
    assert is_int(3) and not is_int(True) and not is_int(3.0)
    assert is_number(3) and is_number(0.5) and not is_number(False) and not is_number("1")


def test_an_invalid_value_is_a_value_error_and_a_dagtune_error():
    assert issubclass(InvalidValueError, ValueError) and issubclass(InvalidValueError, dt.DagtuneError)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: dt.Linear(1.0, 0.0, True), r"Linear\.steps must be a positive int, got True"),
        (lambda: dt.Random({"lr": 0.1}, n=0), r"Random\.n must be a positive int or None, got 0"),
        (lambda: dt.run_alone(object, {}, steps=False), "steps must be a positive int, got False"),
        (lambda: dt.Constant(0.1)(True), "step must be an int >= 0, got True"),
    ],
)
def test_the_public_checks_go_through_it(make, message):
    with pytest.raises(InvalidValueError, match=message):
        make()


def test_the_int_but_not_bool_check_is_written_once():
    hand_written = re.compile(r"isinstance\((\S+), bool\) or not isinstance\(\1, int\)")
    found = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in sorted((ROOT / "dagtune").rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if hand_written.search(line)
    ]
    assert not found, f"use dagtune.validation.check_int: {found}"
