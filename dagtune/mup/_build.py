"""Building a model at ``base / scale`` width, initialized for its parametrization.

`build` calls the user's ``make_model(width)`` at the scaled width (drawing the weights from
the global RNG, as a plain build would), builds the base and the doubled width on the meta
device to find which dimensions grow with width, records each parameter's `WidthShape` on its
module (for `dagtune.mup.param_groups`), and applies muP's initialization rules.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from dagtune.mup._layers import Readout, WidthAware
from dagtune.mup._shapes import (
    PARAMETRIZATIONS,
    Parametrization,
    WidthBuilder,
    WidthShape,
    check_width,
    iter_owned_parameters,
    width_shapes,
)
from dagtune.trainer import isolated_rng

__all__ = ["ATTRIBUTE", "ModuleWidths", "build", "check_parametrization", "parametrization_of", "shapes"]

#: The attribute of each module holding its parameters' `ModuleWidths` (a plain attribute, so
#: it survives ``copy.deepcopy`` and wrapping the model in another module).
ATTRIBUTE = "dagtune_mup"

#: Standard layers whose computation is not muP's at every width: use the replacement named.
_UNSUPPORTED: tuple[tuple[type[nn.Module], str], ...] = (
    (nn.MultiheadAttention, "dagtune.mup.SelfAttention (its logits are scaled by 1/sqrt(head_dim))"),
    (nn.ConvTranspose1d, "a Conv layer (its weight is laid out fan-in first)"),
    (nn.ConvTranspose2d, "a Conv layer (its weight is laid out fan-in first)"),
    (nn.ConvTranspose3d, "a Conv layer (its weight is laid out fan-in first)"),
)
_WEIGHTED = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)


@dataclass(frozen=True)
class ModuleWidths:
    """The parametrization and the `WidthShape` of each of a module's own parameters."""

    parametrization: Parametrization
    shapes: dict[str, WidthShape]


def check_parametrization(parametrization: str) -> Parametrization:
    if parametrization not in PARAMETRIZATIONS:
        raise ValueError(f"parametrization must be one of {list(PARAMETRIZATIONS)}, got {parametrization!r}")
    return parametrization  # type: ignore[return-value]


def build(
    make_model: WidthBuilder, base: int, scale: float = 1, parametrization: Parametrization = "mup"
) -> nn.Module:
    """``make_model(base // scale)``, parametrized so that hyper-parameters tuned at any scale
    mean the same at every other.

    `make_model` takes the width (an int) and returns the model, every width-dependent size
    proportional to it (e.g. ``nn.Linear(width, 2 * width)``). Its output layer is a
    `Readout`, its attention (if any) a `SelfAttention`; its other weights use an
    initialization whose variance is proportional to 1 / fan-in (PyTorch's default).

    `base` is the width of the full (target) model, so at ``scale=1`` muP coincides with the
    standard parametrization except for the zero initializations below. Under ``"mup"``, every
    bias starts at zero, the readout's weight and the attention's query projection too, the
    readout multiplies its input by ``base_fan_in / fan_in`` and attention scales its logits
    by ``1 / head_dim``. Under ``"sp"``, the model is exactly ``make_model(width)``. Either
    way, build its optimizer with `param_groups` (or `SGD`, `Adam`, `AdamW`), which give each
    parameter the learning rate muP asks for (all equal under ``"sp"``).
    """
    parametrization = check_parametrization(parametrization)
    width = check_width(base, scale)
    model = _checked_module(make_model(width), width)
    with isolated_rng(), torch.device("meta"):
        base_model = _checked_module(make_model(base), base)
        double_model = _checked_module(make_model(2 * base), 2 * base)
    table = width_shapes(model, base_model, double_model)
    base_modules = dict(base_model.named_modules())
    for name, module in model.named_modules():
        _refuse_unsupported(name, module, table)
        if isinstance(module, WidthAware):
            if name not in base_modules:
                raise ValueError(f"module {name} exists at width {width} but not at the base width {base}")
            module.configure_width(base_modules[name], parametrization)
    owned: dict[nn.Module, dict[str, WidthShape]] = {}
    for qualified, module, local, parameter in iter_owned_parameters(model):
        owned.setdefault(module, {})[local] = table[qualified]
        if parametrization == "mup" and local == "bias":
            with torch.no_grad():
                parameter.zero_()
    for module, local_shapes in owned.items():
        setattr(module, ATTRIBUTE, ModuleWidths(parametrization, local_shapes))
    return model


def _checked_module(model: object, width: int) -> nn.Module:
    if not isinstance(model, nn.Module):
        raise TypeError(f"make_model({width}) returned {type(model).__name__}, not a torch.nn.Module")
    return model


def _refuse_unsupported(name: str, module: nn.Module, table: dict[str, WidthShape]) -> None:
    """Layers muP cannot parametrize as they are: a weight mapping the width to a fixed size
    that is not a `Readout`, and the layers listed in `_UNSUPPORTED`, when they scale."""
    prefix = f"{name}." if name else ""
    own = {local: table[f"{prefix}{local}"] for local, _ in module.named_parameters(recurse=False)}
    if all(shape.kind == "fixed" for shape in own.values()):
        return
    label = name or "the model"
    for layer_type, replacement in _UNSUPPORTED:
        if isinstance(module, layer_type):
            raise ValueError(f"{label} is a {layer_type.__name__} that grows with width: use {replacement}")
    weight = own.get("weight")
    if (
        isinstance(module, _WEIGHTED)
        and not isinstance(module, Readout)
        and weight is not None
        and weight.scaled[:2] == (False, True)
    ):
        raise ValueError(
            f"{label} ({type(module).__name__}) maps the width to a fixed size ({weight.shape[0]}): "
            "make it a dagtune.mup.Readout"
        )


def shapes(model: nn.Module) -> dict[str, WidthShape]:
    """The `WidthShape` of every parameter of a model made by `build`, by qualified name."""
    result = {}
    for qualified, module, local, _ in iter_owned_parameters(model):
        widths = _widths(module, qualified)
        result[qualified] = widths.shapes[local]
    return result


def parametrization_of(model: nn.Module) -> Parametrization:
    """The parametrization `build` gave the model."""
    found = {_widths(module, q).parametrization for q, module, _, _ in iter_owned_parameters(model)}
    if len(found) != 1:
        raise ValueError(f"the model mixes parametrizations {sorted(found)}")
    return found.pop()


def _widths(module: nn.Module, qualified: str) -> ModuleWidths:
    widths = getattr(module, ATTRIBUTE, None)
    if not isinstance(widths, ModuleWidths):
        raise ValueError(
            f"parameter {qualified} has no width information: build the model with dagtune.mup.build"
        )
    return widths
