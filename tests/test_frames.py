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
from dagtune.frames import row_of, trials_table
from dagtune.records import Trial
from dagtune.results import FORMAT, ResultsWriter, open_results, results_url
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


def _varied_trials() -> dict[int, Trial]:
    """Trials whose hyper-parameters take every kind of cell: ints, strings, bools and None,
    a schedule in some trials and a constant in others, one no trial after the first has, a
    value that is not finite at the last step, and a trial that trained no step."""
    configs = [
        {
            "lr": dt.Steps([0.1, 0.01], [2]),
            "bs": 64,
            "opt": "sgd",
            "wd": dt.Exponential(0.1, 1.0),
            "only": True,
        },
        {"lr": 0.3, "bs": 128, "opt": "adam", "wd": 0.0, "none": None},
        {"lr": dt.MultiStep(0.1, [1], 0.5), "bs": 64, "opt": "sgd", "wd": dt.Exponential(1e300, 1e300)},
        {"lr": dt.Linear(0.1, 0.2, 3), "bs": 32, "opt": "sgd", "wd": 1e-4},
    ]
    trials = {}
    for i, config in enumerate(configs):
        trial = Trial(i, dt.config.normalize_config(config), 4)
        trial.curve = [(s, {"loss": 1.0 / (i + s)}) for s in range(1, 4 - (i == 3) * 3)]
        trial.reported = len(trial.curve)
        if i == 0:
            trial.status, trial.metrics = "completed", trial.curve[-1][1]
        trials[i] = trial
    trials[1].status, trials[1].error = "failed", "Traceback: boom"
    return trials


def test_stored_hyper_parameter_cells_give_the_frame_the_configs_give(tmp_path):
    """The frame `open_results` builds from the hyper-parameter cells the writer stored is,
    cell for cell and dtype for dtype, the one parsing every row's config gives, and the one
    a run's `Result.trials` shows of the same trials."""
    trials = _varied_trials()
    writer = ResultsWriter(results_url(str(tmp_path), "s"), None, study="s", identity="x")
    writer.write(trials)
    writer.compact()  # the rows in the base arrays (reordered below)
    results = open_results(str(tmp_path), "s")
    assert results.group.attrs["format"] == FORMAT and "hyperparameters" in results.group.attrs
    frame = results.trials
    pd.testing.assert_frame_equal(frame, trials_table(results.rows()))
    pd.testing.assert_frame_equal(frame, trials_table(row_of(t) for t in trials.values()))
    assert {"lr/schedule", "lr/first", "lr/last", "bs", "opt", "only", "none"} <= set(frame.columns)
    assert frame["bs"].dtype.kind == "i" and math.isnan(frame.loc[2, "wd/last"])
    assert math.isnan(frame.loc[3, "lr/last"]) and frame.loc[1, "only"] is None
    group = zarr.open_group(results_url(str(tmp_path), "s"), mode="a")
    for name in ["trial_id", "status", "steps", "config", "error", "final/loss"]:
        group[name][:] = group[name][:][[2, 0, 3, 1]]  # rows out of trial id order read the same
    for hyper in ("lr", "bs", "opt", "wd", "only", "none"):
        for cell in ("constant", "first", "schedule", "last"):
            array = group[f"hyper/{hyper}/{cell}"]
            array[:] = array[:][[2, 0, 3, 1]]
    pd.testing.assert_frame_equal(open_results(str(tmp_path), "s").trials, frame)


def test_results_written_before_hyper_parameter_cells_read_the_same_and_gain_them(tmp_path):
    """A group the previous dagtune wrote (format 2: no hyper-parameter cells) reads to the
    same frame (each row's config parsed), and a study that resumes it writes them."""
    trials = _varied_trials()
    url = results_url(str(tmp_path), "s")
    writer = ResultsWriter(url, None, study="s", identity="x")
    writer.write(trials)
    writer.compact()  # the rows in the base arrays (relabelled below)
    expected = open_results(str(tmp_path), "s").trials
    group = zarr.open_group(url, mode="a")
    del group["hyper"]
    attributes = dict(group.attrs)
    del attributes["hyperparameters"]
    group.attrs.put({**attributes, "format": "dagtune-results/2"})
    pd.testing.assert_frame_equal(open_results(str(tmp_path), "s").trials, expected)
    trials[4] = Trial(4, dt.config.normalize_config({"lr": 0.2, "bs": 16, "opt": "sgd", "wd": 0.0}), 4)
    writer = ResultsWriter(url, None, study="s", identity="x")
    writer.write(trials)
    writer.compact()
    resumed = open_results(str(tmp_path), "s")
    assert resumed.group.attrs["format"] == FORMAT and "hyper" in resumed.group
    pd.testing.assert_frame_equal(resumed.trials, trials_table(row_of(t) for t in trials.values()))
