"""Trainers written the way users write them, run as a study on storage and compared with
`run_alone` (`user_trainers`): where the two disagreed, or where a study hid what run_alone
shows."""

from __future__ import annotations

import random

import pytest
from dask.sizeof import sizeof
from user_trainers import AugmentsWithGlobalRandom, GetsWithDefault, ReadsAnUnchangedValue

import dagtune as dt
from dagtune.algos import GridSearch
from dagtune.config import config_dumps, normalize_config
from dagtune.execution._private_random import private_random_for_dask
from dagtune.hpreads import MissingHyperparameterError, RecordingValues, SetupValues
from dagtune.study import Study, TrialError, run_alone


def test_a_default_setup_applied_is_named_by_the_resume_check_it_fails(client, tmp_path):
    """``hp.get("lr", 0.05)`` before a step where only batch_size changes applies the default;
    at the checkpoint there the resume check (a resumed trainer is handed every value) fails
    the trial, and its error names the default first (the warning goes with the failed
    step), not the model and optimizer as if load_state_dict() forgot them."""
    config = {"lr": 0.01, "batch_size": dt.Steps([32, 64], [2])}
    with (
        pytest.warns(dt.TrialsFailedWarning),
        Study(GetsWithDefault, client=client, storage=str(tmp_path), checkpoint_every=2) as study,
    ):
        result = study.run(GridSearch([config], metric="val_loss", mode="min", steps=4), progress=False)
    (failed,) = result.failed
    line = failed.error.strip().splitlines()[-1]
    assert line.startswith(
        "dagtune.resumecheck.ResumeChangedTrainingError: resuming from a checkpoint changes training. "
        "Likely cause: GetsWithDefault.setup() read hyper-parameter 'lr' with hp.get('lr', 0.05) before "
        "step 2, where 'lr' did not change, so it got the default 0.05, not the config's 0.01"
    ), line
    assert "does load_state_dict() load it?" not in line


def test_a_setup_reading_an_unchanged_value_fails_in_a_study_as_alone(client, tmp_path):
    """``hp["momentum"]`` read unconditionally fails `run_alone` where only lr changes (step 2).
    A study, whose stage starts there (another trial branches off; a checkpoint), hands that
    setup() every value: it used to pass, a trial run_alone can't train. It fails the same way
    now, and the trial that never changes a value passes in both, equal to run_alone."""
    changing = {"lr": dt.MultiStep(0.1, [2], 0.1), "momentum": 0.9}
    constant = {"lr": 0.1, "momentum": 0.9}
    with pytest.raises(
        TrialError, match=r"MissingHyperparameterError: setup\(\) read hyper-parameter 'momentum', "
    ):
        run_alone(ReadsAnUnchangedValue, changing, 4)
    with (
        pytest.warns(dt.TrialsFailedWarning),
        Study(ReadsAnUnchangedValue, client=client, storage=str(tmp_path), checkpoint_every=2) as study,
    ):
        result = study.run(
            GridSearch([changing, constant], metric="val_loss", mode="min", steps=4), progress=False
        )
        trials = {handle.trial.config["lr"]: handle.trial for handle in study.trials}
    (failed,) = result.failed
    assert failed.steps == 2
    assert (
        failed.error.strip()
        .splitlines()[-1]
        .startswith(
            "dagtune.hpreads.MissingHyperparameterError: setup() read hyper-parameter 'momentum', which did not "
            "change before step 2"
        )
    )
    passed = trials[dt.Constant(0.1)]
    assert passed.status == "completed"
    assert [metrics for _, metrics in passed.curve] == run_alone(ReadsAnUnchangedValue, constant, 4)


def test_values_handed_only_because_a_stage_starts_read_as_run_alone_hands_them():
    """Before a step where lr changes, a stage's first setup() holds momentum too: ``hp[...]``
    without testing raises as alone; testing it (or iterating) reads it; ``hp.get`` returns it
    (a trainer loaded from a checkpoint needs it, where its own value is __init__'s)."""
    hp = SetupValues({"lr": 0.01, "momentum": 0.9}, {"lr": 0.01, "momentum": 0.9}, 2, unchanged={"momentum"})
    assert hp["lr"] == 0.01
    with pytest.raises(MissingHyperparameterError):
        hp["momentum"]
    assert hp.get("momentum") == hp.get("momentum", 0.5) == 0.9 and not hp.defaulted
    assert "momentum" in hp and hp["momentum"] == 0.9
    recording = RecordingValues({"lr": 0.01, "momentum": 0.9}, None, 2, unchanged={"momentum"})
    assert dict(recording.items()) == {"lr": 0.01, "momentum": 0.9}
    assert recording["momentum"] == 0.9  # found by iterating


def test_a_trainer_drawing_from_pythons_global_random_trains_as_alone(client, tmp_path):
    """``random.shuffle`` and ``random.random()`` in train() (python's global generator):
    dask's sizeof, sampling large dicts on the worker's event loop, drew from it while the
    trainer built and trained, so the study's trials differed from run_alone (or failed the
    resume check, blaming the model). Now bit for bit, with the resume check on."""
    space = [{"lr": 0.05}, {"lr": dt.MultiStep(0.05, [2], 0.1)}, {"lr": dt.MultiStep(0.05, [3], 0.1)}]
    with Study(AugmentsWithGlobalRandom, client=client, storage=str(tmp_path), checkpoint_every=1) as study:
        study.run(GridSearch(space, metric="val_loss", mode="min", steps=4), progress=False)
        trials = {config_dumps(handle.trial.config): handle.trial for handle in study.trials}
    for config in space:
        trial = trials[config_dumps(normalize_config(config))]
        assert trial.status == "completed", trial.error
        assert [metrics for _, metrics in trial.curve] == run_alone(AugmentsWithGlobalRandom, config, 4)


def test_dask_sizes_large_collections_without_pythons_global_random():
    """What a worker's event loop does to every large message it sizes leaves the trainer's
    generator where it was (before: one ``random.sample`` per dict)."""
    private_random_for_dask()
    random.seed(0)
    before = random.getstate()
    sizeof({str(i): list(range(20)) for i in range(100)})
    assert random.getstate() == before
