"""`quniform`, `qloguniform` and `normal`: validated, reproducible, usable inside sequences and
by the model-based algorithms."""

from __future__ import annotations

import statistics

import numpy as np
import pytest

import dagtune as dt
from dagtune.algos import BayesOpt, OptunaSampler
from dagtune.algos._params import NORMAL, ParamSpace
from dagtune.sim import SimulatedExecutor, SyntheticTrainer


def draws(distribution, n: int = 4000, seed: int = 0) -> list:
    rng = np.random.default_rng(seed)
    return [distribution.draw(rng) for _ in range(n)]


def test_quniform_draws_multiples_of_q_in_range_as_they_read():
    sizes = draws(dt.quniform(32, 256, 32))
    assert set(sizes) == {32, 64, 96, 128, 160, 192, 224, 256} and all(type(s) is int for s in sizes)
    rates = draws(dt.quniform(0.0, 0.5, 0.1))
    assert set(rates) == {0.0, 0.1, 0.2, 0.3, 0.4, 0.5}  # 0.3, not 0.30000000000000004
    inner = draws(dt.quniform(0.05, 0.52, 0.1))  # only the multiples inside [low, high]
    assert set(inner) == {0.1, 0.2, 0.3, 0.4, 0.5}
    counts = {v: inner.count(v) for v in set(inner)}
    assert min(counts.values()) > 400  # every multiple is drawn, the middle ones about equally


def test_qloguniform_is_log_uniform_then_rounded():
    values = draws(dt.qloguniform(1e-4, 1e-1, 1e-4))
    assert min(values) >= 1e-4 and max(values) <= 1e-1
    assert all(abs(v / 1e-4 - round(v / 1e-4)) < 1e-9 for v in values)
    assert abs(np.median(np.log10(values)) + 2.5) < 0.1
    assert set(draws(dt.qloguniform(1, 1000, 10), 200)) <= set(range(10, 1001, 10))


def test_normal_has_its_mean_and_sd():
    values = draws(dt.normal(2.0, 0.5), 20000)
    assert abs(statistics.fmean(values) - 2.0) < 0.02 and abs(statistics.stdev(values) - 0.5) < 0.02


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: dt.quniform(1, 0, 0.1), r"quniform.high must be greater than low, got low=1, high=0"),
        (lambda: dt.quniform(0, 1, 0), r"quniform.q must be positive, got 0"),
        (lambda: dt.quniform(0, "1", 0.1), r"quniform.high must be a number, got '1'"),
        (lambda: dt.quniform(0.01, 0.02, 0.1), r"quniform: no multiple of q=0.1 lies in \[low, high\]"),
        (lambda: dt.qloguniform(0, 1, 0.1), r"qloguniform.low must be positive, got 0"),
        (lambda: dt.qloguniform(1, float("inf"), 1), r"qloguniform.high must be finite, got inf"),
        (lambda: dt.normal(0, -1), r"normal.sd must be positive, got -1"),
        (lambda: dt.normal(True, 1), r"normal.mean must be a number, got True"),
    ],
)
def test_bad_arguments_name_the_field_and_value(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_they_are_comparable_hashable_and_reproducible_inside_sequences():
    assert dt.quniform(0, 1, 0.25) == dt.quniform(0, 1, 0.25) != dt.qloguniform(0.25, 1, 0.25)
    assert len({dt.normal(0, 1), dt.normal(0, 1), dt.normal(0, 2)}) == 2
    assert repr(dt.qloguniform(1e-4, 0.1, 1e-4)) == "qloguniform(0.0001, 0.1, 0.0001)"
    space = {
        "lr": dt.MultiStep(dt.qloguniform(1e-3, 1e-1, 1e-3), [3], 0.1),
        "batch_size": dt.Steps([dt.quniform(32, 128, 32), 256], [4]),
        "shift": dt.normal(0.0, 1.0),
    }
    first, again = list(dt.Random(space, n=20, seed=7)), list(dt.Random(space, n=20, seed=7))
    assert first == again and first != list(dt.Random(space, n=20, seed=8))
    for config in first:
        assert config["batch_size"](0) in (32, 64, 96, 128) and config["batch_size"](4) == 256
        assert abs(config["lr"](0) * 1000 - round(config["lr"](0) * 1000)) < 1e-9
        assert isinstance(config["shift"](0), float)


def test_model_based_algorithms_tune_them():
    space = {
        "lr": dt.qloguniform(1e-3, 1.0, 1e-3),
        "momentum": dt.quniform(0.0, 0.9, 0.1),
        "batch_size": dt.quniform(32, 256, 32),
        "weight_decay": dt.Exponential(dt.normal(-4.0, 1.0), 1.0),  # any real: no bounds
    }
    params = ParamSpace(space, "Test")
    points = params.sample_unit(np.random.default_rng(0), 3000)
    decoded = [params.decode(p) for p in points]
    assert {v["momentum"] for v in decoded} == {round(0.1 * k, 1) for k in range(10)}
    assert {type(v["batch_size"]) for v in decoded} == {int}
    shifts = [v["weight_decay.init"] for v in decoded]
    assert next(p for p in params.params if p.path == "weight_decay.init").kind == NORMAL
    assert abs(statistics.fmean(shifts) + 4.0) < 0.08 and abs(statistics.stdev(shifts) - 1.0) < 0.08
    for values in decoded[:20]:
        assert params.decode(params.encode(values)) == pytest.approx(values)
    study = dt.Study(SyntheticTrainer, executor=SimulatedExecutor(2))
    result = study.run(BayesOpt(space, "val_loss", "min", steps=3, n=6, n_initial=3, seed=0))
    assert len(result.trials) == 6 and set(result.trials["batch_size"]) <= set(range(32, 257, 32))
    pytest.importorskip("optuna")
    result = study.run(OptunaSampler(space, "val_loss", "min", steps=3, n=6, seed=0))
    frame = result.trials
    assert set(frame["batch_size"]) <= set(range(32, 257, 32))
    assert all(abs(v * 10 - round(v * 10)) < 1e-9 for v in frame["momentum"])
    assert all(abs(v * 1000 - round(v * 1000)) < 1e-9 for v in frame["lr"])
