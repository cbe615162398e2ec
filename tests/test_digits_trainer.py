"""The digits example's trainers (the FusibleTrainer and the hand-written one) resume bit for
bit from a checkpoint, learn, and train exactly alike."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from digits import DigitsTrainer
from digits_trainer import HandWrittenDigitsTrainer

import dagtune as dt
from dagtune.checkpoints import CheckpointStore
from dagtune.trainer import build_trainer, capture_rng, isolated_rng, restore_rng

SEED = 3
KWARGS = {"hidden": 8}
IDENTITY, NODE = "d1915d1915d19150", "0123456789abcdef"
START = {"lr": 0.05, "momentum": 0.5, "batch_size": 64, "weight_decay": 1e-4}
CHANGE = {"batch_size": 32, "momentum": 0.9}


def values(step: int, change_step: int) -> dict:
    return {**START, **CHANGE} if step >= change_step else dict(START)


def run(trainer, start: int, end: int, change_step: int, evaluate: bool = True) -> list[dict]:
    """Steps ``[start, end)`` the way a dagtune stage drives them: full values at the start,
    only the changed ones later, evaluation with the RNG isolated."""
    metrics = []
    for step in range(start, end):
        if step == start:
            trainer.setup(values(step, change_step))
        elif step == change_step:
            trainer.setup(CHANGE)
        result = trainer.train()
        if evaluate:
            with isolated_rng():
                result.update(trainer.evaluate())
        metrics.append(result)
    return metrics


def disturb_global_rngs() -> None:
    random.random()
    np.random.random(7)
    torch.rand(11)


@pytest.fixture(params=[DigitsTrainer, HandWrittenDigitsTrainer], ids=["fusible", "hand-written"])
def trainer_class(request):
    return request.param


def resumed_run(cls, tmp_path, change_step: int, restore: bool = True) -> tuple[list[dict], dt.Trainer]:
    first = build_trainer(cls, KWARGS, SEED)
    metrics = run(first, 0, 3, change_step)
    store = CheckpointStore(str(tmp_path / "runs"))
    store.save(IDENTITY, NODE, 3, {"trainer": first.state_dict(), "rng": capture_rng()})
    del first
    disturb_global_rngs()

    second = build_trainer(cls, KWARGS, SEED)
    saved = store.load(IDENTITY, NODE, 3)
    second.load_state_dict(saved["trainer"])
    if restore:
        restore_rng(saved["rng"])
    return metrics + run(second, 3, 6, change_step), second


@pytest.mark.parametrize("change_step", [3, 4], ids=["change-at-resume", "change-after-resume"])
def test_resumed_training_is_bit_exact(trainer_class, tmp_path, change_step):
    straight = build_trainer(trainer_class, KWARGS, SEED)
    expected = run(straight, 0, 6, change_step)
    got, resumed = resumed_run(trainer_class, tmp_path, change_step)
    assert got == expected  # exact equality of every float, epoch by epoch
    assert resumed.batches.batch_size == CHANGE["batch_size"]
    for a, b in zip(straight.model.parameters(), resumed.model.parameters()):
        assert torch.equal(a, b)
    assert all(isinstance(v, float) for m in got for v in m.values())


def test_without_the_rng_state_the_run_differs(trainer_class, tmp_path):
    """The control: dropout draws from torch's RNG, so the RNG state must travel."""
    straight = run(build_trainer(trainer_class, KWARGS, SEED), 0, 6, change_step=4)
    got, _ = resumed_run(trainer_class, tmp_path, change_step=4, restore=False)
    assert got[:3] == straight[:3]
    assert got[3:] != straight[3:]


def test_evaluating_does_not_change_training(trainer_class):
    with_eval = run(build_trainer(trainer_class, KWARGS, SEED), 0, 3, change_step=2)
    without = run(build_trainer(trainer_class, KWARGS, SEED), 0, 3, change_step=2, evaluate=False)
    assert [m["loss"] for m in with_eval] == [m["loss"] for m in without]


def test_learns_well_above_chance(trainer_class):
    trainer = build_trainer(trainer_class, {}, seed=0)
    trainer.setup({"lr": 0.1, "momentum": 0.9, "batch_size": 64, "weight_decay": 0.0})
    losses = [trainer.train()["loss"] for _ in range(5)]
    metrics = trainer.evaluate()
    assert trainer.model.training  # evaluate put the model back in training mode
    assert losses[-1] < losses[0] / 3
    assert metrics["val_acc"] > 0.85  # chance is 0.1
    assert metrics["val_loss"] < 0.6


def test_setup_rejects_unknown_names_and_bad_batch_sizes(trainer_class):
    trainer = trainer_class(hidden=4)
    with pytest.raises(ValueError, match="learning_rate"):
        trainer.setup({"learning_rate": 0.1})
    with pytest.raises(ValueError, match="batch_size"):
        trainer.setup({"batch_size": 32.0})


def test_the_fusible_trainer_trains_exactly_as_the_hand_written_one():
    """Same weights after every epoch; the reported training loss is the mean of per-image
    losses for one and cross-entropy's own mean for the other (equal to about 1e-8)."""
    config = dt.config.normalize_config(
        {"lr": dt.MultiStep(0.05, [3], 0.1), "momentum": 0.9, "batch_size": dt.Steps([64, 128], [2])}
    )

    def history(cls):
        trainer = build_trainer(cls, KWARGS, SEED)
        steps = []
        for step in range(5):
            trainer.setup({name: sequence(step) for name, sequence in config.items()})
            loss = trainer.train()["loss"]
            with isolated_rng():
                metrics = trainer.evaluate()
            steps.append((loss, metrics, [p.detach().clone() for p in trainer.model.parameters()]))
        return steps

    for (loss, metrics, weights), (loss_by_hand, metrics_by_hand, weights_by_hand) in zip(
        history(DigitsTrainer), history(HandWrittenDigitsTrainer)
    ):
        assert metrics == metrics_by_hand
        assert loss == pytest.approx(loss_by_hand, rel=1e-6)
        assert all(torch.equal(a, b) for a, b in zip(weights, weights_by_hand))
