"""Shared hypothesis strategies and brute-force references for the core tests.

`reference_value` evaluates a sequence straight from the formulas of docs/DESIGN.md, without the
canonical piecewise form, so the tests compare two independent computations.
"""

from __future__ import annotations

import bisect
import math

from hypothesis import settings
from hypothesis import strategies as st

import dagtune as dt
from dagtune.sequences import same_value

# ----------------------------------------------------------------------------- values

# few distinct values, so that sequences written differently often agree
NUMBERS = st.sampled_from([0.1, 0.05, 0.01, 0.0, 1.0, 0.5, 1, 2, 0, 128])
FLOATS = st.sampled_from([0.1, 0.05, 0.01, 1.0, 0.5])
GAMMAS = st.sampled_from([0.1, 0.5, 0.9, 1, 1.0, 2, 0, 0.0, -0.5])
SCALARS = st.one_of(NUMBERS, st.sampled_from(["sgd", "adam", True, False, None, 256]))


def milestones(lo: int = 1, hi: int = 40, max_size: int = 3):
    return st.lists(st.integers(lo, hi), max_size=max_size, unique=True).map(sorted)


def _steps(values, hi):
    return milestones(1, hi).flatmap(
        lambda ms: st.lists(values, min_size=len(ms) + 1, max_size=len(ms) + 1).map(
            lambda vs: dt.Steps(vs, ms)
        )
    )


def _leaf_numeric(hi):
    return st.one_of(
        NUMBERS.map(dt.Constant),
        _steps(NUMBERS, hi),
        st.builds(dt.MultiStep, NUMBERS, milestones(1, hi), GAMMAS),
        st.builds(dt.Exponential, NUMBERS, GAMMAS),
        st.builds(dt.Linear, NUMBERS, NUMBERS, st.integers(1, 20)),
        st.builds(dt.Cosine, FLOATS, st.integers(1, 12), st.sampled_from([0.0, 0.01]), st.integers(1, 3)),
        st.builds(dt.Cyclic, FLOATS, FLOATS, st.integers(1, 8), st.one_of(st.none(), st.integers(1, 8))),
    )


def _piecewise(children, hi):
    return milestones(1, hi).flatmap(
        lambda ms: st.lists(children, min_size=len(ms) + 1, max_size=len(ms) + 1).map(
            lambda parts: dt.Piecewise(*zip([0, *ms], parts))
        )
    )


def numeric_sequence_strategy(hi: int):
    """Numeric sequences with milestones and switch points in [1, hi], nested up to two levels
    of Warmup/Piecewise."""

    def nest(children):
        return st.one_of(
            st.builds(dt.Warmup, st.integers(1, 10), children, st.sampled_from([0.0, 0.01, 0])),
            _piecewise(children, hi),
        )

    return st.recursive(_leaf_numeric(hi), nest, max_leaves=4)


def sequence_strategy(hi: int):
    """Any sequence: numeric ones, and constants/steps of strings, bools and None."""
    return st.one_of(
        numeric_sequence_strategy(hi),
        SCALARS.map(dt.Constant),
        _steps(SCALARS, hi),
        _piecewise(st.one_of(SCALARS.map(dt.Constant), _steps(SCALARS, hi)), hi),
    )


# milestones up to 200: beyond the first horizon the canonical form is computed for (64)
numeric_sequences = numeric_sequence_strategy(200)
sequences = sequence_strategy(200)


# ----------------------------------------------------------------------------- references


def reference_value(seq: dt.Sequence, t: int):
    """The value of `seq` at step `t`, computed from docs/DESIGN.md's formulas."""
    if isinstance(seq, dt.Constant):
        return seq.value
    if isinstance(seq, dt.Steps):
        return seq.values[bisect.bisect_right(seq.milestones, t)]
    if isinstance(seq, dt.MultiStep):
        return seq.init * seq.gamma ** bisect.bisect_right(seq.milestones, t)
    if isinstance(seq, dt.Exponential):
        return seq.init * seq.gamma**t
    if isinstance(seq, dt.Linear):
        return seq.start + (seq.end - seq.start) * t / seq.steps if t < seq.steps else seq.end
    if isinstance(seq, dt.Cosine):
        elapsed, period = t, seq.period
        while elapsed >= period:  # SGDR restarts
            elapsed, period = elapsed - period, period * seq.period_mult
        # torch's order of operations: (init - min) * (1 + cos) may overflow before the / 2
        return seq.min_value + (seq.init - seq.min_value) * (1 + math.cos(math.pi * elapsed / period)) / 2
    if isinstance(seq, dt.Cyclic):  # torch.optim.lr_scheduler.CyclicLR, mode "triangular"
        total = seq.step_up + seq.step_down
        ratio = seq.step_up / total
        cycle = math.floor(1 + t / total)
        x = 1.0 + t / total - cycle
        scale = x / ratio if x <= ratio else (x - 1) / (ratio - 1)
        return seq.base + (seq.max_value - seq.base) * scale * 1.0
    if isinstance(seq, dt.Warmup):
        if t < seq.steps:
            target = reference_value(seq.then, 0)
            return seq.start + (target - seq.start) * t / seq.steps
        return reference_value(seq.then, t - seq.steps)
    if isinstance(seq, dt.Piecewise):
        starts = [m for m, _ in seq.items]
        m, part = seq.items[bisect.bisect_right(starts, t) - 1]
        return reference_value(part, t - m)
    raise TypeError(f"no reference for {seq!r}")


def brute_first_difference(a: dt.Sequence, b: dt.Sequence, lo: int, hi: int) -> int:
    for t in range(lo, hi):
        if not same_value(reference_value(a, t), reference_value(b, t)):
            return t
    return hi


def typed(value):
    return (type(value).__name__, value)


def step_values(config: dict, t: int) -> tuple:
    """Every hyper-parameter's typed value at step `t` (sorted by name)."""
    return tuple((name, typed(reference_value(config[name], t))) for name in sorted(config))


def prefixes(config: dict, steps: int) -> list[tuple]:
    """``prefixes(c, n)[t]`` identifies the values of steps ``0..t-1`` (``t = 0..n``)."""
    out: list[tuple] = [()]
    for t in range(steps):
        out.append((out[-1], step_values(config, t)))
    return out


def brute_unique_steps(trials) -> int:
    """Distinct (prefix of values, step) pairs over all trials."""
    seen = set()
    for config, steps in trials:
        seen.update(prefixes(config, steps)[1:])
    return len(seen)


# ----------------------------------------------------------------------------- plans

# sequences over a short horizon whose values and switch points collide often, so that trials
# share prefixes, branch at the same steps, and sometimes are equal but written differently
PLAN_VALUES = st.sampled_from([0.1, 0.05, 0.01])
# switch points and trial lengths mostly from one small set, so that branches, requests and
# checkpoints often fall on the same step
PLAN_STEPS = st.sampled_from([5, 10, 15, 20]) | st.integers(1, 20)
PLAN_MILESTONES = st.lists(PLAN_STEPS, max_size=2, unique=True).map(sorted)
# (strategies are built once and never inside a draw: hypothesis recomputes the properties of
# every new strategy object, and that, not the tests, would dominate the run time)


def _plan_steps(a):
    milestones, values = a  # values padded/cut to one more than the milestones
    return dt.Steps((values * 3)[: len(milestones) + 1], milestones)


_plan_flat = st.one_of(
    PLAN_VALUES.map(dt.Constant),
    st.tuples(PLAN_MILESTONES, st.lists(PLAN_VALUES, min_size=1, max_size=3)).map(_plan_steps),
    st.builds(dt.MultiStep, PLAN_VALUES, PLAN_MILESTONES, st.sampled_from([0.5, 1.0])),
    st.builds(dt.Exponential, PLAN_VALUES, st.sampled_from([1.0, 0.5])),
    st.builds(dt.Warmup, st.integers(1, 4), PLAN_VALUES.map(dt.Constant)),
    st.builds(dt.Linear, PLAN_VALUES, PLAN_VALUES, st.integers(1, 12)),
    st.tuples(PLAN_STEPS, PLAN_VALUES, PLAN_VALUES).map(lambda a: dt.Piecewise((0, a[1]), (a[0], a[2]))),
)
# periodic sequences with short periods (several cycles within MAX_STEPS), sometimes
# degenerate (equal ends: constant) and sometimes with growing SGDR periods
PLAN_PERIODS = st.sampled_from([1, 2, 4, 5, 8])
_plan_periodic = st.one_of(
    st.builds(dt.Cosine, PLAN_VALUES, PLAN_PERIODS, st.sampled_from([0.0, 0.01]), st.sampled_from([1, 1, 2])),
    st.builds(dt.Cyclic, PLAN_VALUES, PLAN_VALUES, st.integers(1, 4), st.none() | st.integers(1, 4)),
    # a restart: at a multiple of the period it is the same sequence written differently
    st.tuples(PLAN_VALUES, PLAN_PERIODS, st.integers(1, 4), st.integers(0, 1)).map(
        lambda a: dt.Piecewise((0, dt.Cosine(a[0], a[1])), (a[1] * a[2] + a[3], dt.Cosine(a[0], a[1])))
    ),
    st.tuples(PLAN_VALUES, PLAN_VALUES, st.sampled_from([1, 2, 4]), st.integers(1, 4)).map(
        lambda a: dt.Piecewise(
            (0, dt.Cyclic(a[0], a[1], a[2])), (2 * a[2] * a[3], dt.Cyclic(a[0], a[1], a[2]))
        )
    ),
)


def _plan_nest(children):
    return st.one_of(
        st.builds(dt.Warmup, st.integers(1, 4), children, st.sampled_from([0.0, 0.01])),
        st.tuples(PLAN_STEPS, children, children).map(lambda a: dt.Piecewise((0, a[1]), (a[0], a[2]))),
    )


_plan_leaf = st.one_of(_plan_flat, _plan_periodic)
_plan_nested = _plan_nest(st.one_of(_plan_leaf, _plan_nest(_plan_leaf)))  # one or two levels
# mostly the flat sequences, whose prefixes collide most; periodic ones and nested
# Warmup/Piecewise of both often enough that every property sees them
plan_sequences = st.one_of(_plan_flat, _plan_periodic, _plan_nested)
NAME_SETS = [("lr",), ("bs", "lr"), ("bs", "lr", "mom")]
MAX_STEPS = 30
_TRIAL_STEPS = PLAN_STEPS | st.integers(1, MAX_STEPS)
_CONFIGS = {names: st.fixed_dictionaries({name: plan_sequences for name in names}) for names in NAME_SETS}
_TRIAL_LISTS: dict = {}


def trial_lists(min_size: int = 1, max_size: int = 10):
    """Trials ``(config, steps)`` naming the same hyper-parameters."""
    key = (min_size, max_size)
    if key not in _TRIAL_LISTS:
        _TRIAL_LISTS[key] = st.one_of(
            *(
                st.lists(st.tuples(config, _TRIAL_STEPS), min_size=min_size, max_size=max_size)
                for config in _CONFIGS.values()
            )
        )
    return _TRIAL_LISTS[key]


def more_examples(n: int = 300) -> settings:
    """Settings for the plan and tree properties, whose bugs need many examples to show: at
    least `n` examples, more under a profile asking for more."""
    return settings(max_examples=max(n, settings.default.max_examples))
