"""A `FusibleTrainer` that overrides a method a fused group never calls (`train_batch`,
`train`: a fused group trains with one step of its own) cannot train fused: the fused group
refuses it naming the method, so the fusion check turns fusion off with a `FusionWarning` and
`run_alone(..., fused=True)` fails, instead of training without the override (gradient
clipping that only unfused training clips)."""

from __future__ import annotations

import pytest
import torch
from fusion_helpers import TinyMLP

import dagtune as dt
from dagtune.algos import GridSearch
from dagtune.fusion import FusedGroup, FusionError, check_fusion
from dagtune.sim import SimulatedExecutor
from dagtune.study import Study, TrialError, run_alone
from dagtune.trainer import build_trainer

CONFIG = {"lr": 0.05, "momentum": 0.9, "batch_size": 32}


class Clipped(TinyMLP):
    """Clips gradients to a norm of `max_norm` in its own `train_batch`, as users write it;
    with the default norm no first batch is clipped (the fusion check's agreement with
    unfused training cannot see it)."""

    def __init__(self, max_norm: float = 1e6, seed: int = 0):
        self.max_norm = max_norm
        super().__init__(seed=seed)

    def train_batch(self, indices):
        batch = self.batch(indices)
        self.optimizer.zero_grad(set_to_none=True)
        loss = self.loss(self.model, batch).mean()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.max_norm)
        self.optimizer.step()
        return loss.item()


class SubClipped(Clipped):
    """Inherits the override."""


class OwnTrain(TinyMLP):
    def train(self):
        return super().train()


@pytest.mark.parametrize(
    ("cls", "method", "owner"),
    [
        (Clipped, "train_batch", "Clipped"),
        (SubClipped, "train_batch", "Clipped"),
        (OwnTrain, "train", "OwnTrain"),
    ],
)
def test_a_fused_group_refuses_a_trainer_overriding_a_method_it_never_calls(cls, method, owner):
    host = build_trainer(cls, {}, 0)
    with pytest.raises(FusionError, match=rf"overrides FusibleTrainer\.{method}\(\) \(in {owner}\)"):
        FusedGroup.from_states(host, [host.state_dict()] * 2)


def test_the_fusion_check_refuses_it_even_without_the_agreement_check():
    for agreement in (True, False):
        verdict = check_fusion(Clipped, {}, 0, CONFIG, agreement=agreement)
        assert not verdict.ok
        assert "Clipped cannot train fused" in verdict.reason
        assert "overrides FusibleTrainer.train_batch()" in verdict.reason


def test_run_alone_fused_fails_naming_the_method():
    with pytest.raises(TrialError, match=r"overrides FusibleTrainer\.train_batch\(\)"):
        run_alone(Clipped, CONFIG, 1, fused=True)


def test_a_fused_study_of_it_trains_unfused_with_a_warning_and_clips():
    space = dt.Grid({"lr": [0.05, 0.02], "momentum": [0.9], "batch_size": [32]})
    study = Study(Clipped, executor=SimulatedExecutor(1), fuse=4, trainer_kwargs={"max_norm": 0.1})
    with pytest.warns(dt.FusionWarning, match=r"overrides FusibleTrainer\.train_batch\(\)"):
        study.run(GridSearch(space, metric="val_acc", steps=2))
    for trial in study.coordinator.trials.values():
        assert trial.status == "completed"
        assert [m for _, m in trial.curve] == run_alone(Clipped, trial.config, 2, {"max_norm": 0.1})
