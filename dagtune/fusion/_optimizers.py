"""Optimizers that run both unfused (torch.optim) and fused (K trials in one set of tensors).

An `OptimizerSpec` (`SGD`, `Adam`, `AdamW`; `RMSprop` and `Adagrad` in
`dagtune.fusion._adaptive`) says which optimizer a `FusibleTrainer` trains with and
its starting values. Unfused, it builds the ordinary ``torch.optim`` optimizer with
``foreach=False`` (the single-tensor implementation, which is also what torch picks on CPU).
Fused, it builds a `FusedOptimizer` over stacked parameters ``[K, ...]`` whose per-trial
hyper-parameters are ``[K, 1, ...]`` tensors.

Each fused update is written so that every member rounds exactly as the single-tensor torch
optimizer does on its own parameters: ``p.add_(g, alpha=-lr)`` becomes
``p.addcmul_(g, -lr)`` (both one fused multiply-add per element), ``addcmul_(a, b, value=v)``
becomes ``addcmul_(a * v, b)``, ``addcdiv_(a, b, value=v)`` becomes ``addcdiv_(a * v, b)``,
scalars are rounded to the parameter's dtype from the same double-precision Python values
torch computes, and the branches torch takes per trial (``momentum != 0``, ``weight_decay !=
0``, a momentum buffer not created yet) are taken per member with `torch.where`. Elementwise
kernels iterate each member's slice the way they iterate an unfused parameter, so a member's
update does not depend on how many others share the tensor or where it sits among them.
"""

from __future__ import annotations

import dataclasses
import math
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from dagtune.validation import is_number

__all__ = ["SGD", "Adam", "AdamW", "FusedAdam", "FusedOptimizer", "FusedSGD", "OptimizerSpec"]


def _hyperparameter_value(field: str, value: Any) -> float:
    if not is_number(value) or not math.isfinite(value):
        raise ValueError(f"optimizer field {field!r} needs a finite number, got {value!r}")
    return float(value)


class OptimizerSpec(ABC):
    """Which optimizer a `FusibleTrainer` uses, with the values it starts from.

    `fields` are the float fields a hyper-parameter may set (and that may differ between the
    members of a fused group); the other fields are fixed for the trainer: bools, or the
    numbers named in `fixed_numbers` (a value torch reads once, when it creates the state).
    """

    fields: ClassVar[tuple[str, ...]]
    fixed_numbers: ClassVar[tuple[str, ...]] = ()

    def __post_init__(self) -> None:
        for name in (*self.fields, *self.fixed_numbers):
            object.__setattr__(self, name, _hyperparameter_value(name, getattr(self, name)))
        for spec_field in dataclasses.fields(self):  # type: ignore[arg-type]
            name = spec_field.name
            fixed = name not in self.fields and name not in self.fixed_numbers
            if fixed and not isinstance(getattr(self, name), bool):
                raise ValueError(f"{type(self).__name__}.{name} must be a bool")

    @abstractmethod
    def build(self, params: Iterable[torch.Tensor]) -> torch.optim.Optimizer:
        """The unfused optimizer over `params` (one parameter group)."""

    @abstractmethod
    def fused(
        self,
        params: Sequence[torch.Tensor],
        groups: Sequence[dict[str, Any]],
        state: Mapping[int, Mapping[str, torch.Tensor]],
        present: Mapping[int, Sequence[bool]],
        keys: Mapping[int, Sequence[Sequence[str]]] | None = None,
    ) -> FusedOptimizer:
        """The fused optimizer over stacked `params` (``[K, ...]`` each): `groups` are the K
        members' torch parameter groups, `state` the stacked per-parameter state, `present`
        which members have state for each parameter and `keys` each member's state keys where
        members differ (the format of `dagtune.fusion.stack`)."""

    def set(self, group: dict[str, Any], field: str, value: Any) -> None:
        """Write hyper-parameter `field` into a torch parameter group."""
        if field not in self.fields:
            raise ValueError(
                f"{type(self).__name__} has no field {field!r}; its fields are {list(self.fields)}"
            )
        group[field] = _hyperparameter_value(field, value)

    def get(self, group: Mapping[str, Any], field: str) -> float:
        """Read hyper-parameter `field` from a torch parameter group."""
        return group[field]


@dataclass(frozen=True)
class SGD(OptimizerSpec):
    """``torch.optim.SGD``: momentum, dampening, Nesterov momentum and weight decay."""

    lr: float = 0.001
    momentum: float = 0.0
    dampening: float = 0.0
    weight_decay: float = 0.0
    nesterov: bool = False
    maximize: bool = False

    fields: ClassVar[tuple[str, ...]] = ("lr", "momentum", "dampening", "weight_decay")

    def build(self, params: Iterable[torch.Tensor]) -> torch.optim.Optimizer:
        return torch.optim.SGD(
            params,
            lr=self.lr,
            momentum=self.momentum,
            dampening=self.dampening,
            weight_decay=self.weight_decay,
            nesterov=self.nesterov,
            maximize=self.maximize,
            foreach=False,
        )

    def fused(self, params, groups, state, present, keys=None) -> FusedOptimizer:
        return FusedSGD(self, params, groups, state, present, keys)


@dataclass(frozen=True)
class Adam(OptimizerSpec):
    """``torch.optim.Adam``: weight decay as L2 (added to the gradient); ``beta1``/``beta2``
    are its ``betas``."""

    lr: float = 0.001
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.0
    amsgrad: bool = False
    maximize: bool = False

    fields: ClassVar[tuple[str, ...]] = ("lr", "beta1", "beta2", "eps", "weight_decay")
    #: AdamW's decoupled weight decay (the weights shrink) instead of Adam's L2 (the gradient grows)
    decoupled: ClassVar[bool] = False

    def build(self, params: Iterable[torch.Tensor]) -> torch.optim.Optimizer:
        optimizer = torch.optim.AdamW if self.decoupled else torch.optim.Adam
        return optimizer(
            params,
            lr=self.lr,
            betas=(self.beta1, self.beta2),
            eps=self.eps,
            weight_decay=self.weight_decay,
            amsgrad=self.amsgrad,
            maximize=self.maximize,
            foreach=False,
        )

    def fused(self, params, groups, state, present, keys=None) -> FusedOptimizer:
        return FusedAdam(self, params, groups, state, present, keys)

    def set(self, group: dict[str, Any], field: str, value: Any) -> None:
        if field in ("beta1", "beta2"):
            beta = _hyperparameter_value(field, value)
            beta1, beta2 = group["betas"]
            group["betas"] = (beta, beta2) if field == "beta1" else (beta1, beta)
        else:
            super().set(group, field, value)

    def get(self, group: Mapping[str, Any], field: str) -> float:
        if field in ("beta1", "beta2"):
            return group["betas"][0 if field == "beta1" else 1]
        return group[field]


@dataclass(frozen=True)
class AdamW(Adam):
    """``torch.optim.AdamW``: decoupled weight decay; ``beta1``/``beta2`` are its ``betas``."""

    weight_decay: float = 0.01

    decoupled: ClassVar[bool] = True


# --------------------------------------------------------------------------- fused


class FusedOptimizer(ABC):
    """The optimizer of K trials whose parameters are stacked along a leading dimension.

    Per-parameter state is stacked the same way; a member without state for a parameter
    (torch creates it lazily, at the first step that needs it) holds zeros there and is marked
    absent, so that `member_state_dict` gives exactly what the unfused optimizer would have.
    A state key that torch creates for some trials only (RMSprop's momentum buffer, created
    when momentum > 0 at a parameter's first step) is one of `optional_keys`: members without
    it hold zeros there and are marked as lacking it (`lacking`).
    """

    #: the per-parameter state keys, in the order torch creates them
    state_keys: ClassVar[tuple[str, ...]]
    #: the state keys a member may lack while it has the others
    optional_keys: ClassVar[tuple[str, ...]] = ()

    def __init__(
        self,
        spec: OptimizerSpec,
        params: Sequence[torch.Tensor],
        groups: Sequence[dict[str, Any]],
        state: Mapping[int, Mapping[str, torch.Tensor]],
        present: Mapping[int, Sequence[bool]],
        keys: Mapping[int, Sequence[Sequence[str]]] | None = None,
    ):
        self.spec = spec
        self.params = list(params)
        self.groups = [dict(group) for group in groups]
        self.members = len(self.groups)
        self.state: list[dict[str, torch.Tensor]] = []
        self.present: list[list[bool]] = []
        for index, param in enumerate(self.params):
            stacked = state.get(index, {})
            self.state.append(
                {
                    key: (
                        stacked[key].to(param.device)
                        if key in stacked
                        else torch.zeros(
                            self._state_shape(key, param),
                            dtype=self._state_dtype(key, param),
                            device=param.device,
                        )
                    )
                    for key in self.state_keys
                }
            )
            self.present.append([bool(v) for v in present.get(index, [False] * self.members)])
        #: per parameter: optional key -> which members lack it
        self.lacking: list[dict[str, list[bool]]] = [
            self._lacking(index, (keys or {}).get(index), state.get(index, {}))
            for index in range(len(self.params))
        ]
        self._cache: dict[tuple, torch.Tensor] = {}

    def _lacking(
        self, index: int, member_keys: Sequence[Sequence[str]] | None, stacked: Mapping[str, Any]
    ) -> dict[str, list[bool]]:
        """Which members lack each optional key of parameter `index`; a ValueError names a key
        this optimizer does not keep or a member lacking one it must have."""
        if member_keys is None:
            member_keys = [list(stacked)] * self.members
        flags = {key: [False] * self.members for key in self.optional_keys}
        for member, names in enumerate(member_keys):
            if not self.present[index][member]:
                continue
            unknown = [key for key in names if key not in self.state_keys]
            missing = [key for key in self.state_keys if key not in names]
            required = [key for key in missing if key not in self.optional_keys]
            if unknown or required or list(names) != [k for k in self.state_keys if k in names]:
                raise ValueError(
                    f"member {member}'s {type(self.spec).__name__} state for parameter {index} has keys "
                    f"{list(names)}; {type(self.spec).__name__} keeps {list(self.state_keys)}"
                    + (
                        f" (of which {list(self.optional_keys)} only for some trials)"
                        if self.optional_keys
                        else ""
                    )
                )
            for key in missing:
                flags[key][member] = True
        return flags

    def _state_shape(self, key: str, param: torch.Tensor) -> tuple[int, ...]:
        return tuple(param.shape)

    def _state_dtype(self, key: str, param: torch.Tensor) -> torch.dtype:
        return param.dtype

    # ---- hyper-parameters

    def set(self, member: int, field: str, value: Any) -> None:
        """Set hyper-parameter `field` of member `member`."""
        self.spec.set(self.groups[member], field, value)
        self._cache.clear()

    def values(self, field: str) -> list[float]:
        return [self.spec.get(group, field) for group in self.groups]

    def _per_member(self, name: str, values: Sequence[float | bool], like: torch.Tensor) -> torch.Tensor:
        """`values` as a ``[K, 1, ...]`` tensor broadcasting against `like` (cached until a
        hyper-parameter changes). Floats are rounded to `like`'s dtype from their double value,
        as torch rounds a Python scalar."""
        key = (name, like.dtype, like.device, like.dim())
        cached = self._cache.get(key)
        if cached is None:
            dtype = torch.bool if isinstance(values[0], bool) else like.dtype
            cached = torch.tensor(list(values), dtype=dtype, device=like.device)
            cached = cached.view(len(values), *([1] * (like.dim() - 1)))
            self._cache[key] = cached
        return cached

    def _per_step(self, values: Sequence[float | bool], like: torch.Tensor) -> torch.Tensor:
        """`values` as a ``[K, 1, ...]`` tensor like `_per_member`'s, not cached: for values
        that change with the state (step counts, which members have state)."""
        dtype = torch.bool if isinstance(values[0], bool) else like.dtype
        shape = (len(values), *([1] * (like.dim() - 1)))
        return torch.tensor(list(values), dtype=dtype, device=like.device).view(shape)

    def _coupled_decay(self, grad: torch.Tensor, param: torch.Tensor, decay: Sequence[float]) -> torch.Tensor:
        """``grad.add(param, alpha=weight_decay)`` (L2 weight decay, as SGD, Adam, RMSprop and
        Adagrad apply it) for the members whose weight decay is not 0."""
        decays = [w != 0 for w in decay]
        if not any(decays):
            return grad
        decayed = torch.addcmul(grad, param, self._per_member("weight_decay", decay, param))
        return _where(decays, self._per_member("decays", decays, param), decayed, grad)

    # ---- stepping

    @abstractmethod
    def step(self) -> None:
        """One update of every member from the stacked parameters' ``.grad``."""

    # ---- state

    def member_state_dict(self, member: int) -> dict[str, Any]:
        """Member `member`'s state in the unfused optimizer's ``state_dict`` format."""
        state = {}
        for index in range(len(self.params)):
            if self.present[index][member]:
                state[index] = {
                    key: self._member_value(index, key, member)
                    for key in self.state_keys
                    if not self.lacking[index].get(key, [False] * self.members)[member]
                }
        group = self.groups[member]
        return {"state": state, "param_groups": [{**group, "params": list(group["params"])}]}

    def _member_value(self, index: int, key: str, member: int) -> torch.Tensor:
        return self.state[index][key][member].clone()

    def fused_state_dict(self) -> dict[str, Any]:
        """The stacked state (tensors shared with this optimizer, not copied); ``"keys"``
        (each member's state keys) only where some member lacks an optional key."""
        fused: dict[str, Any] = {
            "state": {
                index: {key: self._stacked_value(index, key) for key in self.state_keys}
                for index in range(len(self.params))
                if any(self.present[index])
            },
            "present": {index: list(flags) for index, flags in enumerate(self.present) if any(flags)},
            "param_groups": [[{**group, "params": list(group["params"])}] for group in self.groups],
        }
        keys = {
            index: [
                [key for key in self.state_keys if not lacking.get(key, [False] * self.members)[member]]
                for member in range(self.members)
            ]
            for index, lacking in enumerate(self.lacking)
            if any(self.present[index]) and any(any(flags) for flags in lacking.values())
        }
        if keys:
            fused["keys"] = keys
        return fused

    def _stacked_value(self, index: int, key: str) -> torch.Tensor:
        return self.state[index][key]

    def keep(self, members: Sequence[int], params: Sequence[torch.Tensor]) -> None:
        """Keep only `members` (in that order), whose stacked parameters are now `params`."""
        index = torch.tensor(list(members), dtype=torch.long)
        self.params = list(params)
        self.groups = [self.groups[k] for k in members]
        self.members = len(self.groups)
        self.present = [[flags[k] for k in members] for flags in self.present]
        self.lacking = [
            {key: [flags[k] for k in members] for key, flags in lacking.items()} for lacking in self.lacking
        ]
        self.state = [
            {key: value.index_select(0, index.to(value.device)) for key, value in state.items()}
            for state in self.state
        ]
        self._cache.clear()


def _where(
    mask: list[bool], flags: torch.Tensor, then: torch.Tensor, otherwise: torch.Tensor
) -> torch.Tensor:
    """``then`` for members whose flag is set, ``otherwise`` for the others (no copy when
    every member agrees)."""
    if all(mask):
        return then
    if not any(mask):
        return otherwise
    return torch.where(flags, then, otherwise)


class FusedSGD(FusedOptimizer):
    """``torch.optim.SGD``'s single-tensor update, per member."""

    state_keys = ("momentum_buffer",)
    spec: SGD

    def step(self) -> None:
        spec = self.spec
        lr, momentum = self.values("lr"), self.values("momentum")
        dampening, weight_decay = self.values("dampening"), self.values("weight_decay")
        moving = [m != 0 for m in momentum]
        for index, param in enumerate(self.params):
            grad = param.grad
            if grad is None:
                continue
            if spec.maximize:
                grad = -grad
            grad = self._coupled_decay(grad, param, weight_decay)
            if any(moving):
                grad = self._momentum(index, param, grad, momentum, dampening, moving)
            param.addcmul_(grad, self._per_member("-lr", [-v for v in lr], param))

    def _momentum(self, index, param, grad, momentum, dampening, moving) -> torch.Tensor:
        """Advance the momentum buffers of the members with momentum; the update direction."""
        buf = self.state[index]["momentum_buffer"]
        present = self.present[index]
        m = self._per_member("momentum", momentum, param)
        kept = [1 - d for d in dampening]
        if all(moving) and all(present):
            buf.mul_(m).addcmul_(grad, self._per_member("1-dampening", kept, param))
        else:
            stepped = torch.addcmul(buf * m, grad, self._per_member("1-dampening", kept, param))
            continuing = [a and b for a, b in zip(moving, present)]
            starting = [a and not b for a, b in zip(moving, present)]
            if any(starting):  # torch starts a buffer as a copy of the gradient
                buf = _where(starting, torch.tensor(starting, device=buf.device).view_as(m), grad, buf)
            buf = _where(continuing, torch.tensor(continuing, device=buf.device).view_as(m), stepped, buf)
            self.state[index]["momentum_buffer"] = buf
            self.present[index] = [a or b for a, b in zip(present, moving)]
        direction = torch.addcmul(grad, buf, m) if self.spec.nesterov else buf
        return _where(moving, self._per_member("moving", moving, param), direction, grad)


class CountedOptimizer(FusedOptimizer):
    """A fused optimizer whose state has a ``step`` count per parameter (Adam, RMSprop,
    Adagrad). The counts live as Python floats: torch reads ``step_t.item()`` and computes its
    scalars (bias corrections, a decayed rate) from it in double precision."""

    def __init__(self, spec, params, groups, state, present, keys=None):
        super().__init__(spec, params, groups, state, present, keys)
        self.steps = [[float(v) for v in state["step"].tolist()] for state in self.state]

    def _state_shape(self, key: str, param: torch.Tensor) -> tuple[int, ...]:
        return (param.shape[0],) if key == "step" else tuple(param.shape)

    def _state_dtype(self, key: str, param: torch.Tensor) -> torch.dtype:
        return torch.float32 if key == "step" else param.dtype

    def _member_value(self, index: int, key: str, member: int) -> torch.Tensor:
        if key == "step":
            return torch.tensor(self.steps[index][member], dtype=torch.float32)
        return super()._member_value(index, key, member)

    def _stacked_value(self, index: int, key: str) -> torch.Tensor:
        if key == "step":
            return torch.tensor(self.steps[index], dtype=torch.float32)
        return super()._stacked_value(index, key)

    def keep(self, members: Sequence[int], params: Sequence[torch.Tensor]) -> None:
        self.steps = [[steps[k] for k in members] for steps in self.steps]
        super().keep(members, params)

    def _count(self, index: int) -> list[float]:
        """Count a step of every member on parameter `index` (all of them have state now);
        the new counts."""
        self.present[index] = [True] * self.members
        self.steps[index] = [s + 1 for s in self.steps[index]]
        return self.steps[index]


class FusedAdam(CountedOptimizer):
    """``torch.optim.Adam``'s and ``AdamW``'s single-tensor update (``capturable=False``),
    per member: Adam adds ``weight_decay * param`` to the gradient, AdamW shrinks the weights
    by ``1 - lr * weight_decay`` (each member where its weight decay is not 0, as torch)."""

    spec: Adam

    def __init__(self, spec, params, groups, state, present, keys=None):
        self.state_keys = ("step", "exp_avg", "exp_avg_sq") + (("max_exp_avg_sq",) if spec.amsgrad else ())
        super().__init__(spec, params, groups, state, present, keys)

    def step(self) -> None:
        spec = self.spec
        lr, eps, weight_decay = self.values("lr"), self.values("eps"), self.values("weight_decay")
        beta1, beta2 = self.values("beta1"), self.values("beta2")
        decays = [w != 0 for w in weight_decay]
        shrink = [1 - a * w if w != 0 else 1.0 for a, w in zip(lr, weight_decay)]
        corrections: dict[tuple[float, ...], tuple[list[float], list[float]]] = {}
        for index, param in enumerate(self.params):
            grad = param.grad
            if grad is None:
                continue
            if spec.maximize:
                grad = -grad
            state = self.state[index]
            steps = self._count(index)  # torch creates zeroed state lazily
            if spec.decoupled:
                if any(decays):
                    param.mul_(self._per_member("decay", shrink, param))
            else:
                grad = self._coupled_decay(grad, param, weight_decay)
            exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
            exp_avg.lerp_(grad, self._per_member("1-beta1", [1 - b for b in beta1], param))
            exp_avg_sq.mul_(self._per_member("beta2", beta2, param))
            exp_avg_sq.addcmul_(grad * self._per_member("1-beta2", [1 - b for b in beta2], param), grad)
            key = tuple(steps)
            if key not in corrections:
                step_size, root = [], []
                for a, b1, b2, s in zip(lr, beta1, beta2, steps):
                    step_size.append(-(a / (1 - b1**s)))
                    root.append((1 - b2**s) ** 0.5)
                corrections[key] = (step_size, root)
            step_size, root = corrections[key]
            if spec.amsgrad:
                torch.maximum(state["max_exp_avg_sq"], exp_avg_sq, out=state["max_exp_avg_sq"])
                second = state["max_exp_avg_sq"]
            else:
                second = exp_avg_sq
            denom = (second.sqrt() / self._per_step(root, param)).add_(self._per_member("eps", eps, param))
            param.addcdiv_(exp_avg * self._per_step(step_size, param), denom)
