"""RMSprop and Adagrad, unfused (``torch.optim``) and fused (K trials in one set of tensors).

The fused updates follow the rules of `dagtune.fusion._optimizers` (each member rounds as
the single-tensor torch optimizer rounds on its own parameters): ``x.add_(y, alpha=a)``
becomes ``x.addcmul_(y, a_k)``, ``addcdiv_(a, b, value=v)`` becomes ``addcdiv_(a * v_k, b)``,
``addcmul_(a, b, value=v)`` becomes ``addcmul_(a * v_k, b)``, and torch's per-trial branches
(``weight_decay != 0``, ``momentum > 0``) are taken per member.

RMSprop creates a momentum buffer for a parameter only when the trial's momentum is above 0
at that parameter's first step, so members of one group may keep different state keys
(`FusedOptimizer.optional_keys`). Adagrad creates its state when it is built, the sums filled
with ``initial_accumulator_value``, which is therefore a fixed option, not a hyper-parameter.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import ClassVar

import torch

from dagtune.fusion._optimizers import CountedOptimizer, FusedOptimizer, OptimizerSpec

__all__ = ["Adagrad", "FusedAdagrad", "FusedRMSprop", "RMSprop"]


@dataclass(frozen=True)
class RMSprop(OptimizerSpec):
    """``torch.optim.RMSprop``: smoothing `alpha`, weight decay (L2), momentum; `centered`
    (normalize by the gradient's estimated variance) is fixed for the trainer."""

    lr: float = 0.01
    alpha: float = 0.99
    eps: float = 1e-8
    weight_decay: float = 0.0
    momentum: float = 0.0
    centered: bool = False
    maximize: bool = False

    fields: ClassVar[tuple[str, ...]] = ("lr", "alpha", "eps", "weight_decay", "momentum")

    def build(self, params: Iterable[torch.Tensor]) -> torch.optim.Optimizer:
        return torch.optim.RMSprop(
            params,
            lr=self.lr,
            alpha=self.alpha,
            eps=self.eps,
            weight_decay=self.weight_decay,
            momentum=self.momentum,
            centered=self.centered,
            maximize=self.maximize,
            foreach=False,
        )

    def fused(self, params, groups, state, present, keys=None) -> FusedOptimizer:
        return FusedRMSprop(self, params, groups, state, present, keys)


@dataclass(frozen=True)
class Adagrad(OptimizerSpec):
    """``torch.optim.Adagrad`` (dense gradients): rate decay `lr_decay`, weight decay (L2);
    `initial_accumulator_value` is fixed for the trainer (torch fills the sums with it when
    the optimizer is built)."""

    lr: float = 0.01
    lr_decay: float = 0.0
    weight_decay: float = 0.0
    eps: float = 1e-10
    initial_accumulator_value: float = 0.0
    maximize: bool = False

    fields: ClassVar[tuple[str, ...]] = ("lr", "lr_decay", "weight_decay", "eps")
    fixed_numbers: ClassVar[tuple[str, ...]] = ("initial_accumulator_value",)

    def build(self, params: Iterable[torch.Tensor]) -> torch.optim.Optimizer:
        return torch.optim.Adagrad(
            params,
            lr=self.lr,
            lr_decay=self.lr_decay,
            weight_decay=self.weight_decay,
            eps=self.eps,
            initial_accumulator_value=self.initial_accumulator_value,
            maximize=self.maximize,
            foreach=False,
        )

    def fused(self, params, groups, state, present, keys=None) -> FusedOptimizer:
        return FusedAdagrad(self, params, groups, state, present, keys)


class FusedRMSprop(CountedOptimizer):
    """``torch.optim.RMSprop``'s single-tensor update (``capturable=False``), per member."""

    optional_keys = ("momentum_buffer",)
    spec: RMSprop

    def __init__(self, spec, params, groups, state, present, keys=None):
        self.state_keys = ("step", "square_avg", "momentum_buffer") + (("grad_avg",) if spec.centered else ())
        super().__init__(spec, params, groups, state, present, keys)

    def _check_buffers(self, moving: list[bool]) -> None:
        """Raise a ValueError naming a member whose momentum is above 0 on a parameter whose
        state was created without a momentum buffer (torch's RMSprop fails there with
        ``KeyError: 'momentum_buffer'``)."""
        for index, param in enumerate(self.params):
            if param.grad is None:
                continue
            lacking = self.lacking[index]["momentum_buffer"]
            for member in range(self.members):
                if moving[member] and self.present[index][member] and lacking[member]:
                    raise ValueError(
                        f"member {member}: RMSprop momentum {self.values('momentum')[member]} on parameter "
                        f"{index}, whose state was created with momentum 0 (no momentum buffer); "
                        f"torch.optim.RMSprop fails there too (KeyError: 'momentum_buffer')"
                    )

    def step(self) -> None:
        spec = self.spec
        lr, alpha, eps = self.values("lr"), self.values("alpha"), self.values("eps")
        weight_decay, momentum = self.values("weight_decay"), self.values("momentum")
        moving = [m > 0 for m in momentum]
        if any(moving):
            self._check_buffers(moving)
        for index, param in enumerate(self.params):
            grad = param.grad
            if grad is None:
                continue
            state, lacking = self.state[index], self.lacking[index]["momentum_buffer"]
            for member, present in enumerate(self.present[index]):
                if not present:  # torch creates the state now; a buffer only with momentum
                    lacking[member] = not moving[member]
            self._count(index)
            if spec.maximize:
                grad = -grad
            grad = self._coupled_decay(grad, param, weight_decay)
            square_avg = state["square_avg"]
            square_avg.mul_(self._per_member("alpha", alpha, param))
            square_avg.addcmul_(grad * self._per_member("1-alpha", [1 - a for a in alpha], param), grad)
            if spec.centered:
                grad_avg = state["grad_avg"]
                grad_avg.lerp_(grad, self._per_member("1-alpha", [1 - a for a in alpha], param))
                avg = square_avg.addcmul(grad_avg, grad_avg, value=-1).sqrt_()
            else:
                avg = square_avg.sqrt()
            avg.add_(self._per_member("eps", eps, param))
            minus_lr = self._per_member("-lr", [-a for a in lr], param)
            if all(moving):
                buf = state["momentum_buffer"]
                buf.mul_(self._per_member("momentum", momentum, param)).addcdiv_(grad, avg)
                param.addcmul_(buf, minus_lr)
            elif any(moving):
                buf = state["momentum_buffer"]
                flags = self._per_member("moving", moving, param)
                stepped = torch.addcdiv(buf * self._per_member("momentum", momentum, param), grad, avg)
                buf.copy_(torch.where(flags, stepped, buf))
                param.copy_(
                    torch.where(flags, param.addcmul(buf, minus_lr), param.addcdiv(grad * minus_lr, avg))
                )
            else:
                param.addcdiv_(grad * minus_lr, avg)


class FusedAdagrad(CountedOptimizer):
    """``torch.optim.Adagrad``'s single-tensor update for dense gradients, per member."""

    state_keys = ("step", "sum")
    spec: Adagrad

    def step(self) -> None:
        spec = self.spec
        lr, lr_decay = self.values("lr"), self.values("lr_decay")
        weight_decay, eps = self.values("weight_decay"), self.values("eps")
        for index, param in enumerate(self.params):
            grad = param.grad
            if grad is None:
                continue
            state_sum = self.state[index]["sum"]
            if not all(self.present[index]):  # torch creates missing state now, the sum filled
                absent = self._per_step([not present for present in self.present[index]], param)
                filled = torch.full_like(state_sum, spec.initial_accumulator_value)
                state_sum = self.state[index]["sum"] = torch.where(absent, filled, state_sum)
            steps = self._count(index)
            if spec.maximize:
                grad = -grad
            grad = self._coupled_decay(grad, param, weight_decay)
            clr = [-(a / (1 + (s - 1) * d)) for a, d, s in zip(lr, lr_decay, steps)]
            state_sum.addcmul_(grad, grad, value=1)
            std = state_sum.sqrt().add_(self._per_member("eps", eps, param))
            param.addcdiv_(grad * self._per_step(clr, param), std)
