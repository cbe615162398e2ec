"""The resume check (`dagtune.resumecheck`): a trainer loaded from a checkpoint must train on
as the one that saved it, or the trial fails naming what differs and why; the check never
changes what a trial computes.

Trainers as users write them (`user_trainers`): PyTorch's MNIST example ported to dagtune,
the same with the optimizer left out of ``state_dict()``, with a learning-rate scheduler left
out."""

from __future__ import annotations

import os
import warnings
from typing import ClassVar

import dask
import pytest
import torch
from clusters import local_client
from fusion_helpers import TinyMLP
from user_trainers import BuildsInSetup, ForgetsTheOptimizer, ForgetsTheScheduler, MnistStyle, TooBigForTwo

import dagtune as dt
from dagtune.algos import GridSearch
from dagtune.notices import NondeterministicTrainingWarning, TrialsFailedWarning
from dagtune.resumecheck import (
    LoadStateError,
    ResumeChangedTrainingError,
    ResumeChecks,
    differences,
    trainer_outcome,
)
from dagtune.sim import SimulatedExecutor
from dagtune.study import Study, TrialError, run_alone
from dagtune.summary import error_line

#: trials that share their first 2 steps, then branch: every branch resumes from step 2
SPACE = [
    {"lr": dt.Constant(0.05)},
    {"lr": dt.Steps([0.05, 0.02], [2])},
    {"lr": dt.Steps([0.05, 0.01], [2])},
]

OPTIMIZER_CAUSE = (
    "Likely cause: self.optimizer (the SGD optimizer) is not in state_dict(), so a resumed trainer "
    "starts it over (its momentum buffers): is it in state_dict(), and loaded in load_state_dict()?"
)


def grid(trainer: type, workers: int = 1, **options) -> tuple[Study, dt.Result]:
    study = Study(trainer, executor=SimulatedExecutor(workers), **options)
    return study, study.run(GridSearch(SPACE, metric="val_loss", mode="min", steps=4))


# --------------------------------------------------------------------------- what it catches


def test_run_alone_fails_a_trainer_that_leaves_its_optimizer_out():
    with pytest.raises(TrialError, match="run_alone failed at step 2") as failure:
        run_alone(ForgetsTheOptimizer, {"lr": 0.05}, 3)
    message = " ".join(str(failure.value).split())
    assert (
        "After step 2, a trainer loaded from the "
        "checkpoint at step 1 differs from the trainer that saved it and trained on: "
        "self.optimizer.state_dict()['state'][0]['momentum_buffer']"
    ) in message
    assert message.index("resuming from a checkpoint changes training. " + OPTIMIZER_CAUSE) < message.index(
        "After"
    )


def test_run_alone_fails_a_trainer_that_leaves_its_scheduler_out():
    with pytest.raises(TrialError) as failure:
        run_alone(ForgetsTheScheduler, {"lr": 0.05}, 3)
    message = " ".join(str(failure.value).split())
    assert "self.scheduler.state_dict()['last_epoch']" in message
    assert (
        "Likely cause: self.scheduler (the StepLR learning-rate scheduler) is not in state_dict(), "
        "so a resumed trainer starts it over (its schedule)"
    ) in message


def test_a_study_fails_the_trials_and_says_why():
    """In a study the branches resume from step 2: with the check off they silently train
    differently from training them alone; with it on, the trials fail, naming the cause."""
    _, unchecked = grid(ForgetsTheOptimizer, check_resume=0)
    assert not unchecked.failed
    alone = {
        str(t.config): run_alone(ForgetsTheOptimizer, t.config, 4, check_resume=0)[-1]
        for t in unchecked._trials
    }
    assert any(t.metrics != alone[str(t.config)] for t in unchecked._trials)
    with pytest.warns(TrialsFailedWarning, match="3 of 3 trials failed"):
        _, result = grid(ForgetsTheOptimizer)
    assert result.failed and all(t.status == "failed" for t in result.failed)
    assert OPTIMIZER_CAUSE in " ".join(result.failed[0].error.split())
    assert "ResumeChangedTrainingError: resuming from a checkpoint changes training" in result.failed[0].error


def test_the_line_shown_for_a_failed_trial_names_the_likely_cause():
    """`dagtune run`, `dagtune status` and the TrialsFailedWarning show one line of a failed
    trial's error, cut to 300 characters: the likely cause must be in it, not after the list
    of differing entries (an optimizer's momentum buffers fill the line)."""
    with pytest.warns(TrialsFailedWarning, match="Likely cause: self.optimizer"):
        _, result = grid(ForgetsTheOptimizer)
    shown = error_line(result.failed[0].error)
    assert shown.startswith("dagtune.resumecheck.ResumeChangedTrainingError: resuming from a checkpoint")
    assert OPTIMIZER_CAUSE in shown, shown


def test_a_path_that_ends_at_its_checkpoint_is_checked_there():
    """A trial without branches checkpoints only at its end (where a later extension resumes):
    the trainer trains one step past it beside a resumed one, and is not kept afterwards."""
    study = Study(ForgetsTheOptimizer, executor=SimulatedExecutor(1))
    with pytest.raises(TrialError) as failure:
        study.submit({"lr": 0.05}, 3).result()
    assert (
        "A trainer loaded from the checkpoint at step 3, where this stage ends, and the trainer that "
        "saved it each trained one step more (step 4, trained for this check alone and discarded), "
        "and they differ: self.optimizer.state_dict()"
    ) in " ".join(str(failure.value).split())


def test_a_failed_resume_check_is_not_retried():
    """The check fails the same way every time: its stage is not trained again (however many
    retries the study allows), and the error is the first one, at the checkpoint the trials
    branch from, not a retry's from a later one."""
    with pytest.warns(TrialsFailedWarning):
        _, once = grid(ForgetsTheOptimizer, max_retries=0)
    with pytest.warns(TrialsFailedWarning):
        study, retried = grid(ForgetsTheOptimizer, max_retries=3)
    assert retried.report["executed_steps"] == once.report["executed_steps"]
    (straight,) = [t for t in study.coordinator.trials.values() if t.config["lr"] == dt.Constant(0.05)]
    assert straight.status == "failed"
    message = " ".join(straight.error.split())
    assert "After step 3, a trainer loaded from the checkpoint at step 2 differs" in message
    assert "The stage is not retried: it would fail the same way." in message


LOAD_FAILED = (
    "BuildsInSetup.load_state_dict() failed on a trainer that BuildsInSetup.__init__ had just built: "
    "build what state_dict() holds (model, optimizer, data order) in __init__, not in setup() "
    "(AttributeError: 'NoneType' object has no attribute 'load_state_dict')."
)


def test_a_trainer_that_builds_its_model_in_setup_is_told_so_at_the_first_check():
    """The check's fresh trainer can't load the checkpoint: that is said as it is (which
    method raised, on what trainer, what to do), not as a difference in ``train()``."""
    with pytest.raises(TrialError) as failure:
        run_alone(BuildsInSetup, {"lr": 0.05}, 3)
    message = " ".join(str(failure.value).split())
    assert LOAD_FAILED in message
    assert "calling load_state_dict() and only then setup() with every value" in message
    assert "train() raised" not in message
    assert f"{LoadStateError.__module__}.LoadStateError: {LOAD_FAILED}" in message


def test_a_stage_resumed_into_a_trainer_that_builds_in_setup_fails_once_and_says_why():
    """With the check off, the branches' stages fail where they load their checkpoint, with
    the same explanation, and are not trained again however many retries the study allows."""
    with pytest.warns(TrialsFailedWarning):
        _, once = grid(BuildsInSetup, check_resume=0, max_retries=0)
    with pytest.warns(TrialsFailedWarning):
        study, retried = grid(BuildsInSetup, check_resume=0, max_retries=3)
    assert retried.report["executed_steps"] == once.report["executed_steps"]
    branches = [t for t in study.coordinator.trials.values() if t.config["lr"] != dt.Constant(0.05)]
    assert branches and all(t.status == "failed" for t in branches)
    assert all(LOAD_FAILED in " ".join(t.error.split()) for t in branches)
    assert all("LoadStateError" in error_line(t.error) for t in branches)


def test_nondeterministic_training_is_a_warning_not_a_failure():
    study = Study(Jittery, executor=SimulatedExecutor(1))
    with pytest.warns(NondeterministicTrainingWarning, match="training is not deterministic"):
        result = study.submit({"lr": 0.05}, 3).result()
    assert set(result) >= {"val_loss", "val_acc"}


class Jittery(MnistStyle):
    """Adds a little noise from the operating system's randomness: no two runs agree."""

    def train(self):
        metrics = super().train()
        with torch.no_grad():
            self.model.fc2.bias += int.from_bytes(os.urandom(2), "little") * 1e-9
        return metrics


def test_check_resume_must_be_a_count():
    for value in (-1, 1.5, True, "1"):
        with pytest.raises(ValueError, match=r"check_resume must be an int >= 0 \(0: no check\)"):
            Study(MnistStyle, executor=SimulatedExecutor(1), check_resume=value)
        with pytest.raises(ValueError, match=r"check_resume must be an int >= 0"):
            run_alone(MnistStyle, {"lr": 0.1}, 2, check_resume=value)


def test_differences_name_entries_metrics_generators_and_failures():
    trainer = MnistStyle()
    trainer.setup({"lr": 0.05})
    before = trainer_outcome(trainer, {"loss": 1.0})
    assert differences(before, before) == []
    torch.rand(1)  # the global generator moved
    with torch.no_grad():
        trainer.model.fc2.bias += 1
    after = trainer_outcome(trainer, {"loss": 2.0})
    changed = differences(after, before)
    assert changed[0] == "self.model.state_dict()['fc2.bias']"
    assert "state_dict()['model']['fc2.bias']" in changed and "train() metrics['loss']" in changed
    assert changed[-1] == "the global torch random generator"
    checks = ResumeChecks()
    assert checks.due("m", 1) and not checks.due("m", 0)
    checks.passed("m")
    assert not checks.due("m", 1) and checks.due("m", 2) and checks.due("other", 1)


def test_the_error_names_a_few_entries_and_counts_the_rest():
    error = ResumeChangedTrainingError(4, [f"k{i}" for i in range(9)], ["a cause."], 2)
    assert "After step 5" in str(error) and "checkpoint at step 4" in str(error)
    assert "k5 and 3 more." in str(error) and "k6" not in str(error)
    assert "Likely cause: a cause." in str(error) and "its first 2 checkpoints of a model" in str(error)


# --------------------------------------------------------------------------- what it leaves alone


def test_the_check_changes_no_result():
    """Dropout, batch norm and a shuffling DataLoader draw from the global generators: with
    the check on (a second trainer trains the step after each worker's first checkpoint),
    every trial is still bit for bit what it is alone, checked or not."""
    Counted.built = 0
    _, result = grid(Counted, workers=2)
    checked_builds = Counted.built
    by_config = {str(t.config["lr"]): t.metrics for t in result._trials}
    for config in SPACE:
        alone = run_alone(MnistStyle, config, 4)
        assert by_config[str(dt.config.normalize_config(config)["lr"])] == alone[-1]
        assert run_alone(MnistStyle, config, 4, check_resume=0) == alone
    Counted.built = 0
    grid(Counted, workers=2, check_resume=0)
    assert 1 <= checked_builds - Counted.built <= 2  # one resumed trainer per worker that checked


class Counted(MnistStyle):
    built: ClassVar[int] = 0

    def __init__(self, seed: int = 0):
        type(self).built += 1
        super().__init__(seed)


def test_extending_a_trial_checked_at_its_end_resumes_from_storage_exactly():
    study = Study(MnistStyle, executor=SimulatedExecutor(1))
    study.submit({"lr": 0.05}, 2).result()  # checked at its end: trained a step past it
    assert study.submit({"lr": 0.05}, 4).result() == run_alone(MnistStyle, {"lr": 0.05}, 4)[-1]
    assert study.coordinator.loads["storage"] == 1  # the trainer was not kept in memory


def test_a_correct_trainer_warns_about_nothing():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        grid(MnistStyle)
        run_alone(MnistStyle, {"lr": 0.05}, 3)


# --------------------------------------------------------------------------- fused


class HiddenNoise(TinyMLP):
    """A fusible trainer that adds noise to its batches from a private generator it does not
    save: a resumed member draws other noise."""

    def __init__(self, seed: int = 0):
        super().__init__(seed=seed)
        self.noise = torch.Generator().manual_seed(seed)

    def batch(self, indices):
        x, y = super().batch(indices)
        return x + 0.1 * torch.randn(x.shape, generator=self.noise), y


FUSED_SPACE = [
    {"lr": dt.Constant(0.1)},
    {"lr": dt.Steps([0.1, 0.05], [2])},
    {"lr": dt.Steps([0.1, 0.02], [2])},
]


def test_the_fused_runner_checks_members_and_changes_no_result():
    study = Study(TinyMLP, executor=SimulatedExecutor(1), fuse=4)
    result = study.run(GridSearch(FUSED_SPACE, metric="val_loss", mode="min", steps=4))
    for trial in result._trials:
        assert trial.metrics == run_alone(TinyMLP, trial.config, 4, fused=True)[-1]
    study = Study(HiddenNoise, executor=SimulatedExecutor(1), fuse=4)
    with pytest.warns(TrialsFailedWarning):
        result = study.run(GridSearch(FUSED_SPACE, metric="val_loss", mode="min", steps=4))
    assert result.failed
    message = " ".join(result.failed[0].error.split())
    assert "self.noise.get_state()" in message
    assert "Likely cause: self.noise (a private torch.Generator) is not in state_dict()" in message


# --------------------------------------------------------------------------- on Dask


@pytest.mark.slow
def test_dask_workers_check_resuming(client, tmp_path):
    with Study(
        ForgetsTheOptimizer, name="forgets", storage=tmp_path, client=client, resources={"GPU": 1}
    ) as study:
        with pytest.warns(TrialsFailedWarning):
            result = study.run(GridSearch(SPACE, metric="val_loss", mode="min", steps=4), timeout=120)
        assert result.failed and OPTIMIZER_CAUSE in " ".join(result.failed[0].error.split())
    with Study(MnistStyle, name="correct", storage=tmp_path, client=client, resources={"GPU": 1}) as study:
        result = study.run(GridSearch(SPACE, metric="val_loss", mode="min", steps=4), timeout=120)
    assert not result.failed
    for trial in result._trials:
        assert trial.metrics == run_alone(MnistStyle, trial.config, 4)[-1]


@pytest.mark.slow
def test_a_worker_the_check_takes_down_trains_its_stages_again_without_it(tmp_path):
    """The check's second trainer may not fit in memory and the process be killed: the stages
    of a task whose worker died train again without the check, so the trials complete with
    the results they have alone."""
    config = {"lr": dt.Steps([0.05, 0.02], [2])}
    with (
        dask.config.set({"distributed.scheduler.allowed-failures": 0}),
        local_client(warm_up=False, silence_logs=50) as client,
        Study(TooBigForTwo, name="too-big", storage=tmp_path, client=client) as study,
    ):
        metrics = study.submit(config, 4).result(timeout=180)
    assert metrics == run_alone(TooBigForTwo, config, 4, check_resume=0)[-1]
