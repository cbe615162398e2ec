"""Operations a fused group computes one member at a time, so no member depends on its group.

Under ``vmap``, a convolution of K members becomes one grouped convolution with K times the
channels, and a matrix-vector product (a linear layer with one input or output feature) a
batched product; the CPU kernels then pick their algorithm, blocking and summation order from
the combined shape, so a member's gradients round differently with K (measured on this
machine: a 1-4-8 channel CNN's weight gradients at K = 2 differ from K = 1 in the last bits,
with or without oneDNN). Computed member by member, each member's operation is exactly the
call an unfused trainer makes, so its result depends on nothing but its own weights and is
the unfused result too. Linear layers with at least two input and output features stay
batched: their batched products were member-independent in every shape measured.

`MemberwiseLayers` is a torch function mode that routes those operations through
`Memberwise`, an ``autograd.Function`` whose vmap rule runs the operation once per member; the
per-member calls are ordinary differentiable operations that autograd records as it would for
an unfused trainer.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.nn import functional
from torch.overrides import TorchFunctionMode

__all__ = ["MEMBERWISE_OPERATIONS", "Memberwise", "MemberwiseLayers"]

#: computed one member at a time (positional arguments: input, weight, bias, options...)
MEMBERWISE_OPERATIONS = frozenset(
    {
        torch.conv1d,
        torch.conv2d,
        torch.conv3d,
        torch.conv_transpose1d,
        torch.conv_transpose2d,
        torch.conv_transpose3d,
    }
)


def _members(value: Any, dim: Any, count: int) -> list[Any]:
    """`value`'s slice of each member (vmap gives a dimension for a tensor it batched, None or
    a tree of Nones for everything else). ``unbind`` rather than one ``select`` per member:
    autograd then stacks the members' gradients once instead of adding K full-size ones."""
    if isinstance(value, torch.Tensor) and isinstance(dim, int):
        return list(value.unbind(dim))
    return [value] * count


class Memberwise(torch.autograd.Function):
    """``function(*args, **kwargs)``, under vmap once per member."""

    @staticmethod
    def forward(function, kwargs, *args):
        """The operation itself (no member dimension)."""
        return function(*args, **kwargs)

    @staticmethod
    def setup_context(ctx, inputs, output):
        """Nothing to keep: under vmap the per-member calls are recorded by autograd itself,
        and without a member dimension no input requires a gradient."""

    @staticmethod
    def vmap(info, in_dims, function, kwargs, *args):
        per_member = zip(*(_members(arg, dim, info.batch_size) for arg, dim in zip(args, in_dims[2:])))
        return torch.stack([function(*member_args, **kwargs) for member_args in per_member]), 0


class MemberwiseLayers(TorchFunctionMode):
    """Inside a fused step: convolutions and matrix-vector linear layers one member at a time."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func in MEMBERWISE_OPERATIONS or func is functional.linear:
            args = _positional(args, kwargs)  # the tensors must be positional for vmap
            if func is not functional.linear or _matrix_vector(args[1]):
                return Memberwise.apply(func, kwargs, *args)
        return func(*args, **kwargs)


def _positional(args: tuple, kwargs: dict) -> tuple:
    """`args` extended with ``input``, ``weight`` and ``bias`` moved out of `kwargs`."""
    positional = list(args)
    for name in ("input", "weight", "bias")[len(positional) :]:
        if name not in kwargs:
            break
        positional.append(kwargs.pop(name))
    return tuple(positional)


def _matrix_vector(weight: Any) -> bool:
    return isinstance(weight, torch.Tensor) and weight.dim() == 2 and min(weight.shape) == 1
