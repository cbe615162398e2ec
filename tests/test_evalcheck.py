"""The check that `Trainer.evaluate` leaves the training state alone (`dagtune.evalcheck`).

The trainers live here; Dask workers import this module to unpickle them (``tests/`` is on
their sys.path, see conftest)."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn.functional import cross_entropy

import dagtune as dt
from dagtune.algos import GridSearch
from dagtune.evalcheck import EvaluateChangedStateError, EvaluateChecks, training_state
from dagtune.sim import SimulatedExecutor
from dagtune.study import Study, TrialError, run_alone
from dagtune.trainer import build_trainer, isolated_rng, kept_training_modes

CONFIG = {"lr": 0.1}


class Tiny(dt.Trainer):
    """A linear classifier behind dropout, on fixed random data, with a correct `evaluate`
    (which draws from torch's global generator: allowed, dagtune isolates it)."""

    state_dicts = 0  # calls of state_dict in this process

    def __init__(self, seed: int = 0):
        data = torch.Generator().manual_seed(seed)
        self.x = torch.randn(64, 4, generator=data)
        self.y = (self.x.sum(1) > 0).long()
        self.model = nn.Sequential(nn.Dropout(0.2), nn.Linear(4, 2))
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1, momentum=0.9)

    def setup(self, hp):
        for group in self.optimizer.param_groups:
            group["lr"] = hp["lr"]

    def train(self):
        self.optimizer.zero_grad()
        loss = cross_entropy(self.model(self.x), self.y)
        loss.backward()
        self.optimizer.step()
        return {"loss": loss.item()}

    def evaluate(self):
        self.model.eval()
        with torch.no_grad():
            torch.rand(3)  # a random draw while evaluating does not shift training
            loss = cross_entropy(self.model(self.x), self.y).item()
        self.model.train()
        return {"val_loss": loss}

    def state_dict(self):
        type(self).state_dicts += 1
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state):
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])


class LeavesEvalMode(Tiny):
    """Leaves the model in eval mode, as PyTorch's examples do: dagtune puts it back (its
    `train` relies on the mode it finds: dropout would be off from then on otherwise)."""

    def evaluate(self):
        self.model.eval()
        with torch.no_grad():
            return {"val_loss": cross_entropy(self.model(self.x), self.y).item()}


class StepsWhileEvaluating(Tiny):
    """Evaluates after a training step of its own: the model and the optimizer change."""

    def evaluate(self):
        self.train()
        return super().evaluate()


class DrawsFromItsGenerator(Tiny):
    """Keeps a private generator (saved in its state) and draws from it while evaluating."""

    def __init__(self, seed: int = 0):
        super().__init__(seed)
        self.generator = torch.Generator().manual_seed(seed)

    def evaluate(self):
        torch.rand(1, generator=self.generator)
        return super().evaluate()

    def state_dict(self):
        return {**super().state_dict(), "generator": self.generator.get_state()}

    def load_state_dict(self, state):
        super().load_state_dict(state)
        self.generator.set_state(state["generator"])


BROKEN = [
    (
        StepsWhileEvaluating,
        [
            "state_dict()['model']['1.weight']",
            "state_dict()['model']['1.bias']",
            "state_dict()['optimizer']['state'][0]['momentum_buffer']",
            "state_dict()['optimizer']['state'][1]['momentum_buffer']",
        ],
    ),
    (DrawsFromItsGenerator, ["state_dict()['generator']"]),
]


@pytest.mark.parametrize(("trainer", "keys"), BROKEN)
def test_run_alone_names_what_evaluate_changed(trainer, keys):
    with pytest.raises(TrialError, match="run_alone failed at step 1:") as failure:
        run_alone(trainer, CONFIG, 4)
    assert f"evaluate() changed the training state: {', '.join(keys)}." in str(failure.value)


@pytest.mark.parametrize(("trainer", "keys"), BROKEN)
def test_a_study_fails_the_trial_and_names_what_evaluate_changed(trainer, keys):
    study = Study(trainer, executor=SimulatedExecutor(2))
    with pytest.warns(dt.TrialsFailedWarning, match="1 of 1 trials failed"):
        result = study.run(GridSearch([CONFIG], metric="val_loss", mode="min", steps=4))
    (trial,) = study.coordinator.trials.values()
    assert trial.status == "failed" and trial.reported == 0
    assert f"evaluate() changed the training state: {', '.join(keys)}." in trial.error
    assert result.best is None


def test_with_the_check_off_a_broken_evaluate_goes_unnoticed():
    study = Study(StepsWhileEvaluating, executor=SimulatedExecutor(1), check_evaluate=0, eval_every=4)
    alone = run_alone(StepsWhileEvaluating, CONFIG, 4, check_evaluate=0)
    assert study.submit(CONFIG, 4).result() != alone[-1]  # evaluated at step 4 only: it differs


def test_an_evaluate_that_leaves_eval_mode_is_put_back_and_passes():
    """PyTorch's idiom: ``model.eval()`` in evaluate, never switched back. dagtune restores
    every module's mode, so the trial trains as if it had never been evaluated."""
    alone = run_alone(LeavesEvalMode, CONFIG, 6)
    study = Study(LeavesEvalMode, executor=SimulatedExecutor(1), eval_every=3)
    assert study.submit(CONFIG, 6).result() == alone[-1]
    never_evaluated = build_trainer(LeavesEvalMode, {}, 0)
    never_evaluated.setup(CONFIG)
    for _ in range(6):
        never_evaluated.train()
    with isolated_rng():
        assert never_evaluated.evaluate() == {"val_loss": alone[-1]["val_loss"]}


def test_modes_are_put_back_module_by_module_also_when_evaluate_raises():
    trainer = LeavesEvalMode()
    trainer.model[0].eval()  # the dropout off, the linear layer training: a mixed state
    trainer.others = [nn.BatchNorm1d(2)]  # modules in a list attribute count too
    trainer.others[0].eval()
    modes = [m.training for m in trainer.model.modules()], trainer.others[0].training
    with kept_training_modes(trainer):
        trainer.evaluate()
        trainer.others[0].train()
    assert ([m.training for m in trainer.model.modules()], trainer.others[0].training) == modes
    with pytest.raises(RuntimeError, match="evaluate failed"), kept_training_modes(trainer):
        trainer.model.train()
        raise RuntimeError("evaluate failed")
    assert [m.training for m in trainer.model.modules()] == modes[0]


def test_a_correct_evaluate_passes_and_is_checked_only_at_first():
    Tiny.state_dicts = 0
    assert len(run_alone(Tiny, CONFIG, 10, check_resume=0)) == 10
    assert Tiny.state_dicts == 2 * 3  # before and after each of the first 3 evaluations, no more
    Tiny.state_dicts = 0
    run_alone(Tiny, CONFIG, 10, check_evaluate=0, check_resume=0)
    assert Tiny.state_dicts == 0


def test_each_worker_checks_its_first_evaluations_once_per_model():
    """Two workers, four trials: each worker checks 2 evaluations, then none."""
    Tiny.state_dicts = 0
    study = Study(Tiny, executor=SimulatedExecutor(2), check_evaluate=2, check_resume=0)
    space = [{"lr": lr} for lr in (0.1, 0.05, 0.02, 0.01)]
    result = study.run(GridSearch(space, metric="val_loss", mode="min", steps=3))
    assert all(t.status == "completed" for t in study.coordinator.trials.values())
    saves = sum(len(node.checkpoints) for node in study.plan.nodes.values())
    assert Tiny.state_dicts == saves + 2 * 2 * 2  # checkpoints, and 2 checks on each worker
    assert result.report["executed_steps"] == 12


def test_a_failed_check_fails_the_trial_without_a_retry():
    """A broken evaluate breaks it again: the stage is not trained again, whatever the
    study's max_retries."""
    calls = []  # of state_dict(), which each training of the stage calls to check evaluate
    for retries in (0, 3):
        before = StepsWhileEvaluating.state_dicts
        study = Study(StepsWhileEvaluating, executor=SimulatedExecutor(1), max_retries=retries)
        with pytest.warns(dt.TrialsFailedWarning, match="1 of 1 trials failed"):
            study.run(GridSearch([CONFIG], metric="val_loss", mode="min", steps=4))
        calls.append(StepsWhileEvaluating.state_dicts - before)
    assert calls[0] == calls[1] > 0


def test_a_failed_check_counts_nothing_so_a_retry_is_checked_again():
    checks = EvaluateChecks()
    trainer = StepsWhileEvaluating()
    trainer.setup(CONFIG)
    before = training_state(trainer)
    trainer.evaluate()
    for _ in range(2):
        with pytest.raises(EvaluateChangedStateError, match=r"\['1\.weight'\]"):
            checks.verify("model", 1, before, training_state(trainer))
        assert checks.due("model", 1)
    checks.verify("model", 1, before, before)
    assert not checks.due("model", 1) and checks.due("another model", 1)


def test_the_message_names_a_few_keys_and_counts_the_rest():
    error = EvaluateChangedStateError([f"state_dict()['w{i}']" for i in range(9)], 3)
    assert "state_dict()['w5'] and 3 more." in str(error) and "w6" not in str(error)
    assert "The first 3 evaluations of each worker are checked; check_evaluate=0 turns the check off." in str(
        error
    )


@pytest.mark.parametrize("value", [-1, 1.5, True, "3"])
def test_check_evaluate_must_be_a_count(value):
    with pytest.raises(
        ValueError, match=rf"check_evaluate must be an int >= 0 \(0: no check\), got {value!r}"
    ):
        Study(Tiny, executor=SimulatedExecutor(1), check_evaluate=value)
    with pytest.raises(ValueError, match=r"check_evaluate must be an int >= 0"):
        run_alone(Tiny, CONFIG, 2, check_evaluate=value)


@pytest.mark.slow
def test_a_dask_worker_fails_the_trial_of_a_broken_evaluate(client, tmp_path):
    with Study(
        StepsWhileEvaluating, name="evalcheck", storage=tmp_path, client=client, resources={"GPU": 1}
    ) as study:
        handle = study.submit(CONFIG, 3)
        with pytest.raises(
            TrialError,
            match=r"evaluate\(\) changed the training state: state_dict\(\)\['model'\]\['1\.weight'\]",
        ):
            handle.result(timeout=60)
        good = Study(Tiny, name="evalcheck-ok", storage=tmp_path, client=client, resources={"GPU": 1})
        with good:
            assert good.submit(CONFIG, 3).result(timeout=60) == run_alone(Tiny, CONFIG, 3)[-1]
