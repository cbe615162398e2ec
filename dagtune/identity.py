"""A study's model identity: trials of equal identities (trainer, its arguments, seed,
version) share one search plan, in every process and every session.

A study records its identity when it opens (`dagtune.durable`): the trainer by its
``module.qualname`` (`trainer_name`), the seed, the version and the trainer arguments when
they survive JSON exactly (`stored_kwargs`), so that a trial's model can be rebuilt from
storage alone (`dagtune.restore`)."""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from pathlib import PurePath
from typing import Any

import numpy as np

__all__ = ["model_identity", "stored_kwargs", "trainer_name"]


def _canonical(value: Any, where: str) -> Any:
    """A JSON-able form of a trainer argument that is the same in every process."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if isinstance(value, (list, tuple)):
        return [_canonical(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, Mapping):
        return {
            str(k): _canonical(v, f"{where}[{k!r}]")
            for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))
        }
    if isinstance(value, PurePath):
        return str(value)
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray) or type(value).__name__ == "Tensor":
        array = np.asarray(value.detach().cpu() if hasattr(value, "detach") else value)
        digest = hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest()
        return {"array": digest, "shape": list(array.shape), "dtype": str(array.dtype)}
    raise ValueError(
        f"{where} = {value!r} has no stable identity across processes; pass JSON-like values "
        f"(numbers, strings, paths, lists, dicts, arrays) and build objects inside the trainer"
    )


def model_identity(
    trainer: type,
    trainer_kwargs: Mapping[str, Any],
    seed: int,
    version: str = "",
    *,
    name: str | None = None,
    torch_threads: int | None = 1,
) -> str:
    """The id of a model identity: trials of equal identities share one search plan.

    `name` stands for the trainer's ``module.qualname`` (a class a study recorded under
    another module: ``__main__`` in the script that ran it). A torch thread count other than
    the default 1 is part of it (None: whatever each worker has), since steps trained with
    another count may round differently."""
    payload: dict[str, Any] = {
        "trainer": name or trainer_name(trainer),
        "kwargs": _canonical(dict(trainer_kwargs), "trainer_kwargs"),
        "seed": seed,
        "version": version,
    }
    if torch_threads != 1:
        payload["torch_threads"] = torch_threads
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def trainer_name(trainer: type) -> str:
    """``module.qualname`` of a trainer class, as its identity records it."""
    return f"{trainer.__module__}.{trainer.__qualname__}"


def _same_json(a: Any, b: Any) -> bool:
    """`a` and `b` are equal with equal types all the way down (``1`` is not ``1.0``)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same_json(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same_json(x, y) for x, y in zip(a, b))
    return a == b


def stored_kwargs(trainer_kwargs: Mapping[str, Any]) -> dict[str, Any] | None:
    """The trainer arguments as a study records them: a plain JSON copy when JSON gives them
    back exactly (numbers, strings, bools, None, lists and dicts with string keys), else None
    (tuples, paths, arrays: whoever rebuilds the trainer passes them again, checked against
    the identity)."""
    try:
        copy = json.loads(json.dumps(dict(trainer_kwargs), allow_nan=False))
    except (TypeError, ValueError):
        return None
    return copy if _same_json(copy, dict(trainer_kwargs)) else None
