"""What every algorithm owes the interface: a misspelled metric is a clear error even when no
result ever reaches `on_result` (every trial diverges on its first step)."""

from __future__ import annotations

import importlib.util

import pytest

import dagtune as dt
from dagtune.algos import (
    ASHA,
    PBT,
    BayesOpt,
    GridSearch,
    Hyperband,
    MedianStopping,
    OptunaSampler,
    RandomSearch,
    Retune,
    SuccessiveHalving,
)
from dagtune.sim import SimulatedExecutor, SyntheticTrainer
from dagtune.study import Study, run_alone

# learning rates so large that the very first result is inf/NaN: every trial diverges at once
DIVERGING = dt.Random({"lr": dt.loguniform(1e29, 1e31), "momentum": dt.uniform(0.0, 0.5)}, n=6, seed=0)

MAKERS = {
    "GridSearch": lambda metric: GridSearch(DIVERGING, metric, "min", steps=3),
    "RandomSearch": lambda metric: RandomSearch(DIVERGING, metric, "min", steps=3),
    "SuccessiveHalving": lambda metric: SuccessiveHalving(DIVERGING, metric, "min", max_steps=9),
    "Hyperband": lambda metric: Hyperband(DIVERGING, metric, "min", max_steps=9),
    "ASHA": lambda metric: ASHA(DIVERGING, metric, "min", max_steps=9),
    "MedianStopping": lambda metric: MedianStopping(DIVERGING, metric, "min", max_steps=5, min_samples=1),
    "PBT": lambda metric: PBT(DIVERGING, metric, "min", max_steps=6, interval=2, population=4),
    "BayesOpt": lambda metric: BayesOpt(DIVERGING, metric, "min", steps=3, n=6, early_stopping="asha"),
    "Retune": lambda metric: Retune(DIVERGING, metric, "min", max_steps=20),
    "OptunaSampler": lambda metric: OptunaSampler(DIVERGING, metric, "min", steps=3, n=6),
}


def needs(name: str) -> list:
    if name == "OptunaSampler" and importlib.util.find_spec("optuna") is None:
        return [pytest.mark.skip(reason="optuna is not installed")]
    return []


@pytest.mark.parametrize("name", [pytest.param(n, marks=needs(n)) for n in MAKERS])
def test_an_unknown_metric_is_caught_when_every_trial_diverges_at_once(name):
    assert all(
        any(v != v or abs(v) == float("inf") for v in run_alone(SyntheticTrainer, c, 1)[0].values())
        for c in DIVERGING
    )  # the first result of every config is non-finite: none reaches on_result
    study = Study(SyntheticTrainer, executor=SimulatedExecutor(2))
    with pytest.raises(ValueError, match=rf"{name}: metric 'val_los' is not among the reported metrics"):
        study.run(MAKERS[name]("val_los"))
    # spelled right, the same run ends without an error, every trial diverged
    study = Study(SyntheticTrainer, executor=SimulatedExecutor(2))
    algo = MAKERS[name]("val_loss")
    study.run(algo)
    assert algo.trials and all(t.status == "diverged" for t in algo.trials)
