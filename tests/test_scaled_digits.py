"""The width-scaled digits trainer: widths differ only where they should, it trains through
``dt.run_alone`` deterministically, and it resumes bit for bit from a checkpoint."""

from __future__ import annotations

import io

import pytest
import torch
from scaled_digits import BASE_WIDTH, ScaledDigitsTrainer

import dagtune as dt
from dagtune.trainer import build_trainer

CONFIG = {"lr": 0.1, "momentum": dt.Steps([0.8, 0.9], [1]), "batch_size": 64}


def parameter_shapes(trainer: ScaledDigitsTrainer) -> dict[str, tuple[int, ...]]:
    return {name: tuple(p.shape) for name, p in trainer.model.named_parameters()}


def lr_of(trainer: ScaledDigitsTrainer) -> dict[str, float]:
    group_of = {id(p): g for g in trainer.optimizer.param_groups for p in g["params"]}
    return {name: group_of[id(p)]["lr"] for name, p in trainer.model.named_parameters()}


def test_widths_differ_only_in_the_hidden_channels():
    for scale in (1, 2, 4, 8):
        width = BASE_WIDTH // scale
        trainer = build_trainer(ScaledDigitsTrainer, {"scale": scale}, seed=0)
        assert parameter_shapes(trainer) == {
            "0.weight": (width, 1, 3, 3),  # one input channel at every width
            "0.bias": (width,),
            "3.weight": (2 * width, width, 3, 3),
            "3.bias": (2 * width,),
            "7.weight": (10, 2 * width * 4),  # ten classes at every width
            "7.bias": (10,),
        }
        trainer.setup({"lr": 0.1})
        # SGD under muP: vector-like parameters (input weights, biases, readout weights) get
        # lr / scale, the hidden convolution lr, the readout bias (fixed) lr.
        assert lr_of(trainer) == pytest.approx(
            {
                "0.weight": 0.1 / scale,
                "0.bias": 0.1 / scale,
                "3.weight": 0.1,
                "3.bias": 0.1 / scale,
                "7.weight": 0.1 / scale,
                "7.bias": 0.1,
            }
        )
        assert trainer.model[7].width_mult == 1 / scale
        standard = build_trainer(ScaledDigitsTrainer, {"scale": scale, "parametrization": "sp"}, seed=0)
        standard.setup({"lr": 0.1})
        assert parameter_shapes(standard) == parameter_shapes(trainer)
        assert set(lr_of(standard).values()) == {0.1}


def test_mup_and_sp_start_from_the_same_weights_but_for_the_mup_zeros():
    mup = build_trainer(ScaledDigitsTrainer, {"scale": 4}, seed=0).model.state_dict()
    sp = build_trainer(ScaledDigitsTrainer, {"scale": 4, "parametrization": "sp"}, seed=0).model.state_dict()
    assert torch.equal(mup["0.weight"], sp["0.weight"]) and torch.equal(mup["3.weight"], sp["3.weight"])
    assert not any(mup[name].any() for name in ("0.bias", "3.bias", "7.weight", "7.bias"))
    assert sp["7.weight"].any()


def test_it_trains_through_run_alone_deterministically_and_learns():
    kwargs = {"scale": 8}
    first = dt.run_alone(ScaledDigitsTrainer, CONFIG, 3, trainer_kwargs=kwargs, seed=1)
    again = dt.run_alone(ScaledDigitsTrainer, CONFIG, 3, trainer_kwargs=kwargs, seed=1)
    assert first == again
    assert first[-1]["val_acc"] > 0.8 and first[-1]["val_loss"] < first[0]["val_loss"]
    other_seed = dt.run_alone(ScaledDigitsTrainer, CONFIG, 3, trainer_kwargs=kwargs, seed=2)
    assert other_seed != first


def test_a_resumed_trainer_continues_bit_for_bit():
    kwargs = {"scale": 4}
    reference = dt.run_alone(ScaledDigitsTrainer, CONFIG, 3, trainer_kwargs=kwargs, seed=0)
    trainer = build_trainer(ScaledDigitsTrainer, kwargs, seed=0)
    trainer.setup({"lr": 0.1, "momentum": 0.8, "batch_size": 64})
    trainer.train()
    buffer = io.BytesIO()
    torch.save({"trainer": trainer.state_dict(), "rng": dt.capture_rng()}, buffer)
    buffer.seek(0)
    state = torch.load(buffer, weights_only=True)
    resumed = build_trainer(ScaledDigitsTrainer, kwargs, seed=0)
    resumed.load_state_dict(state["trainer"])
    dt.restore_rng(state["rng"])
    resumed.setup({"lr": 0.1, "momentum": 0.9, "batch_size": 64})
    metrics = [{**resumed.train(), **resumed.evaluate()} for _ in range(2)]
    assert metrics == reference[1:]


def test_unknown_hyper_parameters_and_bad_scales_are_refused():
    trainer = build_trainer(ScaledDigitsTrainer, {"scale": 8}, seed=0)
    with pytest.raises(ValueError, match=r"has no hyper-parameter \['dropout'\]"):
        trainer.setup({"dropout": 0.1})
    with pytest.raises(ValueError, match=r"base 64 / scale 3 = 21\.3+ is not a whole width"):
        build_trainer(ScaledDigitsTrainer, {"scale": 3}, seed=0)
