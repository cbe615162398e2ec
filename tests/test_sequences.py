"""Sequences: semantics, torch equivalence, identity, serialization, comparison, validation."""

from __future__ import annotations

import itertools
import json
import math
import pickle
import random
import warnings

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from strategies import brute_first_difference, numeric_sequences, reference_value, sequences

import dagtune as dt
from dagtune import sequences as seqmod
from dagtune.sequences import first_difference, same_value

# ----------------------------------------------------------------------------- semantics


def values(seq, steps):
    return [seq(t) for t in steps]


def test_constant_keeps_value_and_type():
    assert values(dt.Constant(0.1), [0, 1, 10_000]) == [0.1, 0.1, 0.1]
    assert type(dt.Constant(128)(7)) is int
    assert dt.Constant("sgd")(3) == "sgd"
    assert dt.Constant(None)(3) is None
    assert dt.Constant(True)(3) is True


def test_steps_switches_at_each_milestone():
    seq = dt.Steps([128, 256], [70])
    assert values(seq, [0, 69, 70, 500]) == [128, 128, 256, 256]
    assert type(seq(70)) is int
    seq = dt.Steps(["a", "b", "c"], [2, 5])
    assert values(seq, [0, 1, 2, 4, 5, 99]) == ["a", "a", "b", "b", "c", "c"]


def test_multistep_is_init_times_gamma_to_the_milestones_passed():
    seq = dt.MultiStep(0.1, [30, 45], 0.1)
    once, twice = 0.1 * 0.1, 0.1 * 0.1**2
    assert values(seq, [0, 29, 30, 44, 45, 1000]) == [0.1, 0.1, once, once, twice, twice]
    ints = dt.MultiStep(1, [2, 4], 2)
    assert values(ints, [0, 1, 2, 3, 4]) == [1, 1, 2, 2, 4]
    assert type(ints(4)) is int
    # init * gamma**0 before the first milestone: an int init with a float gamma gives a float
    assert dt.MultiStep(1, [2], 0.1)(0) == 1.0 and type(dt.MultiStep(1, [2], 0.1)(0)) is float
    assert first_difference(dt.MultiStep(1, [5], 0.1), dt.Constant(1.0), 0, 10) == 5


def test_exponential():
    seq = dt.Exponential(0.1, 0.95)
    assert seq(0) == 0.1
    assert seq(3) == 0.1 * 0.95**3
    assert dt.Exponential(2, 3)(4) == 162 and type(dt.Exponential(2, 3)(4)) is int


def test_linear_ramps_then_holds_end():
    seq = dt.Linear(1.0, 0.0, 4)
    assert values(seq, [0, 1, 2, 3, 4, 100]) == [1.0, 0.75, 0.5, 0.25, 0.0, 0.0]
    ints = dt.Linear(0, 10, 5)
    assert ints(2) == 4.0 and type(ints(2)) is float  # start + (end-start)*t/steps is a float
    assert ints(5) == 10 and type(ints(5)) is int  # then `end` itself


def test_cosine_restarts_every_period():
    seq = dt.Cosine(1.0, 4)
    assert seq(0) == 1.0
    assert seq(1) == pytest.approx((1 + math.cos(math.pi / 4)) / 2, rel=1e-15)
    assert seq(2) == 0.5
    assert seq(4) == 1.0 and seq(6) == 0.5  # restart
    assert dt.Cosine(1.0, 4, min_value=0.1)(2) == pytest.approx(0.55, rel=1e-15)


def test_cosine_period_mult_lengthens_each_period():
    seq = dt.Cosine(1.0, 2, period_mult=2)  # periods [0, 2), [2, 6), [6, 14), [14, 30)
    assert values(seq, [0, 2, 4, 6, 10, 14, 22]) == [1.0, 1.0, 0.5, 1.0, 0.5, 1.0, 0.5]
    assert seq(1) == 0.5 and seq(13) < 0.05


def test_cyclic_triangle():
    seq = dt.Cyclic(0.0, 1.0, 2)
    assert values(seq, [0, 1, 2, 3, 4, 5, 6]) == [0.0, 0.5, 1.0, 0.5, 0.0, 0.5, 1.0]
    asym = dt.Cyclic(0.0, 1.0, 1, 3)
    assert values(asym, [0, 1, 4, 5]) == [0.0, 1.0, 0.0, 1.0]
    assert asym(2) == pytest.approx(2 / 3, rel=1e-15) and asym(3) == pytest.approx(1 / 3, rel=1e-15)


def test_warmup_ramps_to_then_at_zero_and_shifts_then():
    seq = dt.Warmup(4, dt.Constant(0.1))
    assert values(seq, [0, 2, 4, 100]) == [0.0, 0.05, 0.1, 0.1]
    assert seq(1) == pytest.approx(0.025, rel=1e-15)
    assert dt.Warmup(4, 0.1, start=0.02)(0) == 0.02
    step = dt.Warmup(2, dt.MultiStep(0.1, [3], 0.1))
    assert values(step, [0, 1, 2, 4, 5]) == [0.0, 0.05, 0.1, 0.1, 0.1 * 0.1]  # milestone 3 at t=5


def test_piecewise_restarts_each_part_clock():
    seq = dt.Piecewise((0, 0.1), (3, dt.Exponential(1.0, 0.5)), (6, "x"))
    assert values(seq, [0, 2, 3, 4, 5, 6, 50]) == [0.1, 0.1, 1.0, 0.5, 0.25, "x", "x"]


def test_equal_values_written_differently_have_equal_canonical_forms():
    assert dt.Exponential(0.1, 1.0).pieces(1000) == dt.Constant(0.1).pieces(1000)
    assert first_difference(dt.Exponential(0.1, 1.0), dt.Constant(0.1), 0, 10**6) == 10**6
    assert dt.MultiStep(0.1, [10], 1.0).pieces(50) == dt.Constant(0.1).pieces(50)
    assert dt.Steps([0.1, 0.1, 0.2], [5, 9]).pieces(50) == dt.Steps([0.1, 0.2], [9]).pieces(50)
    # type-aware: 128 is not 128.0
    assert first_difference(dt.Exponential(128, 1), dt.Constant(128), 0, 100) == 100
    assert first_difference(dt.Exponential(128, 1.0), dt.Constant(128), 0, 100) == 0


def test_step_must_be_a_non_negative_int():
    for bad in (-1, 1.0, True, "3"):
        with pytest.raises(ValueError, match="step"):
            dt.Constant(1)(bad)


@given(sequences, st.lists(st.integers(0, 400), min_size=1, max_size=12))
def test_values_match_the_formulas_in_any_query_order(seq, steps):
    # the canonical form is computed lazily and extended on demand; the order of queries
    # (short horizons first, then long ones) must not change any value
    for t in steps:
        expected = reference_value(seq, t)
        assert same_value(seq(t), expected), (seq, t, seq(t), expected)


@given(sequences, st.integers(1, 300))
def test_canonical_form_is_well_formed(seq, horizon):
    pieces = seq.pieces(horizon)
    starts = [s for s, _ in pieces]
    assert starts[0] == 0 and starts == sorted(set(starts))
    assert all(a[1] != b[1] for a, b in itertools.pairwise(pieces))


# ----------------------------------------------------------------------------- torch


def torch_lrs(make_scheduler, steps, base_lr=0.1, **optimizer_kwargs):
    """The learning rate torch uses at each of the first `steps` steps."""
    param = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([param], lr=base_lr, **optimizer_kwargs)
    scheduler = make_scheduler(optimizer)
    lrs = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(steps):
            lrs.append(optimizer.param_groups[0]["lr"])
            optimizer.step()
            scheduler.step()
    assert all(type(lr) is float for lr in lrs)
    return lrs


sched = torch.optim.lr_scheduler


def test_cosine_warm_restarts_matches_torch_exactly():
    # exact: torch evaluates the same closed form eta_min + (base - eta_min)*(1 + cos(pi*T_cur/T_i))/2
    for t_mult in (1, 2):
        ours = dt.Cosine(0.1, 20, min_value=0.001, period_mult=t_mult)
        theirs = torch_lrs(lambda o, m=t_mult: sched.CosineAnnealingWarmRestarts(o, 20, m, 0.001), 400)
        assert values(ours, range(400)) == theirs


def test_cyclic_matches_torch_exactly():
    # exact: torch's triangular CyclicLR is recomputed from last_epoch at every step
    for up, down in ((20, None), (7, 13)):
        ours = dt.Cyclic(0.001, 0.1, up, down)
        theirs = torch_lrs(
            lambda o, u=up, d=down: sched.CyclicLR(
                o, 0.001, 0.1, step_size_up=u, step_size_down=d, cycle_momentum=False
            ),
            400,
            base_lr=0.001,
        )
        assert values(ours, range(400)) == theirs


def test_multistep_matches_torch():
    # approx: torch multiplies the current lr by gamma at each milestone (chainable form),
    # dagtune computes init * gamma**k; (x*g)*g and x*g**2 may differ in the last bit (they
    # happen to agree for these milestones on this machine, which the test does not rely on)
    ours = dt.MultiStep(0.1, [90, 135, 200], 0.1)
    theirs = torch_lrs(lambda o: sched.MultiStepLR(o, [90, 135, 200], 0.1), 300)
    assert values(ours, range(300)) == pytest.approx(theirs, rel=1e-12)


def test_exponential_matches_torch():
    # approx: torch multiplies by gamma at every step, accumulating rounding
    ours = dt.Exponential(0.1, 0.95)
    theirs = torch_lrs(lambda o: sched.ExponentialLR(o, 0.95), 300)
    assert values(ours, range(300)) == pytest.approx(theirs, rel=1e-12)


def test_linear_matches_torch_linear_lr():
    # approx: torch's chainable LinearLR multiplies by a ratio at every step
    for start, end, iters in ((0.25, 1.0, 50), (1.0, 0.1, 120)):
        ours = dt.Linear(start, end, iters)
        theirs = torch_lrs(lambda o, s=start, e=end, n=iters: sched.LinearLR(o, s, e, n), 300, base_lr=1.0)
        assert values(ours, range(300)) == pytest.approx(theirs, rel=1e-12)


def test_warmup_then_multistep_matches_torch_sequential_lr():
    # approx (chainable LinearLR). torch's SequentialLR restarts the second scheduler's clock at
    # the switch, like Warmup: MultiStep milestones count from the end of the warm-up, so
    # Warmup(5, MultiStep(0.1, [90, 135], 0.1)) decays at absolute steps 95 and 140
    ours = dt.Warmup(5, dt.MultiStep(0.1, [90, 135], 0.1), start=0.02)
    theirs = torch_lrs(
        lambda o: sched.SequentialLR(
            o, [sched.LinearLR(o, 0.2, 1.0, 5), sched.MultiStepLR(o, [90, 135], 0.1)], milestones=[5]
        ),
        300,
    )
    assert values(ours, range(300)) == pytest.approx(theirs, rel=1e-12)
    assert ours(94) == 0.1 and ours(95) < 0.1


# ----------------------------------------------------------------------------- identity


def test_sequences_are_immutable():
    ms = [30, 45]
    seq = dt.MultiStep(0.1, ms, 0.1)
    ms.append(60)  # the caller's list is not the sequence's
    assert seq.milestones == (30, 45)
    with pytest.raises(AttributeError):
        seq.gamma = 0.5
    with pytest.raises(AttributeError):
        del seq.gamma
    assert seq(50) == 0.1 * 0.1**2


def test_equality_and_hash_are_typed():
    assert dt.Constant(128) != dt.Constant(128.0)
    assert dt.Constant(1) != dt.Constant(True)
    assert dt.Steps([128, 256], [70]) == dt.Steps((128, 256), (70,))
    assert hash(dt.Steps([128, 256], [70])) == hash(dt.Steps((128, 256), (70,)))
    assert dt.Steps([128, 256], [70]) != dt.Steps([128, 256.0], [70])
    assert dt.Warmup(5, dt.Constant(1)) != dt.Warmup(5, dt.Constant(1.0))
    assert len({dt.Constant(1), dt.Constant(1.0), dt.Constant(True), dt.Constant(1)}) == 3
    assert dt.Constant(-0.0) == dt.Constant(0.0)


@given(sequences)
def test_repr_round_trips(seq):
    again = eval(repr(seq), vars(dt))
    assert again == seq and hash(again) == hash(seq) and repr(again) == repr(seq)
    assert again.pieces(200) == seq.pieces(200)


@given(sequences)
def test_json_round_trips(seq):
    text = json.dumps(seq.to_json())
    again = dt.Sequence.from_json(json.loads(text))
    assert again == seq and hash(again) == hash(seq)
    assert seqmod.dumps(again) == seqmod.dumps(seq)
    assert [again(t) for t in range(0, 120, 7)] == [seq(t) for t in range(0, 120, 7)]


@given(sequences)
def test_pickle_round_trips(seq):
    seq.pieces(50)  # a filled cache must not leak into the copy
    again = pickle.loads(pickle.dumps(seq))
    assert again == seq and all(same_value(again(t), seq(t)) for t in (0, 49, 100))


def test_from_json_rejects_garbage():
    for bad in ({"type": "Nope"}, [1], {"value": 1}):
        with pytest.raises(ValueError, match="not a serialized dagtune sequence"):
            dt.Sequence.from_json(bad)


@pytest.mark.parametrize(
    ("data", "match"),
    [
        ({"type": "MultiStep", "init": 0.1}, r"serialized MultiStep is missing field 'milestones'"),
        ({"type": "MultiStep", "init": 0.1, "milestones": [3]}, r"MultiStep is missing field 'gamma'"),
        ({"type": "Constant"}, r"serialized Constant is missing field 'value'"),
        ({"type": "Piecewise"}, r"serialized Piecewise is missing field 'items'"),
        (
            {"type": "Warmup", "steps": 3, "then": {"type": "Linear", "start": 0.1, "end": 0.0}},
            r"serialized Linear is missing field 'steps'",
        ),
        (
            {"type": "Constant", "value": 1, "valeu": 2},
            r"serialized Constant has an unexpected field 'valeu'",
        ),
        ({"type": "Piecewise", "items": 3}, r"Piecewise\.items must be a list of \[milestone, sequence\]"),
        (
            {"type": "Piecewise", "items": [[0]]},
            r"Piecewise\.items must be a list of \[milestone, sequence\]",
        ),
    ],
)
def test_from_json_names_the_type_and_the_bad_field(data, match):
    with pytest.raises(ValueError, match=match):
        dt.Sequence.from_json(data)


def test_from_json_fills_fields_that_have_a_default():
    assert dt.Sequence.from_json({"type": "Cosine", "init": 0.1, "period": 10}) == dt.Cosine(0.1, 10)
    assert dt.Sequence.from_json(
        {"type": "Cyclic", "base": 0.0, "max_value": 1.0, "step_up": 2}
    ) == dt.Cyclic(0.0, 1.0, 2, 2)


def test_template_cannot_be_evaluated_or_serialized():
    seq = dt.MultiStep(dt.loguniform(1e-3, 1e-1), [30], 0.1)
    with pytest.raises(ValueError, match="distribution"):
        seq(0)
    with pytest.raises(ValueError, match="distribution"):
        seq.to_json()


# ----------------------------------------------------------------------------- comparison


@given(sequences, sequences, st.integers(0, 120), st.integers(0, 120))
def test_first_difference_matches_brute_force(a, b, lo, width):
    hi = lo + width
    assert first_difference(a, b, lo, hi) == brute_first_difference(a, b, lo, hi)


@given(numeric_sequences, st.integers(0, 60), st.integers(1, 60), st.integers(0, 120))
def test_first_difference_finds_a_change_inside_a_long_agreement(seq, at, width, extra):
    # the same sequence up to `at`, something else after: the change is found exactly
    other = dt.Piecewise((0, seq), (at + 1, dt.Constant("changed")))
    hi = at + 1 + width + extra
    assert first_difference(seq, other, 0, hi) == at + 1
    assert first_difference(other, seq, at + 1, hi) == at + 1
    assert first_difference(seq, other, 0, at + 1) == at + 1


@pytest.fixture
def count_evaluations(monkeypatch):
    """Counts every evaluation of a canonical-form primitive."""
    counter = {"n": 0}
    for cls in (seqmod._Const, seqmod._Geometric, seqmod._Ramp, seqmod._CosineArc, seqmod._Triangle):
        original = cls.value

        def counted(self, t, _original=original):
            counter["n"] += 1
            return _original(self, t)

        monkeypatch.setattr(cls, "value", counted)
    return counter


def test_long_schedule_comparison_evaluates_few_steps(count_evaluations):
    bert = dt.Warmup(3000, dt.Linear(5e-5, 0, 27000))
    cases = [
        # equal values written differently: zero evaluations
        (dt.Piecewise((0, dt.Linear(0.0, 5e-5, 3000)), (3000, dt.Linear(5e-5, 0, 27000))), 30000),
        (dt.Warmup(3000, dt.Linear(5e-5, 0, 27000)), 30000),
        # differences: found at the first step of the differing piece
        (dt.Linear(5e-5, 0, 30000), 0),
        (dt.Warmup(3000, dt.Linear(5e-5, 1e-6, 27000)), 3001),
        (dt.Warmup(3000, dt.Linear(5e-5, 0, 20000)), 3001),
        (dt.Warmup(3000, dt.Linear(5e-5, 0, 27000), start=1e-7), 0),
    ]
    for other, expected in cases:
        bert.pieces(30000), other.pieces(30000)  # building a canonical form may evaluate then(0)
        count_evaluations["n"] = 0
        assert first_difference(bert, other, 0, 30000) == expected
        if expected == 30000:  # equal primitives are never evaluated
            assert count_evaluations["n"] == 0, other
        else:  # the counter works, and only the first steps of the differing piece are evaluated
            assert 1 <= count_evaluations["n"] <= 6, (other, count_evaluations["n"])


def test_comparison_cost_does_not_grow_with_the_horizon(count_evaluations):
    a = dt.Piecewise((0, dt.Cosine(0.1, 50)), (10_000, dt.Exponential(0.1, 0.999)))
    b = dt.Piecewise((0, dt.Cosine(0.1, 50)), (10_000, dt.Exponential(0.1, 0.99)))
    a.pieces(10**6), b.pieces(10**6)
    count_evaluations["n"] = 0
    assert first_difference(a, b, 0, 10**6) == 10_001
    assert 1 <= count_evaluations["n"] <= 4


def test_sequences_agree_after_random_query_orders():
    # regression: a short query first used to freeze the canonical form of a Piecewise
    # (and of anything wrapping it) before its later parts
    p = dt.Piecewise((0, 1.0), (100, 2.0))
    assert p(5) == 1.0 and p(150) == 2.0
    w = dt.Warmup(5, dt.Piecewise((0, 1.0), (100, 2.0)))
    assert w(10) == 1.0 and w(200) == 2.0
    nested = dt.Piecewise((0, dt.Warmup(2, dt.Piecewise((0, 1.0), (300, 3.0)))), (1000, 4.0))
    rng = random.Random(0)
    steps = [rng.randrange(2000) for _ in range(200)]
    assert [nested(t) for t in steps] == [reference_value(nested, t) for t in steps]


# ----------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: dt.Linear(1.0, 0.0, 0), r"Linear\.steps must be positive, got 0"),
        (lambda: dt.Linear(1.0, 0.0, -3), r"Linear\.steps must be positive, got -3"),
        (lambda: dt.Linear(1.0, 0.0, 2.5), r"Linear\.steps must be a positive int, got 2\.5"),
        (lambda: dt.Cosine(0.1, 0), r"Cosine\.period must be positive, got 0"),
        (lambda: dt.Cosine(0.1, 10, period_mult=0), r"Cosine\.period_mult must be positive, got 0"),
        (lambda: dt.Cyclic(0.0, 1.0, -1), r"Cyclic\.step_up must be positive, got -1"),
        (lambda: dt.Cyclic(0.0, 1.0, 2, 0), r"Cyclic\.step_down must be positive, got 0"),
        (lambda: dt.Warmup(0, 0.1), r"Warmup\.steps must be positive, got 0"),
        (
            lambda: dt.MultiStep(0.1, [45, 30], 0.1),
            r"MultiStep\.milestones must be strictly incr.*\[45, 30\]",
        ),
        (
            lambda: dt.MultiStep(0.1, [30, 30], 0.1),
            r"MultiStep\.milestones must be strictly incr.*\[30, 30\]",
        ),
        (lambda: dt.MultiStep(0.1, [0, 30], 0.1), r"MultiStep\.milestones must start at 1.*\[0, 30\]"),
        (lambda: dt.MultiStep(0.1, [30.5], 0.1), r"MultiStep\.milestones must hold ints.*30\.5"),
        (lambda: dt.MultiStep(0.1, 30, 0.1), r"MultiStep\.milestones must be a list of ints, got 30"),
        (lambda: dt.Steps([1, 2], [5, 6]), r"Steps\.values must have one more entry.*2 values.*\[5, 6\]"),
        (lambda: dt.Steps([1, 2, 3], [5]), r"Steps\.values must have one more entry.*3 values.*\[5\]"),
        (lambda: dt.Steps([1, 2], [-5]), r"Steps\.milestones must start at 1.*\[-5\]"),
        (lambda: dt.Constant(float("nan")), r"Constant\.value must be finite, got nan"),
        (lambda: dt.Exponential(float("inf"), 0.9), r"Exponential\.init must be finite, got inf"),
        (lambda: dt.Exponential(0.1, float("-inf")), r"Exponential\.gamma must be finite, got -inf"),
        (lambda: dt.Steps([1.0, float("nan")], [3]), r"Steps\.values must be finite, got nan"),
        (lambda: dt.Constant([1, 2]), r"Constant\.value must be a JSON scalar.*\[1, 2\]"),
        (lambda: dt.MultiStep("a", [3], 0.1), r"MultiStep\.init must be a number, got 'a'"),
        (lambda: dt.Warmup(5, "sgd"), r"Warmup\.then\(0\) must be a number, got 'sgd'"),
        (lambda: dt.Warmup(5, dt.Steps([True, 0.1], [3])), r"Warmup\.then\(0\) must be a number, got True"),
        (lambda: dt.Piecewise(), r"Piecewise needs at least one"),
        (lambda: dt.Piecewise((5, 0.1)), r"Piecewise\.milestones must start at 0, got \[5\]"),
        (lambda: dt.Piecewise((0, 0.1), (0, 0.2)), r"Piecewise\.milestones must be strictly increasing"),
        (lambda: dt.Piecewise((0, 0.1, 3)), r"Piecewise items must be \(milestone, sequence\) pairs"),
    ],
)
def test_bad_input_raises_value_error_naming_field_and_value(make, match):
    with pytest.raises(ValueError, match=match):
        make()
