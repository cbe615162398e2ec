"""Loggers: TensorBoard runs read back with TensorBoard's own reader, an MLflow file store read
with the MLflow client, the CSV with pandas; every trial's curve whole although prefixes are
shared; a resumed study never logs a point twice."""

from __future__ import annotations

import logging
import math
import os
import textwrap

import pandas as pd
import pytest
from click.testing import CliRunner

import dagtune as dt
from dagtune.algos import GridSearch
from dagtune.checkpoints import CheckpointStore
from dagtune.cli import main as cli
from dagtune.sim import SimulatedExecutor, SyntheticTrainer

pytest.importorskip("tensorboard")
mlflow = pytest.importorskip("mlflow")

from mlflow.tracking import MlflowClient  # noqa: E402
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402
from tensorboard.backend.event_processing.event_file_loader import EventFileLoader  # noqa: E402
from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData  # noqa: E402

# the trials share steps 0-2; the MultiStep schedules branch off at step 3
CONFIGS = [
    {"lr": 0.1, "momentum": 0.5},
    {"lr": dt.MultiStep(0.1, [3], 0.5), "momentum": 0.5},
    {"lr": dt.MultiStep(0.1, [3], 0.2), "momentum": 0.5},
]
STEPS = 6


@pytest.fixture
def mlflow_uri(tmp_path, monkeypatch):
    """A file store in a temporary directory (MLflow 3 asks for this opt-in to use one)."""
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    return f"file://{tmp_path / 'mlruns'}"


def loggers_in(tmp_path, mlflow_uri) -> list[dt.loggers.Logger]:
    return [
        dt.loggers.TensorBoard(tmp_path / "tb"),
        dt.loggers.CSV(tmp_path / "csv"),
        dt.loggers.MLflow(mlflow_uri),
    ]


def study_in(path, loggers, name: str = "logged", **options) -> dt.Study:
    store = CheckpointStore(str(path))
    executor = SimulatedExecutor(2, store=store)
    return dt.Study(
        SyntheticTrainer, name=name, storage=str(path), executor=executor, loggers=loggers, **options
    )


def tensorboard_run(tmp_path, trial: int, study: str = "logged") -> EventAccumulator:
    accumulator = EventAccumulator(str(tmp_path / "tb" / study / f"trial-{trial}"))
    accumulator.Reload()
    return accumulator


def scalar_events(tmp_path, trial: int, tag: str, study: str = "logged") -> list[int]:
    """The steps of every `tag` event in the run's files, duplicates included."""
    directory = tmp_path / "tb" / study / f"trial-{trial}"
    steps = []
    for name in sorted(os.listdir(directory)):
        for event in EventFileLoader(str(directory / name)).Load():
            steps += [event.step for value in event.summary.value if value.tag == tag]
    return sorted(steps)


def mlflow_runs(uri: str, study: str = "logged") -> dict[int, object]:
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name(study)
    return {int(r.data.tags["dagtune.trial"]): r for r in client.search_runs([experiment.experiment_id])}


def test_each_trial_is_one_run_with_its_hyper_parameters_and_its_whole_curve(tmp_path, mlflow_uri):
    with study_in(tmp_path, loggers_in(tmp_path, mlflow_uri)) as study:
        result = study.run(GridSearch(CONFIGS, metric="val_loss", mode="min", steps=STEPS))
        assert study.report["executed_steps"] == 3 + 3 * 3  # the shared prefix trained once
    curves = result.curves
    # TensorBoard, read back with its own reader
    for trial in range(3):
        run = tensorboard_run(tmp_path, trial)
        assert {"loss", "val_loss", "val_acc"} <= set(run.Tags()["scalars"])
        events = run.Scalars("val_loss")
        assert [e.step for e in events] == list(range(STEPS))  # the shared steps too
        assert [e.value for e in events] == pytest.approx([m["val_loss"] for _, m in curves[trial]], rel=1e-6)
        content = run.PluginTagToContent("hparams")
        start = HParamsPluginData.FromString(content["_hparams_/session_start_info"]).session_start_info
        end = HParamsPluginData.FromString(content["_hparams_/session_end_info"]).session_end_info
        assert start.hparams["momentum"].number_value == 0.5 and end.status == 1  # STATUS_SUCCESS
        if trial == 0:
            assert start.hparams["lr"].number_value == 0.1
        else:
            assert start.hparams["lr/schedule"].string_value.startswith("MultiStep(0.1, [3]")
            assert start.hparams["lr/first"].number_value == 0.1
    # CSV, read with pandas: a row per trial and step, the values each step trained with
    frame = pd.read_csv(tmp_path / "csv" / "logged" / "progress.csv")
    assert list(frame.columns[:4]) == ["trial_id", "step", "lr", "momentum"]
    for trial in range(3):
        rows = frame[frame["trial_id"] == trial].sort_values("step")
        assert list(rows["step"]) == list(range(STEPS))
        assert list(rows["val_loss"]) == [m["val_loss"] for _, m in curves[trial]]
        config = result.trial(trial).config
        assert list(rows["lr"]) == [config["lr"](s) for s in range(STEPS)]
    # MLflow, read back with its client
    runs = mlflow_runs(mlflow_uri)
    assert sorted(runs) == [0, 1, 2]
    client = MlflowClient(mlflow_uri)
    for trial, run in runs.items():
        assert run.info.status == "FINISHED" and run.info.run_name == f"trial-{trial}"
        assert (
            run.data.tags["dagtune.study"] == "logged" and run.data.tags["dagtune.identity"] == study.identity
        )
        history = sorted(client.get_metric_history(run.info.run_id, "val_loss"), key=lambda m: m.step)
        assert [(m.step, m.value) for m in history] == [(s, m["val_loss"]) for s, m in curves[trial]]
        assert run.data.params["momentum"] == "0.5"
    assert runs[1].data.params["lr/first"] == "0.1" and "MultiStep" in runs[1].data.params["lr/schedule"]


def test_a_resumed_study_logs_no_point_twice_and_a_new_logger_gets_everything(tmp_path, mlflow_uri):
    first = [dt.loggers.TensorBoard(tmp_path / "tb"), dt.loggers.CSV(tmp_path / "csv")]
    with study_in(tmp_path, first, checkpoint_every=1) as study:
        handles = [study.submit(c, STEPS) for c in CONFIGS]
        while handles[0].status == "pending" or handles[1].trial.reported < 4:
            study.coordinator.pump()  # trial 0 done, the others part-way
        assert any(h.status == "pending" for h in handles)
    with study_in(tmp_path, loggers_in(tmp_path, mlflow_uri), checkpoint_every=1) as again:
        again.run(GridSearch(CONFIGS, metric="val_loss", mode="min", steps=STEPS))
    frame = pd.read_csv(tmp_path / "csv" / "logged" / "progress.csv")
    for trial in range(3):
        assert scalar_events(tmp_path, trial, "val_loss") == list(range(STEPS))
        assert [e.step for e in tensorboard_run(tmp_path, trial).Scalars("val_loss")] == list(range(STEPS))
        assert sorted(frame[frame["trial_id"] == trial]["step"]) == list(range(STEPS))
    client = MlflowClient(mlflow_uri)  # not there in the first session: it gets every step
    for run in mlflow_runs(mlflow_uri).values():
        assert sorted(m.step for m in client.get_metric_history(run.info.run_id, "val_loss")) == list(
            range(STEPS)
        )
    # a third session with nothing new logs nothing
    with study_in(tmp_path, loggers_in(tmp_path, mlflow_uri), checkpoint_every=1) as third:
        third.run(GridSearch(CONFIGS, metric="val_loss", mode="min", steps=STEPS))
    assert len(pd.read_csv(tmp_path / "csv" / "logged" / "progress.csv")) == 3 * STEPS
    assert all(scalar_events(tmp_path, t, "val_loss") == list(range(STEPS)) for t in range(3))
    for run in mlflow_runs(mlflow_uri).values():
        assert len(client.get_metric_history(run.info.run_id, "val_loss")) == STEPS


def test_a_diverged_trials_last_point_and_failure_are_logged(tmp_path, mlflow_uri):
    with study_in(tmp_path, loggers_in(tmp_path, mlflow_uri), name="wild") as study:
        handle = study.submit({"lr": 50.0, "momentum": 0.5}, 40)
        handle.result()
        assert handle.status == "diverged"
        study.run(GridSearch([{"lr": 0.1, "momentum": 0.5}], metric="val_loss", steps=2))  # flushes
        reached = handle.trial.reported
    frame = pd.read_csv(tmp_path / "csv" / "wild" / "progress.csv")
    rows = frame[frame["trial_id"] == handle.id]
    assert list(rows["step"]) == list(range(reached)) and not math.isfinite(rows["loss"].iloc[-1])
    run = tensorboard_run(tmp_path, handle.id, "wild")
    end = HParamsPluginData.FromString(run.PluginTagToContent("hparams")["_hparams_/session_end_info"])
    assert end.session_end_info.status == 2  # STATUS_FAILURE
    assert mlflow_runs(mlflow_uri, "wild")[handle.id].info.status == "FAILED"


class Broken(dt.loggers.Logger):
    def start(self, trial):
        return -1

    def log(self, study, trial, step, metrics):
        raise OSError("disk full")


def test_a_failing_logger_is_reported_once_and_the_study_goes_on(tmp_path, caplog):
    csv = dt.loggers.CSV(tmp_path / "csv")
    with caplog.at_level(logging.WARNING, logger="dagtune"), study_in(tmp_path, [Broken(), csv]) as study:
        result = study.run(GridSearch(CONFIGS, metric="val_loss", mode="min", steps=STEPS))
    assert result.best is not None
    assert caplog.text.count("failed (OSError: disk full)") == 1
    assert len(pd.read_csv(tmp_path / "csv" / "logged" / "progress.csv")) == 3 * STEPS


def test_loggers_must_be_loggers(tmp_path):
    with pytest.raises(TypeError, match=r"loggers\[1\] must be a dagtune logger.*got 'tb'"):
        study_in(tmp_path, [dt.loggers.CSV(tmp_path), "tb"])
    with pytest.raises(ValueError, match="max_open must be a positive int"):
        dt.loggers.TensorBoard(tmp_path, max_open=0)


def test_the_csv_widens_for_a_metric_that_appears_later(tmp_path):
    csv = dt.loggers.CSV(tmp_path)
    csv.open("s", "0" * 16)
    info = dt.loggers.TrialInfo("s", 0, dt.config.normalize_config({"lr": 0.1, "loss": 2}), 3)
    assert csv.start(info) == -1
    csv.log("s", 0, 0, {"val": 1.0})
    csv.log("s", 0, 1, {"val": 2.0, "loss": 0.5})  # "loss" is a hyper-parameter's name too
    csv.close("s")
    frame = pd.read_csv(csv.path("s"))
    assert list(frame.columns) == ["trial_id", "step", "config/loss", "lr", "val", "loss"]
    assert list(frame["config/loss"]) == [2, 2] and list(frame["val"]) == [1.0, 2.0]
    assert frame["loss"].isna().tolist() == [True, False]
    again = dt.loggers.CSV(tmp_path)  # resuming: the last step of each trial, the columns as they are
    again.open("s", "0" * 16)
    assert again.start(info) == 1


@pytest.mark.slow
def test_dagtune_run_tensorboard_logs_every_trial(client, tmp_path):
    script = tmp_path / "tiny.py"
    script.write_text(
        textwrap.dedent(
            """
            import dagtune as dt
            from dagtune.algos import GridSearch
            from dagtune.launch import StudySetup
            from dagtune.sim import SyntheticTrainer

            def study_setup():
                space = dt.Grid({"lr": [0.1, dt.MultiStep(0.1, [2], 0.5)]})
                return StudySetup(SyntheticTrainer, GridSearch(space, metric="val_loss", steps=4), name="tiny")
            """
        )
    )
    args = ["run", str(script), "--scheduler", client.scheduler.address, "--storage", str(tmp_path / "runs")]
    done = CliRunner().invoke(cli, [*args, "--tensorboard", str(tmp_path / "tb")])
    assert done.exit_code == 0, done.output
    for trial in range(2):
        assert [e.step for e in tensorboard_run(tmp_path, trial, "tiny").Scalars("val_loss")] == [0, 1, 2, 3]
