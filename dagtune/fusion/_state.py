"""Fused state: K unfused `FusibleTrainer` states stacked along a leading member dimension.

A fused group's checkpoints stay per trial and in the unfused format, so everything that reads
checkpoints (resume, GC, an unfused stage continuing a fused one) needs no new concept:
`split` gives a member's unfused state and `stack` builds the fused state from unfused ones,
exactly (``split(stack(states), k)`` equals ``states[k]`` bit for bit, key order included).

The fused format::

    {"members": K,
     "model": OrderedDict(key -> Tensor[K, ...]),        # tied keys share one tensor
     "optimizer": {"state": {index: {key: Tensor[K, ...]}},
                   "present": {index: [bool] * K},         # members that have state there
                   "keys": {index: [member's keys] * K},   # only where members keep different keys
                   "param_groups": [member's param_groups] * K},
     "batches": the data order's state, one for the whole group}
"""

from __future__ import annotations

import copy
import struct
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from dagtune.validation import check_int

__all__ = ["TRAINER_STATE_KEYS", "same_state", "split", "stack"]

#: what a `FusibleTrainer.state_dict` holds
TRAINER_STATE_KEYS = ("model", "optimizer", "batches")


def stack(states: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The fused state of the unfused trainer states `states` (member k is ``states[k]``).

    The members must have the same model layout, one parameter group each over the same
    parameters, and the same data order state (a fused group draws one batch sequence).
    """
    if not states:
        raise ValueError("stack() needs at least one trainer state")
    for member, state in enumerate(states):
        if not isinstance(state, Mapping) or set(state) != set(TRAINER_STATE_KEYS):
            keys = sorted(state) if isinstance(state, Mapping) else type(state).__name__
            raise ValueError(f"member {member}'s state must have keys {list(TRAINER_STATE_KEYS)}, got {keys}")
    batches = states[0]["batches"]
    for member, state in enumerate(states[1:], 1):
        if not same_state(state["batches"], batches):
            raise ValueError(
                f"members 0 and {member} are at different points of the data order "
                f"({batches} != {state['batches']}); a fused group draws one batch sequence"
            )
    return {
        "members": len(states),
        "model": _stack_model([state["model"] for state in states]),
        "optimizer": _stack_optimizer([state["optimizer"] for state in states]),
        "batches": copy.deepcopy(dict(batches)),
    }


def split(fused: Mapping[str, Any], member: int) -> dict[str, Any]:
    """Member `member`'s unfused trainer state (new tensors: the fused state is not shared)."""
    members = fused["members"]
    check_int("member", member, minimum=0, maximum=members - 1)
    clones: dict[int, torch.Tensor] = {}
    model: OrderedDict[str, torch.Tensor] = OrderedDict()
    for key, tensor in fused["model"].items():
        if id(tensor) not in clones:
            clones[id(tensor)] = tensor[member].detach().clone()
        model[key] = clones[id(tensor)]
    metadata = getattr(fused["model"], "_metadata", None)
    if metadata is not None:
        model._metadata = copy.deepcopy(metadata)  # type: ignore[attr-defined]
    optimizer = fused["optimizer"]
    member_keys = optimizer.get("keys", {})
    state = {
        index: {
            key: stacked[key][member].detach().clone()
            for key in (member_keys[index][member] if index in member_keys else stacked)
        }
        for index, stacked in optimizer["state"].items()
        if optimizer["present"][index][member]
    }
    groups = [{**group, "params": list(group["params"])} for group in optimizer["param_groups"][member]]
    return {
        "model": model,
        "optimizer": {"state": state, "param_groups": groups},
        "batches": copy.deepcopy(dict(fused["batches"])),
    }


def _stack_model(models: Sequence[Mapping[str, Any]]) -> OrderedDict[str, torch.Tensor]:
    first = models[0]
    keys = list(first)
    for member, model in enumerate(models[1:], 1):
        if list(model) != keys:
            raise ValueError(f"members 0 and {member} have different model layouts: {keys} != {list(model)}")
    stacked: OrderedDict[str, torch.Tensor] = OrderedDict()
    owner: dict[int, str] = {}  # id of a tensor of member 0 -> the first key holding it
    for key in keys:
        tensor = first[key]
        if not isinstance(tensor, torch.Tensor):
            raise ValueError(
                f"model entry {key!r} is a {type(tensor).__name__}, not a tensor: it cannot be fused"
            )
        if id(tensor) in owner:  # tied weights: one tensor under two keys
            original = owner[id(tensor)]
            for member, model in enumerate(models):
                if model[key] is not model[original]:
                    raise ValueError(f"member {member} does not tie model entries {original!r} and {key!r}")
            stacked[key] = stacked[original]
            continue
        owner[id(tensor)] = key
        parts = [model[key] for model in models]
        for member, part in enumerate(parts):
            if part.shape != tensor.shape or part.dtype != tensor.dtype:
                raise ValueError(
                    f"model entry {key!r} of member {member} is {tuple(part.shape)} {part.dtype}, "
                    f"member 0's is {tuple(tensor.shape)} {tensor.dtype}"
                )
        stacked[key] = torch.stack([part.detach() for part in parts])
    metadata = getattr(first, "_metadata", None)
    if metadata is not None:
        stacked._metadata = copy.deepcopy(metadata)  # type: ignore[attr-defined]
    return stacked


def _stack_optimizer(optimizers: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    groups = []
    for member, optimizer in enumerate(optimizers):
        member_groups = optimizer["param_groups"]
        if len(member_groups) != 1:
            raise ValueError(f"member {member}'s optimizer has {len(member_groups)} parameter groups, not 1")
        if member_groups[0]["params"] != optimizers[0]["param_groups"][0]["params"]:
            raise ValueError(f"members 0 and {member} optimize different parameters")
        groups.append([{**group, "params": list(group["params"])} for group in member_groups])
    order: list[int] = []
    for optimizer in optimizers:
        order.extend(index for index in optimizer["state"] if index not in order)
    state: dict[int, dict[str, torch.Tensor]] = {}
    present: dict[int, list[bool]] = {}
    keys: dict[int, list[list[str]]] = {}
    for index in order:
        flags = [index in optimizer["state"] for optimizer in optimizers]
        member_keys = [
            list(optimizer["state"][index]) if flag else [] for optimizer, flag in zip(optimizers, flags)
        ]
        union: dict[str, torch.Tensor] = {}  # every key some member keeps, a tensor of the first one
        for optimizer, flag in zip(optimizers, flags):
            for key, value in optimizer["state"][index].items() if flag else ():
                if not isinstance(value, torch.Tensor):
                    raise ValueError(
                        f"optimizer state {key!r} of parameter {index} is not a tensor: it cannot be fused"
                    )
                union.setdefault(key, value)
        stacked = {}
        for key, template in union.items():
            parts = []
            for member, (optimizer, flag) in enumerate(zip(optimizers, flags)):
                value = optimizer["state"][index].get(key) if flag else None
                if value is not None and (value.shape != template.shape or value.dtype != template.dtype):
                    raise ValueError(
                        f"optimizer state {key!r} of parameter {index} is {tuple(value.shape)} {value.dtype} "
                        f"for member {member}, {tuple(template.shape)} {template.dtype} for another"
                    )
                parts.append(value.detach() if value is not None else torch.zeros_like(template))
            stacked[key] = torch.stack(parts)
        state[index] = stacked
        present[index] = flags
        if any(flag and names != list(union) for flag, names in zip(flags, member_keys)):
            keys[index] = member_keys  # members keep different keys (the optimizer checks which)
    fused = {"state": state, "present": present, "param_groups": groups}
    if keys:
        fused["keys"] = keys
    return fused


def _bytes(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8)


def same_state(a: Any, b: Any) -> bool:
    """Exact equality of two states: the same structure and key order, the same Python types
    and values, tensors of the same dtype and shape with the same bytes, floats with the same
    bits (so a NaN equals itself and -0.0 differs from 0.0)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (
            isinstance(a, torch.Tensor)
            and isinstance(b, torch.Tensor)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and a.requires_grad == b.requires_grad
            and torch.equal(_bytes(a), _bytes(b))
        )
    if type(a) is not type(b):
        return False
    if isinstance(a, Mapping):
        return list(a) == list(b) and all(same_state(a[key], b[key]) for key in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same_state(x, y) for x, y in zip(a, b))
    if isinstance(a, float):
        return struct.pack("<d", a) == struct.pack("<d", b)
    return a == b
