"""Fused execution against unfused training: FusedGroup, the fused optimizers, stack/split.

On this CPU the 30-64-2 MLP trains fused exactly as unfused with torch.optim (SGD and AdamW,
every option), so whole trajectories are compared bit for bit; the CNN's fused convolutions
round differently from unfused ones, so there each member is compared with the same trial
fused alone (K = 1) bit for bit and with unfused training within a tolerance.
"""

from __future__ import annotations

import io
import math

import pytest
import torch
from fusion_helpers import TinyAdamW, TinyCNN, TinyMLP, assert_members_match_fused, step_members_and_fused
from torch import nn

import dagtune as dt
from dagtune.fusion import FusedGroup, FusionError, same_state, split, stack
from dagtune.trainer import build_trainer

STEPS = 3


def unfused(cls, kwargs, schedule, steps=STEPS):
    """Train one trial unfused; `schedule` maps a step to the values set before it. Returns
    (metrics per step, final state, torch RNG state)."""
    trainer = build_trainer(cls, kwargs, 0)
    history = []
    for step in range(steps):
        if step in schedule:
            trainer.setup(schedule[step])
        metrics = trainer.train()
        with dt.isolated_rng():
            metrics.update(trainer.evaluate())
        history.append(metrics)
    return history, trainer.state_dict(), torch.get_rng_state()


def fused(cls, kwargs, schedules, steps=STEPS, states=None):
    """Train len(schedules) trials as one FusedGroup (from `states`, or from scratch)."""
    host = build_trainer(cls, kwargs, 0)
    group = FusedGroup.from_states(host, states or [host.state_dict()] * len(schedules))
    histories = [[] for _ in schedules]
    for step in range(steps):
        group.setup([schedule.get(step, {}) for schedule in schedules])
        for history, metrics in zip(histories, group.train()):
            history.append(metrics)
        for member, history in enumerate(histories):
            with dt.isolated_rng():
                history[-1].update(group.evaluate(member))
    return histories, [group.state_dict(k) for k in range(len(schedules))], torch.get_rng_state()


SGD_CASES = {
    "momentum-and-decay-mixes": ({}, [(0.1, 0.9, 0.0), (0.05, 0.0, 1e-3), (0.2, 0.5, 1e-4)]),
    "nesterov": ({"nesterov": True}, [(0.1, 0.9, 0.0), (0.05, 0.0, 1e-3), (0.02, 0.5, 1e-4)]),
    "dampening": ({"dampening": 0.3}, [(0.1, 0.9, 1e-3), (0.05, 0.7, 0.0), (0.02, 0.5, 1e-4)]),
    "maximize": ({"maximize": True}, [(1e-3, 0.9, 0.0), (2e-3, 0.0, 1e-3), (1e-3, 0.5, 1e-4)]),
    "dropout": ({"dropout": 0.3}, [(0.1, 0.9, 0.0), (0.3, 0.0, 1e-2), (0.2, 0.5, 1e-4)]),
}


@pytest.mark.parametrize("case", SGD_CASES, ids=list(SGD_CASES))
def test_fused_sgd_is_torch_sgd_bit_for_bit(case):
    kwargs, values = SGD_CASES[case]
    schedules = [
        {0: {"lr": lr, "momentum": momentum, "weight_decay": decay, "batch_size": 32}, 2: {"momentum": 0.8}}
        for lr, momentum, decay in values
    ]
    histories, states, rng = fused(TinyMLP, kwargs, schedules)
    for member, schedule in enumerate(schedules):
        expected, state, expected_rng = unfused(TinyMLP, kwargs, schedule)
        assert histories[member] == expected
        assert same_state(states[member], state)
        assert torch.equal(rng, expected_rng)  # the dropout draws advanced the RNG alike


@pytest.mark.parametrize("amsgrad", [False, True], ids=["adamw", "amsgrad"])
def test_fused_adamw_is_torch_adamw_bit_for_bit(amsgrad):
    schedules = [
        {0: {"lr": 0.01, "weight_decay": 0.0, "batch_size": 32}},
        {0: {"lr": 0.003, "beta1": 0.8, "weight_decay": 0.1, "batch_size": 32}, 1: {"beta2": 0.99}},
        {0: {"lr": 0.02, "eps": 1e-6, "weight_decay": 0.01, "batch_size": 32}, 2: {"lr": 0.002}},
    ]
    kwargs = {"amsgrad": amsgrad, "dropout": 0.2}
    histories, states, _ = fused(TinyAdamW, kwargs, schedules)
    for member, schedule in enumerate(schedules):
        expected, state, _ = unfused(TinyAdamW, kwargs, schedule)
        assert histories[member] == expected
        assert same_state(states[member], state)


OPTIMIZERS = {
    "sgd": (dt.SGD(lr=0.1, momentum=0.9), ["lr", "momentum", "weight_decay", "dampening"]),
    "nesterov": (
        dt.SGD(lr=0.1, momentum=0.9, nesterov=True, maximize=True),
        ["lr", "momentum", "weight_decay"],
    ),
    "adamw": (dt.AdamW(), ["lr", "beta1", "beta2", "eps", "weight_decay"]),
    "amsgrad": (dt.AdamW(amsgrad=True, maximize=True), ["lr", "beta1", "beta2", "weight_decay"]),
}


@pytest.mark.parametrize("name", OPTIMIZERS, ids=list(OPTIMIZERS))
def test_fused_optimizers_update_every_shape_as_torch_does(name):
    """Given the same gradients, every member's update is torch.optim's, bit for bit, for
    parameters of any size (vectorized kernels and their scalar tails alike) and with
    hyper-parameters that differ between members and change between steps (zero momentum or
    weight decay for some members, a momentum buffer created late)."""
    spec, fields = OPTIMIZERS[name]
    generator = torch.Generator().manual_seed(7)
    shapes = [(1,), (7,), (13, 7), (3, 5, 17), (64, 30)]
    start = [torch.randn(shape, generator=generator) for shape in shapes]
    values = [
        {
            "lr": 0.1,
            "momentum": 0.0,
            "weight_decay": 0.0,
            "dampening": 0.0,
            "beta1": 0.9,
            "beta2": 0.999,
            "eps": 1e-8,
        },
        {
            "lr": 0.03,
            "momentum": 0.9,
            "weight_decay": 1e-3,
            "dampening": 0.1,
            "beta1": 0.8,
            "beta2": 0.99,
            "eps": 1e-6,
        },
        {
            "lr": 0.007,
            "momentum": 0.5,
            "weight_decay": 0.1,
            "dampening": 0.0,
            "beta1": 0.5,
            "beta2": 0.9,
            "eps": 1e-3,
        },
    ]
    later = {"momentum": 0.7, "weight_decay": 0.0, "lr": 0.05, "beta1": 0.85, "beta2": 0.95, "eps": 1e-7}
    members = [[p.clone().requires_grad_() for p in start] for _ in values]
    optimizers = [spec.build(params) for params in members]
    stacked = [torch.stack(list(ps)).detach().requires_grad_() for ps in zip(*members)]
    groups = [{**optimizer.state_dict()["param_groups"][0]} for optimizer in optimizers]
    fused_optimizer = spec.fused(stacked, groups, {}, {})
    for member, (optimizer, member_values) in enumerate(zip(optimizers, values)):
        for field in fields:
            for group in optimizer.param_groups:
                spec.set(group, field, member_values[field])
            fused_optimizer.set(member, field, member_values[field])
    for step in range(4):
        if step == 2:  # member 0 starts its momentum (a buffer created late), member 2 stops decaying
            for member, field in (
                (0, "momentum"),
                (2, "weight_decay"),
                (1, "lr"),
                (0, "beta1"),
                (2, "beta2"),
            ):
                if field in fields:
                    spec.set(optimizers[member].param_groups[0], field, later[field])
                    fused_optimizer.set(member, field, later[field])
        step_members_and_fused(members, optimizers, stacked, fused_optimizer, shapes, generator)
    assert_members_match_fused(members, optimizers, stacked, fused_optimizer)


def _trained_states(cls, schedules, kwargs=None):
    return fused(cls, kwargs or {}, [{0: s} for s in schedules], steps=2)[1]


class TiedNet(nn.Module):
    """An MLP whose two hidden layers share one weight (two state-dict keys, one tensor)."""

    def __init__(self, features: int, hidden: int):
        super().__init__()
        self.first = nn.Linear(features, hidden)
        self.middle = nn.Linear(hidden, hidden)
        self.again = nn.Linear(hidden, hidden)
        self.again.weight = self.middle.weight
        self.out = nn.Linear(hidden, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.again(self.middle(self.first(x).relu()).relu()).relu())


class Tied(TinyMLP):
    def make_model(self, features, hidden):
        return TiedNet(features, hidden)


@pytest.mark.parametrize("cls", [TinyMLP, TinyAdamW, Tied], ids=["sgd", "adamw", "tied"])
def test_split_of_stack_is_exact(cls):
    schedules = [
        {"lr": 0.1, "batch_size": 32},
        {"lr": 0.05, "batch_size": 32},
        {"lr": 0.02, "batch_size": 32},
    ]
    if cls is not TinyAdamW:
        schedules[1]["momentum"] = 0.0  # no momentum buffer: its optimizer state stays empty
    states = _trained_states(cls, schedules)
    fused_state = stack(states)
    for member, state in enumerate(states):
        again = split(fused_state, member)
        assert same_state(again, state)
        first, second = io.BytesIO(), io.BytesIO()
        torch.save(again, first)
        torch.save(state, second)
        assert first.getvalue() == second.getvalue()  # the very same checkpoint bytes
    if cls is Tied:
        assert fused_state["model"]["again.weight"] is fused_state["model"]["middle.weight"]
    # a fused state survives its own checkpoint round trip (weights_only) unchanged
    buffer = io.BytesIO()
    torch.save(fused_state, buffer)
    buffer.seek(0)
    assert same_state(torch.load(buffer, weights_only=True), fused_state)


def test_stack_refuses_states_that_cannot_be_one_group():
    states = _trained_states(TinyMLP, [{"lr": 0.1, "batch_size": 32}] * 2)
    other = build_trainer(TinyMLP, {}, 0).state_dict()  # epoch 0, the others are at epoch 2
    with pytest.raises(ValueError, match="data order"):
        stack([states[0], other])
    wider = build_trainer(TinyMLP, {"hidden": 65}, 0).state_dict()
    wider["batches"] = states[0]["batches"]
    with pytest.raises(ValueError, match=r"0\.weight"):
        stack([states[0], wider])
    with pytest.raises(ValueError, match="keys"):
        stack([{"model": {}}])


@pytest.mark.parametrize("cls", [TinyMLP, TinyCNN], ids=["mlp", "cnn"])
def test_a_diverging_member_leaves_the_others_bitwise_unchanged(cls):
    values = [0.05, 1e30, 0.1]  # the middle member's steps overflow to inf and NaN
    schedules = [{0: {"lr": lr, "batch_size": 32}} for lr in values]
    histories, states, _ = fused(cls, {}, schedules)
    assert not math.isfinite(histories[1][-1]["loss"])
    for member in (0, 2):
        alone, state, _ = fused(cls, {}, [schedules[member]])
        assert histories[member] == alone[0]
        assert same_state(states[member], state[0])


def test_a_nan_loss_does_not_reach_the_other_members_gradients():
    start = build_trainer(TinyMLP, {}, 0).state_dict()
    poisoned = split(stack([start]), 0)
    poisoned["model"]["0.weight"][0, 0] = float("nan")  # NaN loss from the first batch on
    schedule = {0: {"lr": 0.1, "batch_size": 32}}
    histories, states, _ = fused(TinyMLP, {}, [schedule] * 3, states=[start, poisoned, start])
    assert math.isnan(histories[1][0]["loss"])
    alone, state, _ = unfused(TinyMLP, {}, schedule)
    for member in (0, 2):
        assert histories[member] == alone
        assert same_state(states[member], state)


def test_dropout_masks_are_shared_like_unfused_training():
    """randomness="same": every member draws the mask its unfused run draws."""
    schedule = {0: {"lr": 0.1, "batch_size": 32, "dropout": 0.5}}
    histories, _, rng = fused(TinyMLP, {}, [schedule, schedule])
    expected, _, expected_rng = unfused(TinyMLP, {}, schedule)
    assert histories == [expected, expected]
    assert torch.equal(rng, expected_rng)
    without, _, _ = unfused(TinyMLP, {}, {0: {**schedule[0], "dropout": 0.0}})
    assert without != expected  # the control: the masks matter


@pytest.mark.parametrize("cls", [TinyMLP, TinyCNN], ids=["mlp", "cnn"])
def test_members_leaving_the_group_leave_the_rest_unchanged(cls):
    schedules = [{0: {"lr": lr, "batch_size": 32}} for lr in (0.01, 0.02, 0.05, 0.1)]
    host = build_trainer(cls, {"dropout": 0.2}, 0)
    group = FusedGroup.from_states(host, [host.state_dict()] * 4)
    group.setup([s[0] for s in schedules])
    group.train()
    group.keep([3, 1])
    for _ in range(STEPS - 1):
        group.train()
    for member, original in ((0, 3), (1, 1)):
        _, alone, _ = fused(cls, {"dropout": 0.2}, [schedules[original]])
        assert same_state(group.state_dict(member), alone[0])


@pytest.mark.parametrize("size", [2, 3, 5])
def test_a_cnn_member_does_not_depend_on_its_group(size):
    schedules = [
        {0: {"lr": 0.02 * (k + 1), "momentum": 0.9 - 0.1 * k, "batch_size": 32}} for k in range(size)
    ]
    histories, states, _ = fused(TinyCNN, {}, schedules)
    for member, schedule in enumerate(schedules):
        alone, state, _ = fused(TinyCNN, {}, [schedule])
        assert histories[member] == alone[0]
        assert same_state(states[member], state[0])
        # against unfused training: the convolutions' gradients round differently
        _, unfused_state, _ = unfused(TinyCNN, {}, schedule)
        for key, value in unfused_state["model"].items():
            torch.testing.assert_close(states[member]["model"][key], value, rtol=0, atol=1e-5)


def test_setup_refuses_members_that_differ_in_a_non_fusible_value():
    host = build_trainer(TinyMLP, {}, 0)
    group = FusedGroup.from_states(host, [host.state_dict()] * 2)
    with pytest.raises(FusionError, match="batch_size"):
        group.setup([{"lr": 0.1, "batch_size": 32}, {"lr": 0.1, "batch_size": 16}])
    with pytest.raises(ValueError, match="'lr'"):
        group.setup([{"lr": "fast"}, {"lr": 0.1}])
    with pytest.raises(ValueError, match="no hyper-parameter 'width'"):
        group.setup([{"width": 3}, {"width": 3}])


def test_declarations_are_checked_when_the_trainer_is_built():
    class Misnamed(TinyMLP):
        fusible = {"lr": "learning_rate"}  # noqa: RUF012

    with pytest.raises(ValueError, match="learning_rate"):
        Misnamed()
    trainer = TinyMLP()
    with pytest.raises(ValueError, match="'momentum'"):
        trainer.setup({"momentum": float("nan")})
    with pytest.raises(ValueError, match="no hyper-parameter 'lr_decay'"):
        trainer.setup({"lr_decay": 0.1})


def test_a_wide_mlp_fused_is_unfused_within_the_stated_tolerance():
    """784-1024-2: the batched products of the fused path sum in another order than unfused
    ``addmm``; measured on this CPU, the weights differ by at most 5e-8 after 5 epochs (the
    contract in docs/fusion.md states 1e-6)."""
    kwargs = {"features": 784, "hidden": 1024}
    schedules = [{0: {"lr": 0.05, "batch_size": 32}}, {0: {"lr": 0.02, "momentum": 0.5, "batch_size": 32}}]
    histories, states, _ = fused(TinyMLP, kwargs, schedules, steps=5)
    for member, schedule in enumerate(schedules):
        expected, state, _ = unfused(TinyMLP, kwargs, schedule, steps=5)
        for key, value in state["model"].items():
            torch.testing.assert_close(states[member]["model"][key], value, rtol=0, atol=1e-6)
        for got, want in zip(histories[member], expected):
            assert got == pytest.approx(want, rel=0, abs=1e-6)
        assert not same_state(states[member], state)  # the control: not bitwise (else say so)
