"""A hyper-parameter nobody reads (`dagtune.hpreads`): the first ``setup()`` of each task
records which keys it reads, and the study warns once per trainer and name, in the process
that runs the study (not only in a worker's log)."""

from __future__ import annotations

import io
import warnings

import pytest
import torch
from user_trainers import MnistStyle, Typo

import dagtune as dt
from dagtune.algos import GridSearch
from dagtune.checkpoints import serialize_state
from dagtune.hpreads import RecordingValues, SetupValues
from dagtune.notices import UnreadHyperparameterWarning
from dagtune.sim import SimulatedExecutor, SyntheticTrainer
from dagtune.study import Study, run_alone
from dagtune.summary import error_line


class ReadsOnlyLr(MnistStyle):
    """The README's Quickstart before it was fixed: the grid varies ``batch_size``, ``setup()``
    reads only ``lr``."""


class ReadsEverything(MnistStyle):
    """Routes every value by name, as a trainer with many hyper-parameters does."""

    def setup(self, hp):
        for name, value in hp.items():
            if name == "lr":
                for group in self.optimizer.param_groups:
                    group["lr"] = value


class KeepsTheValues(MnistStyle):
    """Keeps ``hp`` itself, reads it while training and saves it with its state."""

    def setup(self, hp):
        self.hp = hp

    def train(self):
        for group in self.optimizer.param_groups:
            group["lr"] = self.hp["lr"]
        return super().train()

    def state_dict(self):
        return {**super().state_dict(), "hp": self.hp}


def test_a_typo_is_named_with_what_setup_asked_for():
    with pytest.warns(UnreadHyperparameterWarning) as caught:
        run_alone(Typo, {"lr": 0.05}, 2)
    (warning,) = caught
    assert str(warning.message).startswith(
        "Typo.setup() never read hyper-parameter 'lr' (it asked for 'learning_rate', which the config "
        "does not have): every value of 'lr' trains the same, so trials that differ only in it are identical."
    )


def test_a_study_warns_once_per_trainer_and_name():
    """The README's old grid: two batch sizes, which ``setup()`` never reads. Six tasks, each
    reporting it: one warning."""
    space = dt.Grid({"lr": [0.05, dt.Steps([0.05, 0.01], [2])], "batch_size": [32, 64]})
    study = Study(ReadsOnlyLr, executor=SimulatedExecutor(2))
    with pytest.warns(UnreadHyperparameterWarning) as caught:
        study.run(GridSearch(space, metric="val_loss", mode="min", steps=3))
    assert [str(w.message).split(":")[0] for w in caught] == [
        "ReadsOnlyLr.setup() never read hyper-parameter 'batch_size'"
    ]
    assert study.coordinator.notices.shown == [str(caught[0].message)]


@pytest.mark.parametrize("trainer", [MnistStyle, ReadsEverything, KeepsTheValues, SyntheticTrainer])
def test_trainers_that_read_their_values_are_not_warned_about(trainer, tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnreadHyperparameterWarning)
        run_alone(trainer, {"lr": 0.05}, 2)
        with Study(
            trainer, storage=tmp_path, executor=SimulatedExecutor(1, store=dt.CheckpointStore(tmp_path))
        ) as study:
            study.run(
                GridSearch([{"lr": 0.05}, {"lr": dt.Steps([0.05, 0.01], [1])}], "val_loss", "min", steps=2)
            )
            assert all(t.status == "completed" for t in study.coordinator.trials.values())


def test_the_recording_dict_is_a_dict_that_saves_as_one():
    values = RecordingValues({"lr": 0.1, "momentum": 0.9, "bs": 64})
    assert isinstance(values, dict) and values["lr"] == 0.1 and values.get("wd") is None
    assert "nothing" not in values and len(values) == 3
    assert values.unread() == ["momentum", "bs"] and values.asked == ["wd", "nothing"]
    assert {**values}["bs"] == 64 and values.unread() == []
    values.recording = False
    values.get("later")
    assert values.asked == ["wd", "nothing"]
    data = serialize_state({"hp": values, "w": torch.zeros(1)})  # saved as an OrderedDict
    assert dict(torch.load(io.BytesIO(data), weights_only=True)["hp"]) == {
        "lr": 0.1,
        "momentum": 0.9,
        "bs": 64,
    }


@pytest.mark.slow
def test_a_warning_from_a_dask_worker_reaches_the_study(client, tmp_path):
    with (
        Study(Typo, name="typo", storage=tmp_path, client=client, resources={"GPU": 1}) as study,
        pytest.warns(UnreadHyperparameterWarning, match="never read hyper-parameter 'lr'"),
    ):
        study.submit({"lr": 0.05}, 2).result(timeout=120)


class ReadsEveryValueEveryTime(MnistStyle):
    """Reads ``hp["lr"]`` in every ``setup()``, as if it were handed every value each time."""

    def setup(self, hp):
        for group in self.optimizer.param_groups:
            group["lr"] = hp["lr"]
        self.batch_size = hp["batch_size"]


def test_reading_a_value_that_did_not_change_says_why_it_is_missing():
    """setup() is handed only the values that changed: a trainer that reads ``hp["lr"]``
    unconditionally fails where only the batch size changes, and the error says so instead
    of a bare ``KeyError: 'lr'`` about a config that has ``lr``."""
    study = Study(ReadsEveryValueEveryTime, executor=SimulatedExecutor(1))
    with pytest.warns(dt.TrialsFailedWarning):
        result = study.run(
            GridSearch([{"lr": 0.05, "batch_size": dt.Steps([32, 64], [2])}], "val_loss", "min", steps=3)
        )
    (failed,) = result.failed
    assert failed.steps == 2  # steps 0 and 1 trained; the setup() before step 2 failed
    assert error_line(failed.error) == (
        "dagtune.hpreads.MissingHyperparameterError: setup() read hyper-parameter 'lr', which did not "
        "change before step 2: setup() is handed only the values that changed before the step it "
        "prepares (every value at a start or a resume), so test 'lr' in hp (or use hp.get) first"
    )


def test_reading_a_value_the_config_does_not_have_names_what_it_has():
    with pytest.raises(dt.TrialError) as failure:
        run_alone(ReadsEveryValueEveryTime, {"learning_rate": 0.05, "batch_size": 32}, 2)
    assert error_line(str(failure.value)) == (
        "dagtune.hpreads.MissingHyperparameterError: setup() read hyper-parameter 'lr', which the "
        "config does not have (it has 'batch_size', 'learning_rate'): a misspelled name? Use "
        "hp.get('lr', default) for one the config may leave out"
    )


def test_a_missing_value_is_a_key_error_and_the_values_save_as_a_dict():
    values = SetupValues({"lr": 0.1}, ["lr", "momentum"], 3)
    with pytest.raises(KeyError, match="'momentum', which did not change before step 3") as missing:
        values["momentum"]
    assert isinstance(missing.value, dt.DagtuneError)
    assert values.get("momentum", 0.9) == 0.9 and "momentum" not in values  # only [] raises
    data = serialize_state({"hp": values})
    assert dict(torch.load(io.BytesIO(data), weights_only=True)["hp"]) == {"lr": 0.1}
