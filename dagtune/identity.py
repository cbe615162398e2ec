"""A study's model identity: trials of equal identities (trainer, its arguments, seed,
version) share one search plan, in every process and every session.

A study records its identity when it opens (`dagtune.durable`): the trainer by its
``module.qualname`` (`trainer_name`), the seed, the version and the trainer arguments when
they survive JSON exactly (`stored_kwargs`), so that a trial's model can be rebuilt from
storage alone (`dagtune.restore`).

A class defined in the script that runs as ``__main__`` is named by the module ``import``
gives that file (`main_module_name`), so one trainer has one identity however its script is
started: ``python after_study.py``, ``dagtune run after_study.py`` and ``from after_study
import DigitsMLP`` all name it ``after_study.DigitsMLP``. dagtune before that named it
``__main__.DigitsMLP`` (its `legacy_name`); a study recorded so still opens from the script
run the same way (`ModelNames`). Where no file gives ``__main__`` a module (an interactive
session, a notebook, ``python -c``), a class of it is still ``__main__.Qualname``."""

from __future__ import annotations

import hashlib
import json
import math
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import PurePath
from typing import Any

import numpy as np

__all__ = [
    "ModelNames",
    "legacy_name",
    "main_module_name",
    "model_identity",
    "model_names",
    "stored_kwargs",
    "trainer_name",
]


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
    another module than it has here: its `legacy_name`, or a script's class a restorer
    imported). A torch thread count other than the default 1 is part of it (None: whatever
    each worker has), since steps trained with another count may round differently."""
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


def main_module_name() -> str | None:
    """The name ``import`` gives the module running as ``__main__``: the dotted name it was
    run by (``python -m pkg.mod``: ``pkg.mod``), else its file's stem (``python
    path/to/after_study.py``: ``after_study``, the name ``dagtune run`` imports it by too);
    None where no ``.py`` file gives it one (an interactive session, a Jupyter notebook,
    ``python -c``, a directory or zip run as a script)."""
    main = sys.modules.get("__main__")
    name = getattr(getattr(main, "__spec__", None), "name", None)
    if isinstance(name, str) and name and name != "__main__":
        return name
    path = getattr(main, "__file__", None)
    if not isinstance(path, str):
        return None
    stem, extension = os.path.splitext(os.path.basename(path))
    return stem if extension == ".py" and stem and stem != "__main__" else None


def trainer_name(trainer: type) -> str:
    """``module.qualname`` of a trainer class, as its identity records it: a class of the
    ``__main__`` script under the module name its file has (`main_module_name`)."""
    module = trainer.__module__
    if module == "__main__":
        module = main_module_name() or module
    return f"{module}.{trainer.__qualname__}"


def legacy_name(trainer: type) -> str | None:
    """``__main__.Qualname`` for a class of a ``__main__`` script run from its file: the name
    dagtune recorded for it before naming it by the file (`trainer_name`); None for any
    other class (its name never changed)."""
    if trainer.__module__ != "__main__" or main_module_name() is None:
        return None
    return f"__main__.{trainer.__qualname__}"


@dataclass(frozen=True)
class ModelNames:
    """A model's trainer name and the identities it would have under others, for a study
    that opens storage (`dagtune.durable.Persistence`): `name` is what it records now
    (`trainer_name`, ending in the class's `qualname`), `legacy` the name a study of this
    model recorded before, if there is one (`legacy_name`: a study recorded under it
    reopens), and `identity_as(name)` the model's identity were its trainer named `name`
    (how a refusal tells a study whose only difference is the trainer's module)."""

    name: str
    qualname: str
    legacy: str | None
    identity_as: Callable[[str], str]

    @property
    def identity(self) -> str:
        """The model's identity under its `name`."""
        return self.identity_as(self.name)


def model_names(
    trainer: type,
    trainer_kwargs: Mapping[str, Any],
    seed: int,
    version: str = "",
    *,
    torch_threads: int | None = 1,
) -> ModelNames:
    """The `ModelNames` of the model `model_identity` takes the same arguments for."""
    kwargs = dict(trainer_kwargs)

    def identity_as(name: str) -> str:
        return model_identity(trainer, kwargs, seed, version, name=name, torch_threads=torch_threads)

    return ModelNames(trainer_name(trainer), trainer.__qualname__, legacy_name(trainer), identity_as)


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
