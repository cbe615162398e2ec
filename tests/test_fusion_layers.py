"""Fused groups of real models: every normalization layer, attention with dropout on
non-contiguous activations, recurrent layers, buffers re-assigned in forward. Each member of a
group is bit for bit the same trial trained fused alone (K = 1), whatever K and its partners,
and agrees with unfused training within the tolerance docs/fusion.md states; the fusion check
(`check_fusion`) passes them, and names the layer of the ones it must refuse.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from fusion_helpers import KINDS, AdamKinds, GroupedKinds, Kinds, TinyCNN
from torch import nn
from torch.nn import functional as F  # noqa: N812

import dagtune as dt
from dagtune.fusion import FusedGroup, check_fusion, same_state
from dagtune.fusion._memberwise import MemberwiseLayers
from dagtune.trainer import build_trainer

STEPS = 2
#: fused (K = 1) against unfused after STEPS epochs: measured at most 6e-8 in any weight
#: (the batched linear layers round differently); the contract states 1e-6
UNFUSED_TOLERANCE = 1e-6
FUSIBLE_KINDS = sorted(set(KINDS) - {"custom-op"})


def schedules(members: int) -> list[dict]:
    return [{"lr": 0.02 * (k + 1), "momentum": 0.9 - 0.2 * (k % 2), "batch_size": 32} for k in range(members)]


def fused(cls: type, kwargs: dict, values: list[dict], steps: int = STEPS):
    """`values` trained as one group: each member's metrics per step, its final state, and
    torch's generator after."""
    host = build_trainer(cls, kwargs, 0)
    group = FusedGroup.from_states(host, [host.state_dict()] * len(values))
    group.setup(values)
    history = [group.train() for _ in range(steps)]
    states = [group.state_dict(k) for k in range(len(values))]
    return [[step[k] for step in history] for k in range(len(values))], states, torch.get_rng_state()


def unfused(cls: type, kwargs: dict, values: dict, steps: int = STEPS):
    trainer = build_trainer(cls, kwargs, 0)
    trainer.setup(values)
    history = [trainer.train() for _ in range(steps)]
    return history, trainer.state_dict(), torch.get_rng_state()


def largest_difference(a: dict, b: dict) -> float:
    return max(
        (a["model"][key].double() - value.double()).abs().max().item() for key, value in b["model"].items()
    )


@pytest.mark.parametrize("kind", FUSIBLE_KINDS)
def test_a_member_is_itself_alone_whatever_its_group_and_close_to_unfused(kind):
    values = schedules(4)
    histories, states, rng = fused(Kinds, {"kind": kind}, values)
    for member in (0, 3):
        alone, alone_states, alone_rng = fused(Kinds, {"kind": kind}, [values[member]])
        assert histories[member] == alone[0], kind
        assert same_state(states[member], alone_states[0]), kind
        assert torch.equal(rng, alone_rng)  # dropout drew what one member draws alone
        history, state, unfused_rng = unfused(Kinds, {"kind": kind}, values[member])
        assert largest_difference(states[member], state) <= UNFUSED_TOLERANCE, kind
        assert torch.equal(rng, unfused_rng), kind  # and what unfused training draws
        for got, want in zip(histories[member], history):
            assert got["loss"] == pytest.approx(want["loss"], rel=1e-6), kind


@pytest.mark.parametrize(
    "kind",
    ["batchnorm2d", "batchnorm1d", "running-mean", "gru", "lstm", "lstm-dropout", "groupnorm", "frozen"],
)
def test_these_train_fused_bit_for_bit_as_unfused(kind):
    """Normalizations, recurrent layers and re-assigned buffers run memberwise: the very
    unfused calls (this model's linear layers are small enough to agree bitwise too)."""
    values = schedules(2)
    _, states, _ = fused(Kinds, {"kind": kind}, values)
    for member, value in enumerate(values):
        _, state, _ = unfused(Kinds, {"kind": kind}, value)
        assert same_state(states[member]["model"], state["model"]), kind


def test_a_buffer_reassigned_in_forward_is_carried_through():
    values = schedules(2)
    _, states, _ = fused(Kinds, {"kind": "running-mean"}, values)
    start = build_trainer(Kinds, {"kind": "running-mean"}, 0).state_dict()["model"]["1.mean"]
    for member, value in enumerate(values):
        _, state, _ = unfused(Kinds, {"kind": "running-mean"}, value)
        assert not torch.equal(state["model"]["1.mean"], start)  # the control: it moves
        assert torch.equal(states[member]["model"]["1.mean"], state["model"]["1.mean"])
    assert not torch.equal(states[0]["model"]["1.mean"], states[1]["model"]["1.mean"])  # per member


def test_a_frozen_parameter_stays_frozen_fused_and_may_be_unfrozen_later():
    """A parameter with ``requires_grad=False`` gets no gradient and no update, and no
    optimizer state, as unfused; a trainer that unfreezes it between steps trains it."""
    values = schedules(2)
    host = build_trainer(Kinds, {"kind": "frozen"}, 0)
    start = host.state_dict()
    group = FusedGroup.from_states(host, [start] * 2)
    group.setup(values)
    group.train()
    for member in range(2):
        state = group.state_dict(member)
        assert torch.equal(state["model"]["0.weight"], start["model"]["0.weight"])
        assert 0 not in state["optimizer"]["state"] and 2 in state["optimizer"]["state"]
    host.model[0].requires_grad_(True)
    group.train()
    assert not torch.equal(group.state_dict(0)["model"]["0.weight"], start["model"]["0.weight"])


class TwiceCalled(Kinds):
    """Calls the model twice per loss: the second call must see the buffer the first set."""

    def loss(self, model, batch):
        x, y = batch
        model(x)
        return F.cross_entropy(model(x), y, reduction="none")


def test_a_second_call_in_one_loss_sees_the_reassigned_buffer():
    value = schedules(1)[0]
    _, states, _ = fused(TwiceCalled, {"kind": "running-mean"}, [value])
    _, state, _ = unfused(TwiceCalled, {"kind": "running-mean"}, value)
    assert same_state(states[0]["model"], state["model"])


def test_dropout_on_a_non_contiguous_activation_drops_the_elements_unfused_training_drops():
    """MultiheadAttention(batch_first=True) returns its [L, N, E] result transposed (not
    contiguous): unfused dropout draws its noise laid out like it. Fused, each member's mask
    must sit on the same elements (vmap's own rule draws in logical order: 1.6e-2 apart after
    a few epochs)."""
    sequence_first = torch.randn(8, 32, 16)  # what the attention computes, [L, N, E]
    unfused_input = sequence_first.transpose(0, 1)
    assert not unfused_input.is_contiguous()  # the case
    stacked = torch.stack([sequence_first] * 3)

    def drop(member: torch.Tensor) -> torch.Tensor:
        return F.dropout(member.transpose(0, 1), 0.5)

    torch.manual_seed(5)
    with MemberwiseLayers():
        dropped = torch.func.vmap(drop, randomness="same")(stacked)
    after_fused = torch.get_rng_state()
    torch.manual_seed(5)
    expected = F.dropout(unfused_input, 0.5)
    assert torch.equal(torch.get_rng_state(), after_fused)  # one draw, as unfused
    for member in range(3):
        assert torch.equal(dropped[member], expected)
    torch.manual_seed(5)
    plain = torch.func.vmap(drop, randomness="same")(stacked)
    assert not torch.equal(plain[0] != 0, expected != 0)  # the control: vmap's own rule differs


def test_self_attention_fused_computes_its_gradients_as_unfused():
    """Self-attention passes one tensor as query, key and value, and ``query is key`` picks
    attention's packed in-projection (one product instead of three). Each member's call must
    get one tensor too: three separate slices took the three products, whose gradients round
    differently (1e-9), and AdamW turned that noise in the key bias (whose true gradient is
    zero) into 1.8e-4 after one batch: the fusion check refused a Transformer with AdamW."""
    torch.manual_seed(0)
    attention = nn.MultiheadAttention(8, 2, batch_first=True)
    x = torch.randn(4, 5, 8)
    weights = {
        name: torch.stack([p.detach()] * 2).requires_grad_() for name, p in attention.named_parameters()
    }
    inputs = torch.stack([x] * 2).requires_grad_()

    def attend(member_weights, member_x):
        out, _ = torch.func.functional_call(attention, member_weights, (member_x, member_x, member_x))
        return out

    with MemberwiseLayers():
        out = torch.func.vmap(attend)(weights, inputs)
    grad = torch.randn(out.shape[1:])
    out.backward(torch.stack([grad] * 2))
    plain = x.clone().requires_grad_()
    want, _ = attention(plain, plain, plain)
    want.backward(grad)
    for member in range(2):
        assert torch.equal(out[member], want)
        assert torch.equal(inputs.grad[member], plain.grad)
        for name, p in attention.named_parameters():
            assert torch.equal(weights[name].grad[member], p.grad), name


def test_a_transformer_trained_with_adamw_passes_the_fusion_check():
    values = {"lr": 0.01, "weight_decay": 0.01, "batch_size": 32}
    verdict = check_fusion(AdamKinds, {"kind": "transformer"}, 0, values)
    assert verdict.ok, verdict.reason


@pytest.mark.parametrize("ties", [False, True], ids=["random", "ties"])
def test_channels_last_max_pooling_is_the_nchw_result_bit_for_bit(ties):
    generator = torch.Generator().manual_seed(0)
    for kernel, stride, padding, ceil in [
        (2, 2, 0, False),
        (3, 2, 1, False),
        (2, 2, 0, True),
        (3, 3, 1, False),
    ]:
        if ties:  # integer values: many equal maxima, the first one must win in both kernels
            x = torch.randint(-3, 4, (3, 4, 5, 9, 9), generator=generator).float()
        else:
            x = torch.randn(3, 4, 5, 9, 9, generator=generator)
        grad = torch.randn(
            F.max_pool2d(x[0], kernel, stride, padding, ceil_mode=ceil).shape, generator=generator
        )
        fused_x = x.clone().requires_grad_()

        def pool(t, kernel=kernel, stride=stride, padding=padding, ceil=ceil):
            return F.max_pool2d(t, kernel, stride, padding, ceil_mode=ceil, return_indices=True)

        with MemberwiseLayers():
            values, indices = torch.func.vmap(pool)(fused_x)
        values.backward(torch.stack([grad] * 3))
        for member in range(3):
            plain = x[member].clone().requires_grad_()
            want, want_indices = F.max_pool2d(
                plain, kernel, stride, padding, ceil_mode=ceil, return_indices=True
            )
            want.backward(grad)
            assert torch.equal(values[member], want) and torch.equal(indices[member], want_indices)
            assert torch.equal(fused_x.grad[member], plain.grad)


@pytest.mark.parametrize(
    ("shape", "target_shape", "options"),
    [
        ((64, 10), (64,), {}),
        ((7, 3, 5), (7, 5), {"label_smoothing": 0.1}),
        ((33, 100), (33,), {"ignore_index": 1, "weight": "shared"}),
        ((16, 4), (16,), {"weight": "member"}),
        ((10,), (), {}),
        ((5, 6), (5, 6), {"probabilities": True}),
    ],
)
@pytest.mark.parametrize("function", [F.cross_entropy, F.nll_loss])
def test_per_sample_losses_of_the_members_are_each_members_own_call(shape, target_shape, options, function):
    """``reduction="none"`` losses run as one call of K times the samples (a member-specific
    class weight, or one sample per member: one call each); each member's losses and input
    gradients are bit for bit its own unfused call, whatever K."""
    options = dict(options)
    probabilities = options.pop("probabilities", False)
    weighting = options.pop("weight", "")
    if function is F.nll_loss and (probabilities or "label_smoothing" in options):
        return  # nll_loss takes neither
    per_member = weighting == "member"
    generator = torch.Generator().manual_seed(0)
    classes = shape[1] if len(shape) > 1 else shape[0]
    for members in (1, 2, 5, 32):
        x = torch.randn(members, *shape, generator=generator, requires_grad=True)
        if probabilities:
            target = torch.rand(target_shape, generator=generator).softmax(-1)
        else:
            target = torch.randint(0, classes, target_shape, generator=generator)
        weight = torch.rand(classes, generator=generator) if weighting == "shared" else None
        weights = torch.rand(members, classes, generator=generator)

        def loss(z, w=None, weight=weight, target=target):
            return function(z, target, weight=w if w is not None else weight, reduction="none", **options)

        with MemberwiseLayers():
            out = torch.func.vmap(loss)(x, weights) if per_member else torch.func.vmap(loss)(x)
        grad = torch.randn(out.shape, generator=generator)
        (fused_grad,) = torch.autograd.grad(out, x, grad)
        for k in range(members):
            plain = x[k].detach().requires_grad_()
            want = loss(plain, weights[k] if per_member else None)
            (want_grad,) = torch.autograd.grad(want, plain, grad[k])
            assert torch.equal(out[k], want) and torch.equal(fused_grad[k], want_grad), (members, k)


def test_a_mean_reduced_loss_keeps_vmaps_rule():
    x = torch.randn(3, 8, 4, requires_grad=True)
    target = torch.randint(0, 4, (8,))
    with MemberwiseLayers():
        out = torch.func.vmap(lambda z: F.cross_entropy(z, target))(x)
    assert out.shape == (3,)
    for k in range(3):
        assert torch.allclose(out[k], F.cross_entropy(x[k], target), rtol=1e-6, atol=0)


@pytest.mark.parametrize("kind", FUSIBLE_KINDS)
def test_the_fusion_check_passes_every_fusible_kind(kind):
    verdict = check_fusion(Kinds, {"kind": kind}, 0, schedules(1)[0])
    assert verdict.ok, verdict.reason


def test_the_fusion_check_names_an_op_vmap_cannot_batch():
    verdict = check_fusion(Kinds, {"kind": "custom-op"}, 0, schedules(1)[0])
    assert not verdict.ok
    assert "cannot train fused: in module '1' (Squared)" in verdict.reason
    assert "autograd.Function Square" in verdict.reason


class CountsItsCalls(nn.Module):
    """Deliberately not exact: scales by how often it ran, state outside the trainer's."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return x * (1 + 1e-6 * self.calls)


class HandDropout(nn.Module):
    """Deliberately not exact: dropout written by hand on a transposed view, its noise drawn
    by vmap in another order than unfused."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training:
            return x
        view = x.view(x.shape[0], 4, 4).transpose(0, 1)
        mask = torch.empty_like(view).bernoulli_(0.5)
        return (view * mask * 2).transpose(0, 1).reshape(x.shape[0], 16)


class Deliberate(Kinds):
    def make_model(self, features: int, hidden: int) -> nn.Module:
        layer = CountsItsCalls() if self.kind == "counts" else HandDropout()
        return nn.Sequential(nn.Linear(32, 16), layer, nn.ReLU(), nn.Linear(16, 2))


class SparseBag(nn.Module):
    """Each sample's signs as tokens of a sparse embedding (``sparse=True``)."""

    def __init__(self):
        super().__init__()
        self.embedding = nn.Embedding(2, 8, sparse=True)
        self.head = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.embedding((x > 0).long()).mean(1))


class SparseTrainer(Kinds):
    def make_model(self, features: int, hidden: int) -> nn.Module:
        return SparseBag()


def test_the_fusion_check_names_an_embedding_with_sparse_gradients():
    """Sparse gradients cannot be stacked: the backward pass failed in no module, and the
    verdict named none ("in its fused step: reshape is not implemented for sparse tensors")."""
    verdict = check_fusion(SparseTrainer, {}, 0, schedules(1)[0])
    assert not verdict.ok
    assert "module 'embedding' (Embedding) has sparse=True" in verdict.reason


def test_the_fusion_check_names_a_layer_whose_result_depends_on_the_group():
    verdict = check_fusion(Deliberate, {"kind": "counts"}, 0, schedules(1)[0])
    assert not verdict.ok
    assert "depends on its group" in verdict.reason and "module '1' (CountsItsCalls)" in verdict.reason


def test_the_fusion_check_names_a_layer_that_disagrees_with_unfused_training():
    verdict = check_fusion(Deliberate, {"kind": "hand-dropout"}, 0, schedules(1)[0])
    assert not verdict.ok
    assert "does not agree with unfused training" in verdict.reason
    assert "module '1' (HandDropout)" in verdict.reason
    assert check_fusion(Deliberate, {"kind": "hand-dropout"}, 0, schedules(1)[0], agreement=False).ok


@pytest.mark.parametrize("kind", ["batchnorm2d", "transformer"])
def test_grouped_kernels_depend_on_the_group_only_within_rounding(kind):
    """With fused_kernels="grouped" convolutions and matrix products are batched: a member
    differs from itself alone by rounding only (the check compares within its tolerance)."""
    values = schedules(4)
    _, states, _ = fused(GroupedKinds, {"kind": kind}, values)
    _, alone, _ = fused(GroupedKinds, {"kind": kind}, [values[0]])
    assert largest_difference(states[0], alone[0]) <= UNFUSED_TOLERANCE
    assert check_fusion(GroupedKinds, {"kind": kind}, 0, values[0]).ok


def test_fused_kernels_must_be_exact_or_grouped():
    class Misdeclared(TinyCNN):
        fused_kernels = "fast"

    with pytest.raises(
        ValueError, match=r"Misdeclared.fused_kernels must be one of \['exact', 'grouped'\], got 'fast'"
    ):
        Misdeclared()


def test_run_alone_fused_is_each_member_of_a_fused_group():
    """The reference a fused study's trials must equal: `run_alone(..., fused=True)`."""
    config = {"lr": 0.05, "momentum": 0.9, "batch_size": 32}
    curve = dt.run_alone(Kinds, config, STEPS, {"kind": "transformer"}, fused=True)
    histories, _, _ = fused(Kinds, {"kind": "transformer"}, [config, *schedules(2)])
    assert [m["loss"] for m in curve] == [m["loss"] for m in histories[0]]
    assert np.isfinite([m["val_loss"] for m in curve]).all()
