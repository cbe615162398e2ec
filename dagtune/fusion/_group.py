"""`FusedGroup`: K trials of one `FusibleTrainer` trained as one stacked model.

The members' weights are stacked along a leading dimension and the user's loss runs once
for all of them under ``torch.func.vmap`` over ``functional_call`` with
``randomness="same"``: the members draw the same random numbers (dropout masks) from the
global generator, the very numbers each would draw trained alone from the same RNG state,
and the draws advance the generator exactly as one unfused step does. One backward pass
over the sum of the members' losses gives each member its own gradients (the sum's
derivative with respect to each loss is 1, so a member whose loss is NaN or infinite does not
touch the others' gradients), and a `FusedOptimizer` updates every member as its unfused
``torch.optim`` optimizer would.

Operations whose batched form would make a member depend on its group (convolutions,
normalizations, matrix products, recurrent layers) or draw its random numbers elsewhere
(dropout) run one member at a time (`dagtune.fusion._memberwise`). A buffer the module
re-assigns in its forward (``self.mean = 0.9 * self.mean + ...``) is carried through: each
member's new value is returned from the vmapped function and replaces its slice of the
stacked buffer, as the unfused module keeps the new tensor.

With ``fused_kernels="grouped"`` a model that is an ``nn.Sequential`` of standard layers is
called below vmap for all members at once (`dagtune.fusion._horizontal`, HFTA-style: the
members' channels side by side); only the rest of the loss runs under vmap.

Each batch is fetched once (`FusibleTrainer.batch`) and shared; the data order and every
non-fusible hyper-parameter live in one host trainer. Evaluation copies one member's weights
into the host's module and runs the user's ``evaluate_model`` on it, exactly as unfused.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch.func import functional_call, vmap

from dagtune.fusion._before_step import has_before_step, run_before_step
from dagtune.fusion._errors import FusionError
from dagtune.fusion._horizontal import horizontal_call
from dagtune.fusion._memberwise import MemberwiseLayers
from dagtune.fusion._state import split, stack
from dagtune.fusion._trace import ModuleTrace, describe_module
from dagtune.fusion._trainer import FusibleTrainer, check_fusible_value, mean_loss
from dagtune.sequences import same_value

__all__ = [
    "REPLACED_METHODS",
    "FusedGroup",
    "FusionError",
    "MemberModel",
    "check_dense_gradients",
    "check_not_replaced",
]

#: the `FusibleTrainer` methods a fused group never calls: it trains its members with a step
#: of its own (one vmapped loss, one backward, the fused optimizer), so an override of these
#: would be left out fused
REPLACED_METHODS = ("train", "train_batch")


def check_dense_gradients(model: torch.nn.Module) -> None:
    """Raise a FusionError naming the first embedding of `model` with ``sparse=True``: a fused
    group stacks its members' gradients, which sparse gradients cannot be (the backward pass
    fails, in no module the check could name)."""
    for name, module in model.named_modules():
        if isinstance(module, (torch.nn.Embedding, torch.nn.EmbeddingBag)) and module.sparse:
            raise FusionError(
                f"{describe_module(model, name)} has sparse=True: a fused group stacks its members' "
                f"gradients, which sparse gradients cannot be; give it sparse=False to train fused"
            )


def check_not_replaced(cls: type[FusibleTrainer]) -> None:
    """Raise a FusionError naming the first of `REPLACED_METHODS` that `cls` overrides: fused,
    the override would be silently skipped (gradient clipping in ``train_batch``, say, would
    clip unfused only; a norm over a fused group's stacked gradients would mix its trials')."""
    for name in REPLACED_METHODS:
        if getattr(cls, name) is not getattr(FusibleTrainer, name):
            owner = next(klass for klass in cls.__mro__ if name in vars(klass))
            raise FusionError(
                f"{cls.__qualname__} overrides FusibleTrainer.{name}() (in {owner.__qualname__}), which a "
                f"fused group never calls (it trains its members with one fused step of its own): what "
                f"the override does would be left out, so its trials cannot train fused (to clip "
                f"gradients, override before_step(model) instead: a fused group calls it per member)"
            )


class MemberModel:
    """One member's model inside a fused step: calls the module with that member's weights and
    buffers (`tensors`, name -> tensor). A buffer the module re-assigns during the call is
    written back into `tensors` (torch's ``functional_call`` does so for the dict it is
    given), so a later call in the same loss sees the new value, as the unfused module does.
    With `horizontal` (``fused_kernels="grouped"``), a model of standard layers runs for all
    members at once without vmap (`dagtune.fusion._horizontal`)."""

    __slots__ = ("horizontal", "module", "tensors")

    def __init__(self, module: torch.nn.Module, tensors: dict[str, torch.Tensor], horizontal: bool = False):
        self.module = module
        self.tensors = tensors
        self.horizontal = horizontal

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.horizontal:
            output = horizontal_call(self.module, self.tensors, args, kwargs)
            if output is not None:
                return output
        return functional_call(self.module, self.tensors, args, kwargs)


class FusedGroup:
    """K members of `host`'s trainer class, trained in lock step from `fused_state` (the
    format of `dagtune.fusion.stack`).

    `host` is a trainer of the members' class built with their trainer arguments and seed: its
    data order is the group's, its module is the template every member's weights plug into,
    and its non-fusible hyper-parameters are the group's.
    """

    def __init__(self, host: FusibleTrainer, fused_state: Mapping[str, Any]):
        if not isinstance(host, FusibleTrainer):
            raise TypeError(f"a fused group needs a FusibleTrainer host, got {type(host).__qualname__}")
        check_not_replaced(type(host))
        check_dense_gradients(host.model)
        self.host = host
        self.members = int(fused_state["members"])
        model = host.model
        keyed = model.state_dict(keep_vars=True)
        self._metadata = getattr(keyed, "_metadata", None)
        if list(fused_state["model"]) != list(keyed):
            raise FusionError(
                f"the fused state's model entries {list(fused_state['model'])} are not "
                f"{type(host).__qualname__}'s {list(keyed)}"
            )
        first_key: dict[int, str] = {}
        self._canonical = {key: first_key.setdefault(id(tensor), key) for key, tensor in keyed.items()}
        parameter_ids = {id(p) for p in model.parameters()}
        self.params: dict[str, torch.Tensor] = {}
        self.buffers: dict[str, torch.Tensor] = {}
        for key, canonical in self._canonical.items():
            if key != canonical:
                continue
            target = keyed[key]
            stacked = fused_state["model"][key]
            if tuple(stacked.shape) != (self.members, *target.shape):
                raise FusionError(
                    f"model entry {key!r} is {tuple(stacked.shape)} in the fused state, "
                    f"expected {(self.members, *target.shape)}"
                )
            stacked = stacked.detach().to(device=target.device, dtype=target.dtype).clone()
            if id(target) in parameter_ids:
                self.params[key] = stacked.requires_grad_(True)
            else:
                self.buffers[key] = stacked
        #: the module's own parameters: whether each trains (``requires_grad``) is read from
        #: them at every batch, as the unfused optimizer skips a frozen one (no gradient)
        self._module_params = {key: keyed[key] for key in self.params}
        names = {id(tensor): key for key, tensor in keyed.items() if self._canonical[key] == key}
        self._order = [names[id(p)] for p in model.parameters()]  # the optimizer's parameter indices
        optimizer = fused_state["optimizer"]
        self.optimizer = host.optimizer_spec.fused(
            [self.params[name] for name in self._order],
            [groups[0] for groups in optimizer["param_groups"]],
            optimizer["state"],
            optimizer["present"],
            optimizer.get("keys"),
        )
        if self.optimizer.members != self.members:
            raise FusionError(
                f"the fused state has {self.members} members but {self.optimizer.members} optimizers"
            )
        host.batches.load_state_dict(fused_state["batches"])

    @classmethod
    def from_states(cls, host: FusibleTrainer, states: Sequence[Mapping[str, Any]]) -> FusedGroup:
        """A group of the unfused trainer states `states` (member k is ``states[k]``)."""
        return cls(host, stack(states))

    # ------------------------------------------------------------------ hyper-parameters

    def setup(self, changes: Sequence[Mapping[str, Any]]) -> None:
        """Apply each member's changed hyper-parameter values (``changes[k]`` for member k):
        fusible ones per member, the others once on the host. Those others must be the same
        for every member; a FusionError says which differ."""
        if len(changes) != self.members:
            raise ValueError(f"setup() needs the changes of {self.members} members, got {len(changes)}")
        fusible = self.host.fusible
        shared: dict[str, Any] | None = None
        for member, values in enumerate(changes):
            rest = {}
            for name, value in values.items():
                if name in fusible:
                    check_fusible_value(name, value)
                    self.optimizer.set(member, fusible[name], value)
                else:
                    rest[name] = value
            if shared is None:
                shared = rest
            elif rest.keys() != shared.keys() or not all(same_value(rest[n], shared[n]) for n in rest):
                raise FusionError(
                    f"members 0 and {member} change non-fusible hyper-parameters differently: "
                    f"{shared} != {rest} (only {sorted(fusible)} may differ)"
                )
        if shared:
            self.host.setup(shared)

    # ------------------------------------------------------------------ training

    def _losses(self, batch: Any, trace: ModuleTrace | None = None) -> torch.Tensor:
        """Each member's loss on `batch` (a graph to the stacked parameters), after taking up
        the buffers the forward re-assigned; `trace` records the layers' outputs (stacked)."""
        host, module = self.host, self.host.model
        horizontal = host.fused_kernels == "grouped" and trace is None

        def member_loss(params: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor]) -> tuple:
            tensors = {**params, **buffers}
            loss = mean_loss(host.loss(MemberModel(module, tensors, horizontal), batch))
            reassigned = {key: tensors[key] for key in buffers if tensors[key] is not buffers[key]}
            return loss, reassigned, trace.outputs if trace is not None else []

        with MemberwiseLayers(host.fused_kernels):
            losses, reassigned, outputs = vmap(member_loss, randomness="same")(self.params, self.buffers)
        for key, value in reassigned.items():
            self._take_buffer(key, value)
        if trace is not None:
            trace.take(outputs)
        return losses

    def _take_buffer(self, key: str, value: torch.Tensor) -> None:
        """The members' new values of buffer `key`, which the forward re-assigned."""
        old = self.buffers[key]
        if value.shape != old.shape or value.dtype != old.dtype:
            raise FusionError(
                f"{type(self.host).__qualname__}'s forward re-assigns buffer {key!r} with another "
                f"shape or dtype ({tuple(old.shape[1:])} {old.dtype} -> {tuple(value.shape[1:])} "
                f"{value.dtype}); a fused group cannot carry that through: keep its shape and dtype"
            )
        self.buffers[key] = value.detach().clone(memory_format=torch.contiguous_format)

    def train_batch(self, indices: np.ndarray, trace: ModuleTrace | None = None) -> list[float]:
        """One optimizer update of every member on the batch of sample `indices`; returns
        each member's loss (`trace`: record what each layer computed)."""
        batch = self.host.batch(indices)
        for key, param in self.params.items():
            param.grad = None
            param.requires_grad_(self._module_params[key].requires_grad)  # frozen: no gradient, no update
        losses = self._losses(batch, trace)
        losses.sum().backward()
        if has_before_step(type(self.host)):  # each member's own gradients (clipping: its own norm)
            run_before_step(self.host, self.params, self.buffers, self.optimizer.groups)
        with torch.no_grad():
            self.optimizer.step()
        return losses.detach().tolist()

    def train(self) -> list[dict[str, float]]:
        """One step of every member (the host's `step_batches`); each member's metrics, as
        `FusibleTrainer.train` reports them."""
        self.host.model.train()
        totals = [0.0] * self.members
        count = 0
        for indices in self.host.step_batches():
            losses = self.train_batch(indices)
            totals = [total + loss * len(indices) for total, loss in zip(totals, losses)]
            count += len(indices)
        return [{"loss": total / count} for total in totals]

    def select(self, member: int) -> None:
        """Copy member `member`'s weights and buffers into the host's module (the host then
        is that member, for evaluation or a check of its training state). The module's
        tensors are looked up again: an evaluation may have re-assigned a buffer."""
        current = self.host.model.state_dict(keep_vars=True)
        with torch.no_grad():
            for key in (*self.params, *self.buffers):
                stacked = self.params[key] if key in self.params else self.buffers[key]
                current[key].copy_(stacked[member])

    def evaluate(self, member: int) -> dict[str, float]:
        """Member `member`'s validation metrics (its weights copied into the host's module)."""
        self.select(member)
        return self.host.evaluate()

    # ------------------------------------------------------------------ state

    def fused_state_dict(self) -> dict[str, Any]:
        """The group's fused state (tensors shared with the group: copy before changing)."""
        detached = {key: tensor.detach() for key, tensor in (self.params | self.buffers).items()}
        model: OrderedDict[str, torch.Tensor] = OrderedDict(
            (key, detached[canonical]) for key, canonical in self._canonical.items()
        )
        if self._metadata is not None:
            model._metadata = self._metadata  # type: ignore[attr-defined]
        return {
            "members": self.members,
            "model": model,
            "optimizer": self.optimizer.fused_state_dict(),
            "batches": self.host.batches.state_dict(),
        }

    def state_dict(self, member: int) -> dict[str, Any]:
        """Member `member`'s state in the unfused `FusibleTrainer.state_dict` format."""
        return split(self.fused_state_dict(), member)

    def keep(self, members: Sequence[int]) -> None:
        """Keep only `members` (indices into the current group, in the order given): the
        others leave the group."""
        members = list(members)
        if (
            not members
            or len(set(members)) != len(members)
            or not all(0 <= k < self.members for k in members)
        ):
            raise ValueError(f"keep() needs distinct members in [0, {self.members}), got {members}")
        index = torch.tensor(members, dtype=torch.long)
        self.params = {
            key: param.detach().index_select(0, index.to(param.device)).requires_grad_(True)
            for key, param in self.params.items()
        }
        self.buffers = {
            key: buffer.index_select(0, index.to(buffer.device)) for key, buffer in self.buffers.items()
        }
        self.optimizer.keep(members, [self.params[name] for name in self._order])
        self.members = len(members)
