"""One frame schema for `Result.trials` and `open_results(...).trials`, and learning curves
indexed by step from 0 (the README's step: one call of `Trainer.train()`)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import zarr

import dagtune as dt
from dagtune.algos import GridSearch
from dagtune.checkpoints import CheckpointStore
from dagtune.results import FORMAT, results_url
from dagtune.sim import SimulatedExecutor, SyntheticTrainer

SPACE = dt.Grid(
    {
        "lr": [0.1, dt.MultiStep(0.1, [3], 0.5)],
        "batch_size": [64, 128],
        "optimizer": ["sgd"],
    }
)
STEPS = 6


def study_in(path: str, name: str = "frames", **options) -> dt.Study:
    store = CheckpointStore(path)
    return dt.Study(
        SyntheticTrainer, name=name, storage=path, executor=SimulatedExecutor(2, store=store), **options
    )


@pytest.fixture
def ran(tmp_path):
    with study_in(str(tmp_path), eval_every=2) as study:
        result = study.run(GridSearch(SPACE, metric="val_loss", mode="min", steps=STEPS))
        handles = study.trials
    return result, dt.open_results(str(tmp_path), "frames"), handles


def test_result_and_stored_results_have_one_schema(ran):
    result, stored, _ = ran
    live, read = result.trials, stored.trials
    pd.testing.assert_frame_equal(live, read, check_dtype=False)
    assert read.index.name == "trial_id" and list(read.index) == [0, 1, 2, 3]
    assert list(read.columns) == [
        "status",
        "steps",
        "loss",
        "val_acc",
        "val_loss",
        "batch_size",
        "lr/schedule",
        "lr/first",
        "lr/last",
        "optimizer",
        "error",
        "config",
    ]
    # constants are plain values one can sort and group by
    assert read["batch_size"].dtype.kind == "i" and sorted(set(read["batch_size"])) == [64, 128]
    assert set(read["optimizer"]) == {"sgd"}
    # a schedule: its text, and its values at the first and the last step trained
    assert set(read["lr/schedule"]) == {"0.1", "MultiStep(0.1, [3], 0.5)"}
    assert list(read["lr/first"]) == [0.1] * 4
    assert sorted(read["lr/last"]) == [0.05, 0.05, 0.1, 0.1]
    assert read.groupby("batch_size")["val_loss"].count().to_dict() == {64: 2, 128: 2}
    for trial_id, row in read.iterrows():
        config = dt.config.config_from_json(__import__("json").loads(row["config"]))
        assert config == result.trial(trial_id).config and row["error"] == ""


def test_curves_are_indexed_by_step_from_zero_everywhere(ran):
    result, stored, handles = ran
    live, read = result.curve("val_loss"), stored.curve("val_loss")
    pd.testing.assert_frame_equal(live, read)
    assert read.columns.name == "step" and list(read.columns) == list(range(STEPS))
    for trial_id, row in read.iterrows():
        alone = dt.run_alone(SyntheticTrainer, result.trial(trial_id).config, STEPS)
        # evaluated every 2 steps: after steps 1, 3, 5 (2, 4 and 6 calls of train()), and at
        # the checkpoint where the MultiStep schedules branch off (after step 2)
        evaluated = [s for s in range(STEPS) if not math.isnan(row[s])]
        assert {1, 3, 5} <= set(evaluated) <= {1, 2, 3, 5}
        assert [row[s] for s in evaluated] == [alone[s]["val_loss"] for s in evaluated]
        assert row[STEPS - 1] == result.trials.loc[trial_id, "val_loss"]
        assert [s for s, _ in result.curves[trial_id]] == evaluated
    assert [s for s, _ in handles[0].curve()] == [s for s, _ in result.curves[0]]
    with pytest.raises(KeyError, match=r"no metric 'val_accuracy'.*val_acc"):
        result.curve("val_accuracy")


def test_a_hyper_parameter_named_like_a_metric_or_a_column_is_prefixed(tmp_path):
    space = [{"loss": 0.1, "steps": 2, "val": dt.Steps([1, 2], [1])}]
    with study_in(str(tmp_path), name="clash") as study:
        result = study.run(GridSearch(space, metric="val_loss", mode="min", steps=3))
    frame = result.trials
    assert {"config/loss", "config/steps", "val/schedule", "val/first", "val/last"} <= set(frame.columns)
    assert frame.loc[0, "config/loss"] == 0.1 and frame.loc[0, "loss"] != 0.1
    assert (frame.loc[0, "val/first"], frame.loc[0, "val/last"]) == (1, 2)
    assert list(dt.open_results(str(tmp_path), "clash").trials.columns) == list(frame.columns)


def test_results_written_before_steps_counted_from_zero_read_the_same_and_are_renumbered(tmp_path):
    path = str(tmp_path)
    configs = list(SPACE)[:2]
    with study_in(path, name="old") as study:
        study.run(GridSearch(configs, metric="val_loss", mode="min", steps=4))
    group = zarr.open_group(results_url(path, "old"), mode="a")
    assert group.attrs["format"] == FORMAT and list(group["step"][:]) == [0, 1, 2, 3]
    group["step"][:] = np.arange(1, 5)  # as dagtune-results/1 numbered the same columns
    group.attrs["format"] = "dagtune-results/1"
    before = dt.open_results(path, "old").curve("val_loss")
    assert list(before.columns) == [0, 1, 2, 3]
    with study_in(path, name="old") as again:
        again.run(GridSearch([*configs, list(SPACE)[2]], metric="val_loss", mode="min", steps=4))
    group = zarr.open_group(results_url(path, "old"), mode="r")
    assert group.attrs["format"] == FORMAT and list(group["step"][:]) == [0, 1, 2, 3]
    after = dt.open_results(path, "old").curve("val_loss")
    pd.testing.assert_frame_equal(after.loc[[0, 1]], before)
