"""`fused_kernels="grouped"` on a model of standard layers: all members run as one stack of
ordinary operations without vmap (`dagtune.fusion._horizontal`), each member close to its
unfused training, with dropout drawing exactly what unfused training draws."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from fusion_helpers import TinyMLP
from test_fusion_layers import fused, largest_difference, schedules, unfused
from torch import nn

import dagtune as dt
import dagtune.fusion._group as group_module
from dagtune.fusion import check_fusion
from dagtune.fusion._horizontal import is_horizontal

#: a member against its unfused training (and against itself alone) after 2 epochs, grouped
#: kernels: measured at most 6e-8; the contract states 1e-6 after 2 epochs
TOLERANCE = 1e-6


def image_model(hidden: int) -> nn.Module:
    """Dropout on the shared input, between convolutions and after the flatten; a grouped
    convolution of its own; two linear layers."""
    return nn.Sequential(
        nn.Dropout(0.2),
        nn.Conv2d(1, hidden, 3, padding=1),
        nn.ReLU(),
        nn.Dropout(0.2),
        nn.MaxPool2d(2),
        nn.Conv2d(hidden, hidden, 3, padding=1, groups=2, bias=False),
        nn.ReLU(inplace=True),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(hidden * 4, 16),
        nn.ReLU(),
        nn.Dropout(0.3),
        nn.Linear(16, 2),
    )


def grouped_first_model(hidden: int) -> nn.Module:
    """A grouped convolution on the shared input (its groups see different input channels)."""
    return nn.Sequential(
        nn.Conv2d(2, hidden, 3, padding=1, groups=2),
        nn.ReLU(),
        nn.MaxPool2d(4),
        nn.Flatten(),
        nn.Linear(hidden * 2, 2),
    )


def dense_model(hidden: int) -> nn.Module:
    return nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Dropout(0.3), nn.Linear(hidden, 2))


def digits_cnn(width: int) -> nn.Module:
    """`examples/scaled_digits.py`'s CNN: convolutions, max pooling and muP's readout."""
    return nn.Sequential(
        nn.Conv2d(1, width, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(width, 2 * width, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        dt.mup.Readout(2 * width * 2 * 2, 2),
    )


def mup_model(hidden: int) -> nn.Module:
    """The digits CNN under muP at a quarter of its base width (its readout's input is
    multiplied by 4)."""
    return dt.mup.build(digits_cnn, base=4 * hidden, scale=4)


MODELS = {"image": image_model, "grouped-first": grouped_first_model, "dense": dense_model, "mup": mup_model}
SHAPES = {"image": (1, 8, 8), "grouped-first": (2, 4, 8), "mup": (1, 8, 8)}


class Standard(TinyMLP):
    """A model of standard layers on 64 features (images shaped `SHAPES`), fused with
    grouped kernels."""

    fused_kernels = "grouped"

    def __init__(self, kind: str = "image", seed: int = 0, **optimizer: Any):
        self.kind = kind
        self.input_shape = SHAPES.get(kind)
        super().__init__(hidden=8, features=64, seed=seed, **optimizer)

    def make_model(self, features: int, hidden: int) -> nn.Module:
        return MODELS[self.kind](hidden)


def without_vmaps_model_call(monkeypatch: pytest.MonkeyPatch) -> None:
    def refused(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the model ran through functional_call under vmap")

    monkeypatch.setattr(group_module, "functional_call", refused)


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_standard_layers_train_grouped_without_vmap_close_to_unfused(kind, monkeypatch):
    values = schedules(3)
    without_vmaps_model_call(monkeypatch)
    history, states, rng = fused(Standard, {"kind": kind}, values)
    _, alone, _ = fused(Standard, {"kind": kind}, [values[1]])
    assert largest_difference(states[1], alone[0]) <= TOLERANCE
    for k, hp in enumerate(values):
        reference, state, reference_rng = unfused(Standard, {"kind": kind}, hp)
        assert largest_difference(states[k], state) <= TOLERANCE
        for step, metrics in zip(reference, history[k]):
            assert metrics["loss"] == pytest.approx(step["loss"], abs=1e-6)
        assert torch.equal(rng, reference_rng)  # dropout drew what unfused training draws


def test_tied_layers_take_vmaps_path():
    """Tied weights (two Linear layers sharing their Parameters): the fused state holds them
    once, so vmap's path."""

    def tied(hidden: int) -> nn.Module:
        first, second = nn.Linear(64, 64), nn.Linear(64, 64)
        second.weight, second.bias = first.weight, first.bias
        return nn.Sequential(first, nn.ReLU(), second, nn.ReLU(), nn.Linear(64, 2))

    MODELS["tied"] = tied
    try:
        values = schedules(2)
        _, states, _ = fused(Standard, {"kind": "tied"}, values)
        _, reference, _ = unfused(Standard, {"kind": "tied"}, values[1])
        assert largest_difference(states[1], reference) <= TOLERANCE
    finally:
        del MODELS["tied"]


def test_the_fusion_check_passes_standard_layers_through_vmaps_path():
    """The check's trace records every layer's output (hooks), so it runs vmap's path."""
    assert check_fusion(Standard, {"kind": "image"}, 0, schedules(1)[0]).ok


@pytest.mark.parametrize(
    "model",
    [
        nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4)),
        nn.Sequential(nn.Conv2d(1, 4, 3, padding=1, padding_mode="reflect")),
        nn.Sequential(nn.MaxPool2d(2, return_indices=True)),
        nn.Sequential(nn.Flatten(0)),
        nn.Sequential(nn.Flatten(), nn.Conv2d(1, 4, 3)),
        nn.Sequential(type("MyLinear", (nn.Linear,), {})(4, 2)),
        nn.Sequential(type("MyReadout", (dt.mup.Readout,), {})(4, 2)),
        nn.Sequential(nn.Sequential(nn.Linear(4, 2))),
        nn.Linear(4, 2),
    ],
)
def test_any_other_model_takes_vmaps_path(model):
    assert not is_horizontal(model)


def test_mups_readout_runs_without_vmap_with_its_input_multiplier():
    model = mup_model(8)
    assert model[-1].output_mult / model[-1].width_mult == 4.0
    assert is_horizontal(model)


def test_a_hook_sends_the_model_to_vmaps_path():
    model = dense_model(8)
    assert is_horizontal(model)
    handle = model[1].register_forward_hook(lambda *args: None)
    assert not is_horizontal(model)
    handle.remove()
    assert is_horizontal(model)
