"""Per-parameter learning rates and weight decay under muP, and optimizers built with them.

The multipliers are relative to the base width (the full model), so a user's ``lr`` is the
learning rate of the full model's hidden weights at every width. Per Tensor Programs V,
Table 3, written with the readout multiplier of `dagtune.mup.Readout`, the learning rate of a
parameter is ``lr`` times:

* fixed (no dimension grows with width): 1;
* vector-like (one dimension grows; input weights, embeddings, biases, norm gains, the
  readout's weight): ``width_mult`` with an SGD-like optimizer, 1 with an Adam-like one;
* matrix-like (fan-in and fan-out grow; hidden weights): ``fan_out_mult / fan_in_mult`` with
  an SGD-like optimizer, ``1 / fan_in_mult`` with an Adam-like one.

SGD-like: SGD with or without (Nesterov) momentum; Adam-like: optimizers that normalize each
coordinate of the gradient (Adam, AdamW, RMSprop, Adagrad). Weight decay is divided by the
same multiplier, so that the shrink per step, ``lr * weight_decay``, is the same for every
parameter at every width (the coupled decay of SGD and Adam and the decoupled one of AdamW
alike); weight decay does not transfer across width for all that (Hydro §4.1).
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from torch import nn

from dagtune.mup._build import check_parametrization, parametrization_of, shapes
from dagtune.mup._shapes import Parametrization, WidthShape
from dagtune.validation import check_number

__all__ = [
    "LR_MULT",
    "SGD",
    "WEIGHT_DECAY_MULT",
    "Adam",
    "AdamW",
    "OptimizerKind",
    "lr_multiplier",
    "param_groups",
    "set_hyperparameters",
]

OptimizerKind = Literal["sgd", "adam"]
#: Keys of each parameter group: what ``lr`` and ``weight_decay`` are multiplied by.
LR_MULT, WEIGHT_DECAY_MULT = "lr_mult", "weight_decay_mult"


def lr_multiplier(shape: WidthShape, parametrization: Parametrization, optimizer: OptimizerKind) -> float:
    """The factor muP applies to a parameter's learning rate (1 under the standard parametrization)."""
    parametrization = check_parametrization(parametrization)
    if optimizer not in ("sgd", "adam"):
        raise ValueError(f"optimizer must be 'sgd' (SGD-like) or 'adam' (Adam-like), got {optimizer!r}")
    if parametrization == "sp" or shape.kind == "fixed":
        return 1.0
    if shape.kind == "vector":
        return shape.width_mult if optimizer == "sgd" else 1.0
    if optimizer == "sgd":
        return shape.fan_out_mult / shape.fan_in_mult
    return 1.0 / shape.fan_in_mult


def param_groups(
    model: nn.Module, optimizer: OptimizerKind, lr: float, weight_decay: float = 0.0
) -> list[dict[str, Any]]:
    """Parameter groups for a torch optimizer: one per learning-rate multiplier, each with its
    ``lr``, ``weight_decay`` and the multipliers (`LR_MULT`, `WEIGHT_DECAY_MULT`) that
    `set_hyperparameters` applies to later values. `model` is made by `dagtune.mup.build`;
    `optimizer` says whether the optimizer is SGD-like or Adam-like."""
    _check_non_negative("lr", lr)
    _check_non_negative("weight_decay", weight_decay)
    parametrization = parametrization_of(model)
    table = shapes(model)
    groups: dict[float, dict[str, Any]] = {}
    for name, parameter in model.named_parameters():
        mult = lr_multiplier(table[name], parametrization, optimizer)
        group = groups.setdefault(
            mult,
            {
                "params": [],
                "lr": lr * mult,
                "weight_decay": weight_decay / mult,
                LR_MULT: mult,
                WEIGHT_DECAY_MULT: 1.0 / mult,
            },
        )
        group["params"].append(parameter)
    return list(groups.values())


def set_hyperparameters(optimizer: torch.optim.Optimizer, **values: Any) -> None:
    """Set optimizer hyper-parameters in every group: ``lr`` and ``weight_decay`` times the
    group's multipliers, anything else (``momentum``, ``betas``, …) as given. Use it in
    `Trainer.setup`; setting the same value twice changes nothing."""
    for index, group in enumerate(optimizer.param_groups):
        if LR_MULT not in group or WEIGHT_DECAY_MULT not in group:
            raise ValueError(
                f"parameter group {index} of the optimizer has no muP multipliers: build the optimizer "
                "with dagtune.mup.param_groups (or dagtune.mup.SGD, Adam, AdamW)"
            )
        for name, value in values.items():
            if name not in group:
                raise ValueError(f"{type(optimizer).__name__} has no hyper-parameter {name!r}")
            if name == "lr":
                _check_non_negative("lr", value)
                group[name] = float(value) * group[LR_MULT]
            elif name == "weight_decay":
                _check_non_negative("weight_decay", value)
                group[name] = float(value) * group[WEIGHT_DECAY_MULT]
            else:
                group[name] = value


def _check_non_negative(name: str, value: Any) -> None:
    check_number(name, value, minimum=0, finite=False)


class SGD(torch.optim.SGD):
    """``torch.optim.SGD`` over a `dagtune.mup.build` model with muP's per-parameter rates."""

    def __init__(
        self,
        model: nn.Module,
        lr: float,
        momentum: float = 0.0,
        weight_decay: float = 0.0,
        **kwargs: Any,
    ):
        groups = param_groups(model, "sgd", lr, weight_decay)
        super().__init__(groups, lr=lr, momentum=momentum, weight_decay=weight_decay, **kwargs)


class Adam(torch.optim.Adam):
    """``torch.optim.Adam`` over a `dagtune.mup.build` model with muP's per-parameter rates."""

    def __init__(
        self,
        model: nn.Module,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        weight_decay: float = 0.0,
        **kwargs: Any,
    ):
        groups = param_groups(model, "adam", lr, weight_decay)
        super().__init__(groups, lr=lr, betas=betas, weight_decay=weight_decay, **kwargs)


class AdamW(torch.optim.AdamW):
    """``torch.optim.AdamW`` over a `dagtune.mup.build` model with muP's per-parameter rates."""

    def __init__(
        self,
        model: nn.Module,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        weight_decay: float = 1e-2,
        **kwargs: Any,
    ):
        groups = param_groups(model, "adam", lr, weight_decay)
        super().__init__(groups, lr=lr, betas=betas, weight_decay=weight_decay, **kwargs)
