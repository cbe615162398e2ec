"""Horizontal fusion without vmap: a stack of standard layers run once for K members.

With ``fused_kernels="grouped"`` a fused step may batch convolutions and matrix products
(a member's result then depends on K by rounding). For a model that is an ``nn.Sequential``
of layers this module knows (`LAYERS`), vmap is not needed for the model at all: the
members' channels sit side by side and each layer runs as one ordinary operation, as HFTA
fuses models:

- ``Conv2d``: one convolution over the members' channels, with the members' weights
  concatenated along the output channels and ``groups`` times K (a shared input, the first
  layer's images, is convolved once with all members' filters);
- ``Linear``: one batched product (``baddbmm``) of each member's rows with its weight;
- ``dagtune.mup.Readout`` (muP's output layer): its input multiplied by the layer's constant
  ``output_mult / width_mult`` (elementwise, so each member's rows round as its own call's),
  then the product of ``Linear``;
- ``ReLU``, ``MaxPool2d`` (channels-last, `channels_last`, bitwise the NCHW kernel),
  ``Flatten`` (members' channels to rows), ``Dropout`` (one draw laid out like a member's
  input, every member multiplied by it, as `shared_noise` does under vmap): as they are.

vmap's per-operation dispatch, which costs more than the operations of a small CNN (a
digits batch of one member: 2.6 ms fused against 1.7 ms unfused), is gone; the loss around
the model still runs under vmap. `horizontal_call` runs the model this way when every layer
is one of those, none has hooks (the fusion check's trace records each layer's output, so a
checked batch takes vmap's path) and the input is one tensor; otherwise it returns None and
the caller uses vmap's path. A member's result depends on K by rounding, as with vmap's
grouped kernels (docs/fusion.md states what holds).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn
from torch.nn import functional

from dagtune.fusion._memberwise import below_vmap, channels_last
from dagtune.mup import Readout

__all__ = ["LAYERS", "horizontal_call", "is_horizontal"]

#: the layers a model may consist of to run without vmap
LAYERS = (nn.Conv2d, nn.Linear, Readout, nn.ReLU, nn.MaxPool2d, nn.Flatten, nn.Dropout)


#: layers of the image part (before a Flatten or Linear) and of the dense part (after)
_IMAGE_LAYERS = (nn.Conv2d, nn.ReLU, nn.MaxPool2d, nn.Dropout)
_DENSE_LAYERS = (nn.Linear, Readout, nn.ReLU, nn.Dropout)


def is_horizontal(module: nn.Module) -> bool:
    """Whether `module` is an ``nn.Sequential`` of `LAYERS` only (exact types: a subclass may
    compute something else): image layers, then optionally one ``Flatten`` (from dimension 1
    to the end) and dense layers; zero padding, pooling without indices, and no hooks."""
    if type(module) is not nn.Sequential or len(module) == 0 or _hooked(module):
        return False
    dense = False
    for layer in module:
        if _hooked(layer) or type(layer) not in (_DENSE_LAYERS if dense else (*_IMAGE_LAYERS, *LAYERS)):
            return False
        dense = dense or type(layer) in (nn.Flatten, nn.Linear, Readout)
        if isinstance(layer, nn.Conv2d) and layer.padding_mode != "zeros":
            return False
        if isinstance(layer, nn.Flatten) and (layer.start_dim, layer.end_dim) != (1, -1):
            return False
        if isinstance(layer, nn.MaxPool2d) and layer.return_indices:
            return False
    return True


def _hooked(module: nn.Module) -> bool:
    return bool(
        module._forward_hooks
        or module._forward_pre_hooks
        or nn.modules.module._global_forward_hooks
        or nn.modules.module._global_forward_pre_hooks
    )


def horizontal_call(
    module: nn.Module, tensors: Mapping[str, torch.Tensor], args: tuple, kwargs: dict
) -> torch.Tensor | None:
    """``module(*args)`` for every member (each with its weights in `tensors`, batched by the
    enclosing vmap) run as one stack of ordinary operations below vmap, its output batched
    again; None when the model or the call is not one `is_horizontal` covers (the caller then
    uses vmap's path)."""
    if kwargs or len(args) != 1 or not isinstance(args[0], torch.Tensor) or not is_horizontal(module):
        return None
    images = any(isinstance(layer, (nn.Conv2d, nn.MaxPool2d)) for layer in module)
    if args[0].dim() != (4 if images else 2):  # a member's input: a batch of images, or of rows
        return None
    names = [name for name, _ in module.named_parameters(remove_duplicate=False)]
    if any(name not in tensors for name in names):  # tied weights: the fused state holds them once
        return None

    def rule(members: int, values: list[torch.Tensor], dims: list[int | None]) -> tuple[list, list]:
        weights = {
            name: _leading(value, dim, members) for name, value, dim in zip(names, values[1:], dims[1:])
        }
        with torch._C.DisableTorchFunction():  # no MemberwiseLayers: these are the fused operations
            output, dim = _forward(module, weights, values[0], dims[0], members)
        return [output], [dim]

    batched = below_vmap(rule, [args[0], *(tensors[name] for name in names)])
    return None if batched is None else batched[0]


def _leading(value: torch.Tensor, dim: int | None, members: int) -> torch.Tensor:
    """A member-stacked weight with its members first (a shared one expanded)."""
    if dim is None:
        return value.expand(members, *value.shape)
    return value.movedim(dim, 0)


def _forward(
    module: nn.Sequential,
    weights: dict[str, torch.Tensor],
    input: torch.Tensor,
    dim: int | None,
    members: int,
) -> tuple[torch.Tensor, int]:
    """The layers on the members' activations; the output and the dimension of its members.
    Activations are either *shared* (the input, the same for every member), *channels*
    ([N, K * C, ...]: the members' channels side by side) or *rows* ([K, N, ..., F])."""
    layout = "shared" if dim is None else "rows"
    x = input if dim is None else input.movedim(dim, 0)
    for index, layer in enumerate(module):
        prefix = f"{index}."
        if isinstance(layer, nn.Conv2d):
            if layout == "rows":
                x, layout = _rows_to_channels(x), "channels"
            x = _conv(layer, weights, prefix, x, members, shared=layout == "shared")
            layout = "channels"
        elif isinstance(layer, nn.Linear):
            if layout == "shared":
                x = x.expand(members, *x.shape)
            elif layout == "channels":
                x = _channels_to_rows(x, members)
            if type(layer) is Readout:  # as `Readout.forward` scales its input
                x = x * (layer.output_mult / layer.width_mult)
            x, layout = _linear(weights, prefix, x, layer.bias is not None), "rows"
        elif isinstance(layer, nn.Flatten):
            if layout == "channels":
                x, layout = _channels_to_rows(x, members).flatten(2), "rows"
            elif layout == "shared":
                x = x.flatten(1)
            else:
                x = x.flatten(2)
        elif isinstance(layer, nn.ReLU):
            x = functional.relu(x)
        elif isinstance(layer, nn.MaxPool2d):
            x = _pool(layer, x, layout)
        elif layer.training and layer.p > 0:  # nn.Dropout
            if layout == "shared":
                x, layout = x.expand(members, *x.shape), "rows"
            x = _dropout(layer, x, layout, members)
    if layout == "shared":
        return x.expand(members, *x.shape), 0
    if layout == "channels":
        return x.unflatten(1, (members, -1)), 1
    return x, 0


def _conv(
    layer: nn.Conv2d, weights: dict, prefix: str, x: torch.Tensor, members: int, shared: bool
) -> torch.Tensor:
    """One convolution for every member: their filters side by side, ``groups`` times K (a
    shared input is convolved once with all members' filters when the layer has one group;
    with several, each member's group needs its own copy of the input channels)."""
    weight = weights[prefix + "weight"].flatten(0, 1)
    bias = weights[prefix + "bias"].flatten() if layer.bias is not None else None
    if shared and layer.groups > 1:
        x, shared = x.repeat(1, members, 1, 1), False
    groups = layer.groups if shared else layer.groups * members
    output = functional.conv2d(x, weight, bias, layer.stride, layer.padding, layer.dilation, groups)
    return output.contiguous(memory_format=torch.channels_last)


def _linear(weights: dict, prefix: str, x: torch.Tensor, bias: bool) -> torch.Tensor:
    """Each member's rows [K, N, ..., F] times its weight, in one batched product."""
    rows = x.flatten(1, -2) if x.dim() > 3 else x
    weight = weights[prefix + "weight"].transpose(1, 2)
    if bias:
        out = torch.baddbmm(weights[prefix + "bias"].unsqueeze(1), rows, weight)
    else:
        out = torch.bmm(rows, weight)
    return out.view(*x.shape[:-1], out.shape[-1]) if x.dim() > 3 else out


def _channels_to_rows(x: torch.Tensor, members: int) -> torch.Tensor:
    """[N, K * C, ...] -> [K, N, C, ...], each member's slice contiguous (as unfused)."""
    return x.unflatten(1, (members, -1)).transpose(0, 1).contiguous()


def _rows_to_channels(x: torch.Tensor) -> torch.Tensor:
    """[K, N, C, ...] -> [N, K * C, ...]."""
    return x.transpose(0, 1).flatten(1, 2)


def _pool(layer: nn.MaxPool2d, x: torch.Tensor, layout: str) -> torch.Tensor:
    """Max pooling in the channels-last layout (bitwise the NCHW kernel's values, 8x faster on
    a CPU): the members' channels side by side are already channels-last (`_conv`), their
    rows [K, N, C, H, W] are folded into the images."""

    def pool(planes: torch.Tensor) -> torch.Tensor:
        return functional.max_pool2d(
            planes, layer.kernel_size, layer.stride, layer.padding, layer.dilation, layer.ceil_mode
        )

    if layout == "channels":
        return pool(x.contiguous(memory_format=torch.channels_last))
    if layout == "rows" and x.dim() == 5:
        return channels_last(pool, x.flatten(0, 1))[0].unflatten(0, x.shape[:2])
    return channels_last(pool, x)[0]


def _dropout(layer: nn.Dropout, x: torch.Tensor, layout: str, members: int) -> torch.Tensor:
    """One draw into a dense tensor shaped like a member's input (as unfused dropout draws into
    ``empty_like`` of its contiguous input), every member multiplied by it."""
    if layout == "rows":
        return x * functional.dropout(x.new_ones(x.shape[1:]), layer.p, True)
    split = x.unflatten(1, (members, -1))  # [N, K, C, ...]
    noise = functional.dropout(x.new_ones(split.shape[:1] + split.shape[2:]), layer.p, True)
    return (split * noise.unsqueeze(1)).flatten(1, 2)
