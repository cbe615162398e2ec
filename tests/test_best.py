"""The best trial has one definition (`dagtune.summary.best_of`): `Result.best`, the progress
line, the page and the command line agree on it, non-finite values included."""

from __future__ import annotations

import math

import pytest

from dagtune.config import normalize_config
from dagtune.records import COMPLETED, DIVERGED, PENDING, Trial
from dagtune.study import Result
from dagtune.summary import best_of


def _trial(trial_id: int, value: float, status: str = COMPLETED, steps: int = 4) -> Trial:
    config = normalize_config({"lr": 0.1 * (trial_id + 1)})
    return Trial(trial_id, config, steps, status=status, metrics={"acc": value}, reported=steps)


def _both(trials: list[Trial], mode: str) -> tuple[int | None, int | None]:
    """The best trial's id as `best_of` and as `Result.best` see it."""
    found = best_of(trials, "acc", mode)
    best = Result(trials, {}, "acc", mode).best
    return (None if found is None else found.id), (None if best is None else best.id)


@pytest.mark.parametrize("mode", ["max", "min"])
@pytest.mark.parametrize("odd", [math.inf, -math.inf, math.nan])
def test_a_non_finite_value_is_never_the_best(mode, odd):
    trials = [_trial(0, 0.5), _trial(1, odd, DIVERGED), _trial(2, 0.7), _trial(3, odd)]
    expected = 2 if mode == "max" else 0
    assert _both(trials, mode) == (expected, expected)


@pytest.mark.parametrize("odd", [math.inf, -math.inf, math.nan])
def test_only_non_finite_values_give_no_best(odd):
    trials = [_trial(0, odd), _trial(1, odd, DIVERGED)]
    assert _both(trials, "max") == (None, None)
    assert Result(trials, {}, "acc", "max").best is None


def test_completed_trials_come_first_then_the_longest_then_the_first():
    trials = [
        _trial(0, 0.9, PENDING),
        _trial(1, 0.5, steps=2),
        _trial(2, 0.5, steps=6),
        _trial(3, 0.5, steps=6),
    ]
    assert _both(trials, "max") == (2, 2)
    assert _both(trials[:1], "max") == (0, 0)  # no completed trial: the pending one
