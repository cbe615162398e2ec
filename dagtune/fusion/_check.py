"""The fusion check: before a trainer's first fused task trains, can it fuse, and exactly?

`check_fusion` trains the first batch of a throwaway trainer three ways, from the same
weights, data and random state:

1. **the probe**: a fused group of two members. An operation fusion cannot batch (a custom
   ``autograd.Function`` without vmap support, an op without a batching rule, ``.item()``
   in the forward) fails here, before anything trains; the verdict names the innermost
   module that was running and the error.
2. a fused group of one: each member of the probe must equal it **bit for bit** (losses,
   every layer's output, weights, buffers and optimizer state after the update), the
   contract that a member's result does not depend on its group; with
   ``fused_kernels="grouped"`` within the tolerance below instead.
3. with ``agreement``, unfused training: the group of one must agree with it within the
   tolerance (losses, every layer's output, weights and buffers after the update) and leave
   the random generator where it does (dropout draws the same numbers).

The first layer whose output differs names the culprit (forward hooks, `ModuleTrace`);
when every output agrees, the first parameter or buffer that differs after the update.

Tolerance (fused against unfused, elementwise): ``|fused - unfused| <= ATOL + RTOL *
|unfused|``. Measured on this CPU the first batch agrees to about 1e-8 (rounding of batched
products) or bitwise; a dropout mask on other elements, a buffer not carried through or a
layer computed differently is off by 1e-3 or more.
"""

from __future__ import annotations

import copy
import math
import traceback
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from dagtune.errors import DagtuneWarning
from dagtune.fusion._group import FusedGroup
from dagtune.fusion._state import same_state
from dagtune.fusion._trace import ModuleTrace, describe_module
from dagtune.fusion._trainer import FusibleTrainer
from dagtune.trainer import build_trainer, capture_rng, isolated_rng, restore_rng

__all__ = ["ATOL", "FUSION_CHECKS", "RTOL", "FusionVerdict", "FusionWarning", "check_fusion", "error_text"]

RTOL = 1e-4
ATOL = 1e-5
#: what a task's ``fusion_check`` asks: the probe only, or the probe and the agreement check
FUSION_CHECKS = ("probe", "agreement")


class FusionWarning(DagtuneWarning):
    """A trainer's trials train unfused: it cannot fuse, or not exactly (the message says
    why, naming the layer)."""


@dataclass(frozen=True)
class FusionVerdict:
    """Whether a trainer fuses (`ok`), and if not why (`reason`, naming the layer)."""

    ok: bool
    reason: str = ""


def check_fusion(
    trainer: type[FusibleTrainer],
    trainer_kwargs: Mapping[str, Any] | None,
    seed: int,
    hyperparameters: Mapping[str, Any],
    *,
    agreement: bool = True,
) -> FusionVerdict:
    """Check `trainer` (built with `trainer_kwargs` and `seed`, trained with
    `hyperparameters`) as the module docstring says, inside `isolated_rng`. An error of the
    trainer itself (building it, its unfused step) is raised; an error of the fused step is
    the verdict."""
    name = trainer.__qualname__
    with isolated_rng():
        host = build_trainer(trainer, trainer_kwargs, seed)
        if not isinstance(host, FusibleTrainer):
            raise TypeError(f"{name} is not a FusibleTrainer")
        start, rng = copy.deepcopy(host.state_dict()), capture_rng()
        values = dict(hyperparameters)
        host.setup(values)  # the batch size
        indices = host.batches.next_batch()
        pair, pair_failed = _fused(host, start, rng, values, indices, members=2)
        if pair_failed:
            return FusionVerdict(False, f"{name} cannot train fused: {pair_failed}")
        single, single_failed = _fused(host, start, rng, values, indices, members=1)
        if single_failed:
            return FusionVerdict(False, f"{name} cannot train fused: {single_failed}")
        exact = host.fused_kernels == "exact"
        for member in range(2):
            difference = _difference(host, pair, member, single, 0, exact)
            if difference:
                how = "bit for bit" if exact else f"within rtol={RTOL:g}, atol={ATOL:g}"
                return FusionVerdict(
                    False,
                    f"{name}'s fused result depends on its group: member {member} of a group of 2 and "
                    f"a group of 1 differ ({how}) at {difference}",
                )
        if agreement:
            alone = _unfused(host, start, rng, values, indices)
            difference = _difference(host, single, 0, alone, None, exact=False)
            if difference:
                return FusionVerdict(
                    False,
                    f"{name} trained fused does not agree with unfused training within rtol={RTOL:g}, "
                    f"atol={ATOL:g} on its first batch: {difference}",
                )
    return FusionVerdict(True)


@dataclass
class _Run:
    """One way of training the first batch: losses, the trace, the state and RNG after."""

    losses: list[float]
    trace: ModuleTrace
    states: list[dict]
    rng: dict


def _fused(
    host: FusibleTrainer, start: dict, rng: dict, values: dict, indices: Any, members: int
) -> tuple[_Run | None, str]:
    """The first batch as a fused group of `members` copies of `start`; or the error."""
    trace = ModuleTrace(host.model)
    try:
        group = FusedGroup.from_states(host, [start] * members)
        group.setup([values] * members)
        host.model.train()
        restore_rng(rng)
        with trace:
            losses = group.train_batch(indices, trace)
    except Exception as error:
        where = trace.culprit()
        place = f"in {describe_module(host.model, where)}" if where is not None else "in its fused step"
        return None, f"{place}: {error_text(error)}"
    states = [group.state_dict(member) for member in range(members)]
    return _Run(losses, trace, states, capture_rng()), ""


def _unfused(host: FusibleTrainer, start: dict, rng: dict, values: dict, indices: Any) -> _Run:
    host.load_state_dict(start)
    host.setup(values)
    host.model.train()
    restore_rng(rng)
    with ModuleTrace(host.model) as trace:
        loss = host.train_batch(indices)
    return _Run([loss], trace, [host.state_dict()], capture_rng())


def _difference(
    host: FusibleTrainer, a: _Run, member_a: int, b: _Run, member_b: int | None, exact: bool
) -> str:
    """Where run `a`'s member `member_a` first differs from run `b`'s (``member_b`` None:
    an unfused run), bit for bit or within the tolerance; "" where nothing does."""
    if a.trace.calls != b.trace.calls:
        return f"the layers ran in another order ({a.trace.calls} against {b.trace.calls})"
    for name, outputs_a, outputs_b in zip(a.trace.calls, a.trace.outputs, b.trace.outputs):
        for x, y in zip(outputs_a, outputs_b):
            found = _compare(x[member_a], y if member_b is None else y[member_b], exact)
            if found:
                return f"the output of {describe_module(host.model, name)}: {found}"
    loss_a, loss_b = a.losses[member_a], b.losses[member_b or 0]
    found = _compare(
        torch.tensor(loss_a, dtype=torch.float64), torch.tensor(loss_b, dtype=torch.float64), exact
    )
    if found:
        return f"the loss: {found}"
    model_a, model_b = a.states[member_a]["model"], b.states[member_b or 0]["model"]
    for key, value in model_a.items():
        found = _compare(value, model_b[key], exact)
        if found:
            kind = "parameter" if key in dict(host.model.named_parameters()) else "buffer"
            return f"{kind} {key!r} after the update: {found}"
    if exact and not same_state(a.states[member_a]["optimizer"], b.states[member_b or 0]["optimizer"]):
        return "the optimizer state after the update"
    if (member_b is None or exact) and not same_state(_torch_rng(a.rng), _torch_rng(b.rng)):
        return "torch's random generator after the step (the fused step drew other random numbers)"
    return ""


def _torch_rng(state: dict) -> dict:
    """Torch's generators of a `capture_rng` state (python's and numpy's are shared with the
    worker's other threads, which may draw from them meanwhile)."""
    return {key: value for key, value in state.items() if key in ("torch", "cuda")}


def _compare(x: torch.Tensor, y: torch.Tensor, exact: bool) -> str:
    """How `x` differs from `y` ("" where it does not): bit for bit, or within the tolerance."""
    x, y = x.detach(), y.detach()
    if x.shape != y.shape or x.dtype != y.dtype:
        return f"{tuple(x.shape)} {x.dtype} against {tuple(y.shape)} {y.dtype}"
    if exact:
        return "" if same_state(x, y) else f"largest difference {_largest(x, y):.3g}"
    if not x.is_floating_point():
        return "" if torch.equal(x, y) else "different values"
    if torch.allclose(x, y, rtol=RTOL, atol=ATOL, equal_nan=True):
        return ""
    return f"largest difference {_largest(x, y):.3g} (rtol={RTOL:g}, atol={ATOL:g})"


def _largest(x: torch.Tensor, y: torch.Tensor) -> float:
    if not x.is_floating_point():
        return math.nan
    return (x.double() - y.double()).abs().nan_to_num(nan=math.inf).max().item() if x.numel() else 0.0


def error_text(error: BaseException) -> str:
    """The error in one line, naming a custom ``autograd.Function`` it came from."""
    first = (str(error).strip().splitlines() or [""])[0]
    text = f"{type(error).__name__}: {first}"
    function = _autograd_function(error)
    return f"{text} (autograd.Function {function})" if function else text


def _autograd_function(error: BaseException) -> str | None:
    """The custom ``autograd.Function`` whose ``apply`` raised `error`, if one did."""
    for frame, _ in reversed(list(traceback.walk_tb(error.__traceback__))):
        cls = frame.f_locals.get("cls")
        if (
            frame.f_code.co_name == "apply"
            and isinstance(cls, type)
            and issubclass(cls, torch.autograd.Function)
        ):
            return cls.__qualname__
    return None
