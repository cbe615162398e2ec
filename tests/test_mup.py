"""dagtune.mup: which dimensions grow with width, muP's initialization and per-parameter rates."""

from __future__ import annotations

import copy
import io
import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import nn
from torch.nn import functional as F  # noqa: N812

import dagtune as dt
from dagtune.mup import WidthShape


def mlp(width: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Linear(8, width), nn.ReLU(), nn.Linear(width, 2 * width), nn.ReLU(), dt.mup.Readout(2 * width, 3)
    )


class TinyTransformer(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.embedding = nn.Embedding(11, width)
        self.norm = nn.LayerNorm(width)
        self.attention = dt.mup.SelfAttention(width, 2, causal=True)
        self.readout = dt.mup.Readout(width, 11)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embedding(tokens)
        return self.readout(x + self.attention(self.norm(x)))


# --------------------------------------------------------------------------- shapes


def test_every_parameter_is_classified_by_the_dimensions_that_grow():
    table = dt.mup.shapes(dt.mup.build(mlp, base=64, scale=8))
    assert {name: (shape.kind, shape.shape, shape.base) for name, shape in table.items()} == {
        "0.weight": ("vector", (8, 8), (64, 8)),  # input weights: fan-out grows
        "0.bias": ("vector", (8,), (64,)),
        "2.weight": ("matrix", (16, 8), (128, 64)),  # hidden
        "2.bias": ("vector", (16,), (128,)),
        "4.weight": ("vector", (3, 16), (3, 128)),  # readout: fan-in grows
        "4.bias": ("fixed", (3,), (3,)),
    }
    assert table["2.weight"].fan_in_mult == table["2.weight"].fan_out_mult == 1 / 8
    assert table["4.weight"].width_mult == 1 / 8


def test_conv_embedding_norm_and_attention_are_classified():
    def cnn(width: int) -> nn.Sequential:
        return nn.Sequential(
            nn.Conv2d(1, width, 3),
            nn.Conv2d(width, 2 * width, 3),
            nn.Flatten(),
            dt.mup.Readout(8 * width, 10),
        )

    table = dt.mup.shapes(dt.mup.build(cnn, base=32, scale=4))
    assert [table[n].kind for n in ("0.weight", "1.weight", "3.weight", "3.bias")] == [
        "vector",
        "matrix",
        "vector",
        "fixed",
    ]
    assert table["1.weight"].scaled == (True, True, False, False)  # the kernel is fixed
    table = dt.mup.shapes(dt.mup.build(TinyTransformer, base=16, scale=2))
    assert table["embedding.weight"].scaled == (False, True)
    assert table["norm.weight"].kind == table["norm.bias"].kind == "vector"
    assert table["attention.query.weight"].kind == "matrix"


@pytest.mark.parametrize(
    ("make_model", "message"),
    [
        (lambda w: nn.Sequential(nn.Linear(4, w), nn.Linear(w, 3)), "make it a dagtune.mup.Readout"),
        (lambda w: nn.MultiheadAttention(w, 2), "dagtune.mup.SelfAttention"),
        (lambda w: nn.Sequential(nn.Linear(4, w + 1), dt.mup.Readout(w + 1, 3)), "fixed or proportional"),
        (lambda w: nn.Linear(4, w * w), "fixed or proportional"),
        (lambda w: nn.Sequential(*(nn.Linear(4, 4) for _ in range(1 + (w > 8)))), "differ between widths"),
        (lambda w: nn.Bilinear(w, w, w), r"fan-out \(0\) and fan-in \(1\) only"),
    ],
)
def test_models_mup_cannot_parametrize_are_refused_with_the_layer_named(make_model, message):
    with pytest.raises(ValueError, match=message):
        dt.mup.build(make_model, base=8, scale=2)


def test_tied_weights_and_bad_arguments_are_refused():
    def tied(width: int) -> nn.Module:
        model = nn.Sequential(nn.Embedding(5, width), dt.mup.Readout(width, 5))
        model[1].weight = model[0].weight
        return model

    with pytest.raises(ValueError, match="tied weights"):
        dt.mup.build(tied, base=8, scale=2)
    with pytest.raises(ValueError, match=r"base 64 / scale 3 = 21\.3+ is not a whole width"):
        dt.mup.build(mlp, base=64, scale=3)
    with pytest.raises(ValueError, match="scale must be a positive number"):
        dt.mup.build(mlp, base=64, scale=0)
    with pytest.raises(ValueError, match="base must be a positive int"):
        dt.mup.build(mlp, base=64.0, scale=2)
    with pytest.raises(ValueError, match=r"parametrization must be one of \['mup', 'sp'\], got 'ntk'"):
        dt.mup.build(mlp, base=64, scale=2, parametrization="ntk")
    with pytest.raises(TypeError, match=r"make_model\(32\) returned dict"):
        dt.mup.build(lambda w: {}, base=64, scale=2)
    with pytest.raises(ValueError, match="no width information"):
        dt.mup.param_groups(mlp(8), "sgd", lr=0.1)


# --------------------------------------------------------------------------- initialization


def test_sp_is_the_plain_model_and_draws_the_same_random_numbers():
    torch.manual_seed(5)
    plain = TinyTransformer(8)
    after_plain = torch.rand(3)
    torch.manual_seed(5)
    built = dt.mup.build(TinyTransformer, base=32, scale=4, parametrization="sp")
    assert torch.equal(torch.rand(3), after_plain)  # the base-width builds drew nothing
    for (name, a), (_, b) in zip(plain.state_dict().items(), built.state_dict().items()):
        assert torch.equal(a, b), name
    tokens = torch.randint(0, 11, (2, 5))
    assert torch.equal(plain(tokens), built(tokens))
    assert built.attention.scale == 4**-0.5 and built.readout.width_mult == 1.0


def test_mup_zeroes_biases_readout_and_query_and_keeps_the_rest():
    torch.manual_seed(5)
    plain = TinyTransformer(8)
    torch.manual_seed(5)
    model = dt.mup.build(TinyTransformer, base=32, scale=4)
    zero = {"readout.weight", "readout.bias", "attention.query.weight"}
    for name, value in model.state_dict().items():
        if name in zero or name.endswith(".bias"):
            assert not value.any(), name
        else:
            assert torch.equal(value, plain.state_dict()[name]), name
    assert model.readout.width_mult == 1 / 4
    assert model.attention.scale == pytest.approx(math.sqrt(16) / 4)  # sqrt(base head dim) / head dim


def test_at_the_base_width_mup_computes_what_sp_computes_once_the_zeros_are_filled():
    torch.manual_seed(0)
    sp = dt.mup.build(TinyTransformer, base=16, scale=1, parametrization="sp")
    mup = dt.mup.build(TinyTransformer, base=16, scale=1)
    mup.load_state_dict(sp.state_dict())
    tokens = torch.randint(0, 11, (3, 6))
    assert torch.equal(sp(tokens), mup(tokens))
    assert {group[dt.mup.LR_MULT] for group in dt.mup.param_groups(mup, "adam", lr=1e-3)} == {1.0}
    assert {group[dt.mup.LR_MULT] for group in dt.mup.param_groups(mup, "sgd", lr=1e-3)} == {1.0}


def test_readout_multiplies_its_input_and_self_attention_is_softmax_attention():
    model = dt.mup.build(TinyTransformer, base=16, scale=2)
    readout, attention = model.readout, model.attention
    with torch.no_grad():
        readout.weight.normal_()
        readout.bias.normal_()
        attention.query.weight.normal_()
    x = torch.randn(2, 5, 8)
    assert torch.allclose(readout(x), F.linear(2 * x, readout.weight, readout.bias))
    q, k, v = (
        p(x).view(2, 5, 2, 4).transpose(1, 2) for p in (attention.query, attention.key, attention.value)
    )
    logits = (q @ k.transpose(-1, -2)) * (math.sqrt(4 * 2) / 4)
    logits = logits.masked_fill(torch.ones(5, 5, dtype=torch.bool).triu(1), -math.inf)
    expected = attention.out((logits.softmax(-1) @ v).transpose(1, 2).reshape(2, 5, 8))
    assert torch.allclose(attention(x), expected, atol=1e-6)


# --------------------------------------------------------------------------- rates


@given(
    fan_in=st.sampled_from([1, 2, 4, 8, 16]),
    fan_out=st.sampled_from([1, 2, 4, 8, 16]),
    kind=st.sampled_from(["fixed", "input", "output", "hidden"]),
)
def test_lr_multipliers_follow_table_3(fan_in, fan_out, kind):
    """Relative to a base of 16 in every growing dimension: SGD scales vector-like rates by
    the width multiplier and hidden ones by fan-out/fan-in; Adam scales hidden rates by
    1/fan-in only; the standard parametrization scales nothing."""
    scaled = {
        "fixed": (False, False),
        "input": (True, False),
        "output": (False, True),
        "hidden": (True, True),
    }[kind]
    shape = WidthShape(
        base=(16 if scaled[0] else fan_out, 16 if scaled[1] else fan_in),
        shape=(fan_out, fan_in),
        scaled=scaled,
    )
    m_out, m_in = fan_out / 16 if scaled[0] else 1, fan_in / 16 if scaled[1] else 1
    expected_sgd = {"fixed": 1, "input": m_out, "output": m_in, "hidden": m_out / m_in}[kind]
    expected_adam = 1 / m_in if kind == "hidden" else 1
    assert dt.mup.lr_multiplier(shape, "mup", "sgd") == pytest.approx(expected_sgd)
    assert dt.mup.lr_multiplier(shape, "mup", "adam") == pytest.approx(expected_adam)
    assert dt.mup.lr_multiplier(shape, "sp", "sgd") == dt.mup.lr_multiplier(shape, "sp", "adam") == 1


def test_param_groups_hold_every_parameter_once_with_lr_times_weight_decay_kept():
    model = dt.mup.build(mlp, base=64, scale=4)
    groups = dt.mup.param_groups(model, "adam", lr=0.01, weight_decay=0.1)
    assert sorted(id(p) for g in groups for p in g["params"]) == sorted(id(p) for p in model.parameters())
    by_mult = {g[dt.mup.LR_MULT]: g for g in groups}
    assert set(by_mult) == {1.0, 4.0}  # everything but the hidden weight; the hidden weight
    assert [p.shape for p in by_mult[4.0]["params"]] == [torch.Size([32, 16])]
    for group in groups:
        assert group["lr"] * group["weight_decay"] == pytest.approx(0.01 * 0.1)
    with pytest.raises(ValueError, match="optimizer must be 'sgd'"):
        dt.mup.param_groups(model, "lion", lr=0.1)
    with pytest.raises(ValueError, match="lr must be a number >= 0, got -1"):
        dt.mup.param_groups(model, "sgd", lr=-1)


@pytest.mark.parametrize(
    ("factory", "kind"), [(dt.mup.SGD, "sgd"), (dt.mup.Adam, "adam"), (dt.mup.AdamW, "adam")]
)
def test_set_hyperparameters_scales_lr_and_weight_decay_and_survives_a_checkpoint(factory, kind):
    model = dt.mup.build(mlp, base=64, scale=4)
    optimizer = factory(model, lr=0.5, weight_decay=0.0)
    dt.mup.set_hyperparameters(optimizer, lr=0.02, weight_decay=1e-3)
    dt.mup.set_hyperparameters(optimizer, lr=0.02, weight_decay=1e-3)  # idempotent
    expected = {g[dt.mup.LR_MULT]: 0.02 * g[dt.mup.LR_MULT] for g in dt.mup.param_groups(model, kind, lr=1)}
    assert {g[dt.mup.LR_MULT]: g["lr"] for g in optimizer.param_groups} == pytest.approx(expected)
    assert all(g["lr"] * g["weight_decay"] == pytest.approx(0.02 * 1e-3) for g in optimizer.param_groups)

    model(torch.randn(4, 8)).sum().backward()
    optimizer.step()
    buffer = io.BytesIO()
    torch.save(optimizer.state_dict(), buffer)
    buffer.seek(0)
    resumed = factory(model, lr=0.5)
    resumed.load_state_dict(torch.load(buffer, weights_only=True))
    assert [g["lr"] for g in resumed.param_groups] == [g["lr"] for g in optimizer.param_groups]
    dt.mup.set_hyperparameters(resumed, lr=0.04)
    assert [g["lr"] for g in resumed.param_groups] == pytest.approx(
        [2 * g["lr"] for g in optimizer.param_groups]
    )


def test_set_hyperparameters_refuses_plain_optimizers_and_unknown_names():
    model = dt.mup.build(mlp, base=64, scale=4)
    with pytest.raises(ValueError, match="group 0 of the optimizer has no muP multipliers"):
        dt.mup.set_hyperparameters(torch.optim.SGD(model.parameters(), lr=0.1), lr=0.2)
    with pytest.raises(ValueError, match="SGD has no hyper-parameter 'betas'"):
        dt.mup.set_hyperparameters(dt.mup.SGD(model, lr=0.1), betas=(0.9, 0.99))
    with pytest.raises(ValueError, match="weight_decay must be a number >= 0, got 'high'"):
        dt.mup.set_hyperparameters(dt.mup.SGD(model, lr=0.1), weight_decay="high")


def test_width_information_survives_deepcopy_and_wrapping():
    model = dt.mup.build(mlp, base=64, scale=4)
    wrapped = nn.Sequential(copy.deepcopy(model))
    assert dt.mup.shapes(wrapped)["0.2.weight"] == dt.mup.shapes(model)["2.weight"]
    assert dt.mup.parametrization_of(wrapped) == "mup"
