"""`ModuleTrace`: what each layer of a model computed in one forward pass, and where it failed.

The fusion check (`dagtune.fusion.check_fusion`) names the layer where a fused step stops
agreeing with unfused training, or where fusion cannot run at all. A trace records, with
forward hooks on every submodule, the name of each module call in call order and the tensors
of its output, and keeps the stack of the modules still running: after an error, its top is
the innermost module the error came from. Inside a fused step the recorded outputs are
vmap's batched tensors; the fused group returns them from its vmapped function, stacked
(``[K, ...]``), and puts them back with `take`.
"""

from __future__ import annotations

import functools
import traceback
from typing import Any

import torch
from torch import nn
from torch.utils import _pytree as pytree

__all__ = ["ModuleTrace", "describe_module", "module_of_error"]


def describe_module(model: nn.Module, name: str) -> str:
    """``module 'layer.self_attn' (MultiheadAttention)``; the root module is "the model"."""
    kind = type(model.get_submodule(name)).__name__
    return f"module {name!r} ({kind})" if name else f"the model ({kind})"


def module_of_error(model: nn.Module, error: BaseException) -> str | None:
    """The name of `model`'s innermost module whose code was running when `error` was raised
    (the deepest traceback frame whose ``self`` is one of its modules; None: none was), for
    an error of a fused step that ran without a trace (a later step's)."""
    names = {id(module): name for name, module in model.named_modules()}
    for frame, _ in reversed(list(traceback.walk_tb(error.__traceback__))):
        owner = frame.f_locals.get("self")
        if owner is not None and id(owner) in names and isinstance(owner, nn.Module):
            return names[id(owner)]
    return None


class ModuleTrace:
    """Every call of `model`'s modules while the trace is entered: `calls` (names, in call
    order), `outputs` (the tensors each returned) and `active` (the modules entered and not
    yet returned from: after an error, the innermost is last)."""

    def __init__(self, model: nn.Module):
        self.model = model
        self.calls: list[str] = []
        self.outputs: list[list[torch.Tensor]] = []
        self.active: list[str] = []
        self._handles: list[Any] = []

    def __enter__(self) -> ModuleTrace:
        for name, module in self.model.named_modules():
            self._handles.append(module.register_forward_pre_hook(functools.partial(self._enter, name)))
            self._handles.append(module.register_forward_hook(functools.partial(self._exit, name)))
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def _enter(self, name: str, module: nn.Module, args: Any) -> None:
        self.active.append(name)

    def _exit(self, name: str, module: nn.Module, args: Any, output: Any) -> None:
        if self.active and self.active[-1] == name:
            self.active.pop()
        self.calls.append(name)
        self.outputs.append([leaf for leaf in pytree.tree_leaves(output) if isinstance(leaf, torch.Tensor)])

    def culprit(self) -> str | None:
        """The innermost module running when an error stopped the pass (None: none was)."""
        return self.active[-1] if self.active else None

    def take(self, outputs: list[list[torch.Tensor]]) -> None:
        """Replace the recorded outputs (a fused group's, stacked out of vmap)."""
        self.outputs = [[tensor.detach() for tensor in tensors] for tensors in outputs]
