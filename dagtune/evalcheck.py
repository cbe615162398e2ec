"""Checking that `Trainer.evaluate` leaves the training state alone.

dagtune evaluates where metrics are needed (every `eval_every` steps, at checkpoints, at the
end of a stage), which is not where `run_alone` or another study evaluates; and a trainer
resumed from a checkpoint is built afresh. So an ``evaluate`` that changes the training
state (batch-norm statistics updated by evaluating in training mode, an optimizer step, a
data position moved, a private generator drawn from) makes results depend on where
evaluations happened: silently different from training alone. What dagtune can put back it
puts back after every evaluation, so it needs no check: the global random generators
(`isolated_rng`) and every module's training mode (`kept_training_modes`: PyTorch's examples
leave the model in eval mode after evaluating). What it cannot put back is what
``state_dict()`` holds.

A worker therefore compares the state before and after its first evaluations of each model
(`EvaluateChecks`): a digest of every leaf of ``state_dict()``. A difference raises
`EvaluateChangedStateError`, naming what changed, which fails the trial. Checks stop after
the first clean ones, so a correct trainer pays for a few digests per worker and nothing
after.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from dagtune.errors import TrainerCheckError
from dagtune.trainer import Trainer

__all__ = ["EvaluateChangedStateError", "EvaluateChecks", "state_digests", "training_state"]

_SHOWN = 6  # changed keys named in the message; the rest are counted


class EvaluateChangedStateError(TrainerCheckError, RuntimeError):
    """`Trainer.evaluate` changed the training state; `keys` names what changed."""

    def __init__(self, keys: list[str], checks: int):
        self.keys = keys
        shown = ", ".join(keys[:_SHOWN]) + (f" and {len(keys) - _SHOWN} more" if len(keys) > _SHOWN else "")
        super().__init__(
            f"evaluate() changed the training state: {shown}. Trainer.evaluate must leave what "
            "state_dict() holds as it found it (no optimizer step, no batch-norm statistics "
            "updated in training mode, data position and private generators untouched), or "
            "results depend on where dagtune evaluates. (dagtune itself puts back the global "
            "random generators and every module's training mode. The first "
            f"{checks} evaluations of each worker are checked; check_evaluate=0 turns the check off.)"
        )


def training_state(trainer: Trainer) -> dict[str, str]:
    """What `evaluate` must leave unchanged, as a digest per key: every leaf of
    ``trainer.state_dict()`` (``state_dict()['model']['0.weight']``)."""
    return state_digests(trainer.state_dict())


def state_digests(state: Any, root: str = "state_dict()") -> dict[str, str]:
    """A digest of every leaf of `state` (nested dicts, lists and tuples of tensors, arrays
    and plain values), keyed by its path from `root`: ``state_dict()['model']['0.weight']``."""
    digests: dict[str, str] = {}
    _leaves(state, root, digests)
    return digests


def _leaves(value: Any, path: str, out: dict[str, str]) -> None:
    if isinstance(value, Mapping):
        for key, item in value.items():
            _leaves(item, f"{path}[{key!r}]", out)
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            _leaves(item, f"{path}[{index}]", out)
    elif isinstance(value, torch.Tensor):
        out[path] = _tensor_digest(value)
    elif isinstance(value, np.ndarray) and value.dtype != object:
        data = np.ascontiguousarray(value).reshape(-1).view(np.uint8)
        out[path] = f"{value.dtype}{value.shape}:{hashlib.sha256(data).hexdigest()}"
    else:
        out[path] = repr(value)


def _tensor_digest(tensor: torch.Tensor) -> str:
    tensor = tensor.detach()
    if tensor.layout != torch.strided:
        tensor = tensor.to_dense()
    data = tensor.cpu().contiguous().reshape(-1).view(torch.uint8).numpy()
    return f"{tensor.dtype}{tuple(tensor.shape)}:{hashlib.sha256(data).hexdigest()}"


class EvaluateChecks:
    """One worker's record of the evaluations it checked and found clean, per model identity:
    it checks until `limit` of them were clean (a failed check counts nothing, so a retried
    stage is checked again)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._clean: dict[str, int] = {}

    def due(self, identity: str, limit: int) -> bool:
        """Whether the next evaluation of `identity` on this worker is to be checked."""
        with self._lock:
            return self._clean.get(identity, 0) < limit

    def verify(self, identity: str, limit: int, before: dict[str, str], after: dict[str, str]) -> None:
        """Raise `EvaluateChangedStateError` if the training state changed, else count a clean check."""
        keys = dict.fromkeys([*before, *after])  # in state_dict order, new keys last
        changed = [key for key in keys if before.get(key) != after.get(key)]
        if changed:
            raise EvaluateChangedStateError(changed, limit)
        with self._lock:
            self._clean[identity] = self._clean.get(identity, 0) + 1
