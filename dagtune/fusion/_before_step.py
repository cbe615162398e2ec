"""`FusibleTrainer.before_step` in a fused group: once per member, on that member alone.

A trainer clips its gradients in ``before_step(model)`` as it would by hand, with torch's own
functions: ``torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)``. Called on a fused
group's stacked parameters that would clip every member by the group's total norm, mixing the
trials. Instead the group calls the hook once per member with the host's module turned into
that member: each parameter aliases the member's slice of the stacked weights (``.data``)
and holds the member's slice of the stacked gradient as ``.grad``, so the norm is the
member's own, computed by the same kernels on the same values as unfused, and whatever the
hook does to ``.grad`` in place (``mul_``, ``clamp_``) lands in the member's slice. A
gradient the hook replaces is copied into the slice; its buffers are the member's too.

What else a hook could read differently fused is ruled out, not approximated: the optimizer
(``self.optimizer``) is a stand-in giving the member's ``param_groups`` and refusing
anything else, and every member's call starts from the same random generator states, which
must end the same (a hook that draws a different amount of random numbers per member fails,
named).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from dagtune.fusion._errors import FusionError
from dagtune.fusion._state import same_state
from dagtune.fusion._trainer import FusibleTrainer
from dagtune.trainer import capture_rng, restore_rng

__all__ = ["MemberOptimizer", "NotPerMemberError", "has_before_step", "run_before_step"]


def has_before_step(cls: type[FusibleTrainer]) -> bool:
    """Whether `cls` overrides `FusibleTrainer.before_step` (a group calls it only then)."""
    return cls.before_step is not FusibleTrainer.before_step


class NotPerMemberError(FusionError, AttributeError):
    """A fused member's `before_step` read an optimizer attribute no member has its own of."""


class MemberOptimizer:
    """What ``self.optimizer`` is inside a fused member's `before_step`: its ``param_groups``
    are the member's (read-only: a hook that changes them fails), anything else fails naming
    it (the host's torch optimizer is no member's)."""

    def __init__(self, trainer: str, group: Mapping[str, Any], params: list[torch.Tensor]):
        self._trainer = trainer
        self._group = dict(group)
        self.param_groups = [{**group, "params": params}]

    def __getattr__(self, name: str) -> Any:
        raise NotPerMemberError(
            f"{self._trainer}.before_step() reads self.optimizer.{name}, which a fused group cannot "
            f"give per member (only self.optimizer.param_groups): read it elsewhere to train fused"
        )

    def check_unchanged(self) -> None:
        """Raise a FusionError naming a field of the member's group the hook changed."""
        group = self.param_groups[0]
        for key, value in self._group.items():
            if key != "params" and not same_state(group.get(key), value):
                raise FusionError(
                    f"{self._trainer}.before_step() changed optimizer field {key!r} ({value!r} -> "
                    f"{group.get(key)!r}), which a fused group cannot carry: set hyper-parameters in setup"
                )


def run_before_step(
    host: FusibleTrainer,
    params: Mapping[str, torch.Tensor],
    buffers: Mapping[str, torch.Tensor],
    groups: list[dict[str, Any]],
) -> None:
    """Call ``host.before_step(host.model)`` once per member of the stacked `params` (their
    ``.grad`` set by the backward pass) and `buffers`, member k's optimizer group
    ``groups[k]``; the module, the optimizer and the random generators are put back after."""
    module, name = host.model, type(host).__qualname__
    keyed = module.state_dict(keep_vars=True)
    module_params = {key: keyed[key] for key in params}
    saved = {key: (param.data, param.grad) for key, param in module_params.items()}
    optimizer = host.optimizer
    start = capture_rng()
    ends = []
    try:
        for member, group in enumerate(groups):
            restore_rng(start)
            slices = {}
            for key, param in module_params.items():
                param.data = params[key].detach()[member]
                stacked_grad = params[key].grad
                slices[key] = param.grad = None if stacked_grad is None else stacked_grad[member]
            current = module.state_dict(keep_vars=True)
            with torch.no_grad():
                for key, stacked in buffers.items():
                    current[key].copy_(stacked[member])
            stand_in = MemberOptimizer(name, group, list(module.parameters()))
            host.optimizer = stand_in  # type: ignore[assignment]
            host.before_step(module)
            stand_in.check_unchanged()
            ends.append(capture_rng())
            _take_back(name, member, module, module_params, slices, buffers)
    finally:
        host.optimizer = optimizer
        for key, param in module_params.items():
            param.data, param.grad = saved[key]
    for member, end in enumerate(ends[1:], 1):
        if not same_state(end, ends[0]):
            raise FusionError(
                f"{name}.before_step() left the random generators in another state for member {member} "
                f"than for member 0 (it draws random numbers depending on its hyper-parameters), "
                f"which one fused group cannot: draw the same numbers for every trial"
            )
    if ends:
        restore_rng(ends[0])


def _take_back(
    name: str,
    member: int,
    module: torch.nn.Module,
    module_params: Mapping[str, torch.Tensor],
    slices: Mapping[str, torch.Tensor | None],
    buffers: Mapping[str, torch.Tensor],
) -> None:
    """Copy what the hook replaced (a gradient, a buffer) into member `member`'s slices."""
    with torch.no_grad():
        for key, param in module_params.items():
            grad, original = param.grad, slices[key]
            if grad is original:
                continue
            if grad is None or original is None or grad.shape != original.shape:
                raise FusionError(
                    f"{name}.before_step() replaced the gradient of {key!r} with "
                    f"{'None' if grad is None else tuple(grad.shape)}, which a fused group cannot carry: "
                    f"change gradients in place (clip_grad_norm_, clip_grad_value_ do)"
                )
            original.copy_(grad)
        current = module.state_dict(keep_vars=True)
        for key, stacked in buffers.items():
            stacked[member].copy_(current[key])
