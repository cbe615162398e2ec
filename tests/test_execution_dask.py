"""Execution on a real Dask LocalCluster with 2 worker processes."""

from __future__ import annotations

import pytest

import dagtune as dt
from dagtune.algos import GridSearch
from dagtune.sim import SyntheticTrainer
from dagtune.study import Study, run_alone

pytestmark = pytest.mark.slow


DIGITS_SPACE = dt.Grid(
    {
        "lr": [dt.Constant(0.05), dt.MultiStep(0.05, [3], 0.2)],
        "momentum": [0.9, dt.Steps([0.5, 0.9], [2])],
        "batch_size": [64, dt.Steps([64, 128], [4])],
        "weight_decay": [0.0],
    }
)


def test_digits_grid_is_bit_exact_with_training_alone(client, tmp_path):
    from digits import DigitsTrainer

    steps = 6
    with Study(DigitsTrainer, name="exact", storage=tmp_path, client=client, resources={"GPU": 1}) as study:
        result = study.run(GridSearch(DIGITS_SPACE, metric="val_acc", steps=steps), timeout=300)
        report = result.report
        assert report["executed_steps"] == report["unique_steps"] < report["trial_steps"]
        assert report["reuse"] == pytest.approx(report["trial_steps"] / report["unique_steps"])
        for trial in study.coordinator.trials.values():
            alone = run_alone(DigitsTrainer, trial.config, steps)
            assert [metrics for _, metrics in trial.curve] == alone, trial.config


def test_child_on_the_same_worker_continues_in_memory_and_elsewhere_loads(client, tmp_path):
    base = {"lr": dt.Steps([0.1, 0.05, 0.02], [5, 6]), "batch_size": 128}
    with Study(
        SyntheticTrainer, name="loads", storage=tmp_path, client=client, resources={"GPU": 1}
    ) as study:
        study.submit(base, 5).result(timeout=60)
        assert study.coordinator.loads == {"memory": 0, "storage": 0}
        # two children of the point (base, 5): one continues on the worker holding it live,
        # the other runs on the other worker and must read the checkpoint from storage
        one = study.submit(base, 8)
        other = study.submit({"lr": dt.Steps([0.1, 0.2], [5]), "batch_size": 128}, 8)
        assert one.result(timeout=60) == run_alone(SyntheticTrainer, base, 8)[-1]
        other.result(timeout=60)
        assert study.coordinator.loads == {"memory": 1, "storage": 1}
        assert study.report["executed_steps"] == 5 + 3 + 3


def test_asking_for_more_gpus_than_any_worker_has_fails_fast(client, tmp_path):
    with pytest.raises(ValueError, match=r"GPU.*no worker offers"):
        Study(SyntheticTrainer, name="greedy", storage=tmp_path, client=client, resources={"GPU": 2})
