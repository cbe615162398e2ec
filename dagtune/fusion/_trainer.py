"""`FusibleTrainer`: a trainer written as its pure parts, which dagtune can also fuse.

The user declares what a trial is made of (the model, the optimizer with the starting values
of its fields, the data order, how to fetch a batch, one trial's loss, how to evaluate one
model) and which hyper-parameters set which optimizer field. dagtune writes the rest of the
`Trainer` contract (``setup``, ``train``, ``evaluate``, ``state_dict``, ``load_state_dict``),
so a `FusibleTrainer` runs unfused like any hand-written trainer, and the same declarations
let `dagtune.fusion` train K trials of it as one stacked model (`FusedGroup`).

What may differ between the members of a fused group is exactly the hyper-parameters mapped
to optimizer fields (`fusible`): every other hyper-parameter (the batch size, a dropout
probability, ...) and every trainer argument (widths, the architecture) must be equal.
"""

from __future__ import annotations

import math
from abc import abstractmethod
from collections.abc import Callable, Iterator, Mapping
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from dagtune.fusion._memberwise import KERNEL_MODES
from dagtune.fusion._optimizers import OptimizerSpec
from dagtune.trainer import ResumableBatches, Trainer
from dagtune.validation import check_int, is_number

__all__ = ["FusibleTrainer", "check_fusible_value", "mean_loss"]


def check_fusible_value(name: str, value: Any) -> None:
    """Raise a ValueError naming hyper-parameter `name` unless `value` is a finite number."""
    if not is_number(value) or not math.isfinite(value):
        raise ValueError(
            f"hyper-parameter {name!r} sets an optimizer field and needs a finite number, got {value!r}"
        )


def mean_loss(losses: Any, where: str = "FusibleTrainer.loss()") -> torch.Tensor:
    """One trial's loss from what `FusibleTrainer.loss` returned: the mean of per-sample
    losses, or the scalar itself."""
    if not isinstance(losses, torch.Tensor) or not losses.is_floating_point():
        raise TypeError(f"{where} must return a float tensor (per-sample losses or a scalar), got {losses!r}")
    return losses if losses.dim() == 0 else losses.mean()


class FusibleTrainer(Trainer):
    """A `Trainer` declared by its parts; one step is one epoch of `batches` (or
    `batches_per_step` batches).

    Subclass it, build the data in ``__init__`` and call
    ``super().__init__(model=..., optimizer=dt.SGD(...), batches=dt.ResumableBatches(...))``
    (dagtune has seeded python, numpy and torch before ``__init__`` runs, so the model's
    initial weights are those of the study seed); then write `batch`, `loss` and
    `evaluate_model`, and map hyper-parameters with the class attributes::

        class Digits(dt.FusibleTrainer):
            fusible = {"lr": "lr", "momentum": "momentum", "weight_decay": "weight_decay"}
            batch_size_name = "batch_size"

    Hyper-parameters named in `fusible` set that optimizer field (SGD: ``lr``, ``momentum``,
    ``dampening``, ``weight_decay``; Adam and AdamW: ``lr``, ``beta1``, ``beta2``, ``eps``,
    ``weight_decay``; RMSprop: ``lr``, ``alpha``, ``eps``, ``weight_decay``, ``momentum``;
    Adagrad: ``lr``, ``lr_decay``, ``weight_decay``, ``eps``) and may differ inside a fused group; `batch_size_name` sets the batch
    size of `batches`; any other name goes to `apply` (which rejects it unless overridden).

    The state (`state_dict`) is ``{"model", "optimizer", "batches"}``: the module's and the
    ``torch.optim`` optimizer's state dicts and the data order's state. Anything else a step
    depends on must be set again by `setup` (dagtune passes every value at a start or
    resume), or be fixed by the trainer arguments. Gradient clipping goes in `before_step`.
    """

    #: hyper-parameter name -> optimizer field; these may differ between fused members
    fusible: ClassVar[Mapping[str, str]] = {}
    #: the hyper-parameter that sets the batch size of `batches` (None: none does)
    batch_size_name: ClassVar[str | None] = None
    #: batches per step; None: one step is the rest of the current epoch
    batches_per_step: ClassVar[int | None] = None
    #: how a fused group computes convolutions and matrix products: ``"exact"`` one member at
    #: a time (every member bit for bit what it computes in a group of one, whatever K);
    #: ``"grouped"`` batched, one grouped convolution for all members (faster for CNNs; a
    #: member's result then depends on K within rounding; docs/fusion.md)
    fused_kernels: ClassVar[str] = "exact"

    def __init__(self, model: nn.Module, optimizer: OptimizerSpec, batches: ResumableBatches):
        name = type(self).__qualname__
        if not isinstance(model, nn.Module):
            raise TypeError(f"{name}: model must be a torch.nn.Module, got {model!r}")
        if not isinstance(optimizer, OptimizerSpec):
            raise TypeError(
                f"{name}: optimizer must be one of dagtune.SGD, Adam, AdamW, RMSprop, Adagrad (an OptimizerSpec), got {optimizer!r}"
            )
        if not isinstance(batches, ResumableBatches):
            raise TypeError(f"{name}: batches must be a dagtune.ResumableBatches, got {batches!r}")
        self.check_declarations(optimizer)
        self.model = model
        self.optimizer_spec = optimizer
        self.optimizer = optimizer.build(model.parameters())
        self.batches = batches

    @classmethod
    def check_declarations(cls, optimizer: OptimizerSpec) -> None:
        """Raise a ValueError naming the class attribute that does not fit `optimizer`."""
        name = cls.__qualname__
        if not isinstance(cls.fusible, Mapping):
            raise ValueError(f"{name}.fusible must be a dict of hyper-parameter -> optimizer field")
        for hyperparameter, field in cls.fusible.items():
            if field not in optimizer.fields:
                raise ValueError(
                    f"{name}.fusible maps {hyperparameter!r} to {field!r}, which "
                    f"{type(optimizer).__name__} does not have; its fields are {list(optimizer.fields)}"
                )
        if cls.batch_size_name is not None and cls.batch_size_name in cls.fusible:
            raise ValueError(f"{name}.batch_size_name {cls.batch_size_name!r} is also in {name}.fusible")
        check_int(f"{name}.batches_per_step", cls.batches_per_step, minimum=1, optional=True)
        if cls.fused_kernels not in KERNEL_MODES:
            raise ValueError(
                f"{name}.fused_kernels must be one of {list(KERNEL_MODES)}, got {cls.fused_kernels!r}"
            )

    @classmethod
    def fusible_names(cls) -> frozenset[str]:
        """The hyper-parameters that may differ between the members of a fused group."""
        return frozenset(cls.fusible)

    # ------------------------------------------------------------------ the user's parts

    @abstractmethod
    def batch(self, indices: np.ndarray) -> Any:
        """The data of the batch of sample `indices` (e.g. ``(x[idx], y[idx])``); a fused
        group fetches it once for all its members."""

    @abstractmethod
    def loss(self, model: Callable[..., Any], batch: Any) -> torch.Tensor:
        """One trial's loss on `batch`: per-sample losses (``reduction="none"``; dagtune takes
        their mean) or a scalar. `model` computes the module's forward: the module itself
        when unfused, a function of one member's weights when fused (so call it, don't read
        its attributes). Per-sample losses give the same value fused and unfused where the
        model's operations do."""

    @abstractmethod
    def evaluate_model(self, model: nn.Module) -> dict[str, float]:
        """Validation metrics of `model` (the module, in eval mode and under
        ``torch.no_grad``; dagtune puts it back in training mode afterwards)."""

    def before_step(self, model: nn.Module) -> None:
        """Called after each batch's backward pass, before the optimizer's step, with the
        trial's model: clip (or otherwise change) its gradients here, with torch's own
        functions, e.g. ``torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)`` or
        ``clip_grad_value_``. The default does nothing.

        Fused, a group calls it once per member, with the host's module holding that member's
        weights, buffers and gradients (each parameter's ``.grad`` is the member's slice of
        the stacked gradient), so a norm is the member's own, never the group's; change
        gradients in place. ``self.optimizer`` there gives the member's ``param_groups`` only.
        """

    def apply(self, name: str, value: Any) -> None:
        """Apply hyper-parameter `name`, which is neither fusible nor the batch size (say, a
        dropout probability). The default knows none."""
        known = sorted([*self.fusible, *([self.batch_size_name] if self.batch_size_name else [])])
        raise ValueError(f"{type(self).__qualname__} has no hyper-parameter {name!r}; it knows {known}")

    # ------------------------------------------------------------------ written by dagtune

    def setup(self, hp: dict[str, Any]) -> None:
        """Route each value: optimizer field, batch size, or `apply`."""
        for name, value in hp.items():
            if name in self.fusible:
                check_fusible_value(name, value)
                for group in self.optimizer.param_groups:
                    self.optimizer_spec.set(group, self.fusible[name], value)
            elif name == self.batch_size_name:
                self.batches.set_batch_size(value)
            else:
                self.apply(name, value)

    def step_batches(self) -> Iterator[np.ndarray]:
        """The batches of one step: the rest of the epoch, or `batches_per_step` of them."""
        if self.batches_per_step is None:
            return self.batches.epoch()
        return self.batches.take(self.batches_per_step)

    def train(self) -> dict[str, float]:
        """One step; returns the step's mean training loss (weighted by batch length)."""
        self.model.train()
        total, count = 0.0, 0
        for indices in self.step_batches():
            total += self.train_batch(indices) * len(indices)
            count += len(indices)
        return {"loss": total / count}

    def train_batch(self, indices: np.ndarray) -> float:
        """One optimizer update on the batch of sample `indices`; returns its loss."""
        batch = self.batch(indices)
        self.optimizer.zero_grad(set_to_none=True)
        loss = mean_loss(self.loss(self.model, batch))
        loss.backward()
        self.before_step(self.model)
        self.optimizer.step()
        return loss.item()

    def evaluate(self) -> dict[str, float]:
        """`evaluate_model` on the model in eval mode, without gradients."""
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad():
                return self.evaluate_model(self.model)
        finally:
            self.model.train(was_training)

    def state_dict(self) -> dict[str, Any]:
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "batches": self.batches.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.batches.load_state_dict(state["batches"])
