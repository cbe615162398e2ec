"""Configs: a mapping from hyper-parameter name to sequence, in a canonical form.

A config is a plain ``dict[str, Sequence]`` with its names sorted; plain values given by the
user become `Constant`. This module compares configs step by step (the first step where any
hyper-parameter differs) and gives them a canonical JSON text used for hashing and storage.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from dagtune.distributions import Distribution, contains_distribution
from dagtune.sequences import Scalar, Sequence, as_sequence, first_difference

__all__ = [
    "Config",
    "check_config_finite",
    "config_dumps",
    "config_first_difference",
    "config_from_json",
    "config_to_json",
    "config_values",
    "normalize_config",
]

Config = dict[str, Sequence]

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-]*$")


def normalize_config(config: Mapping[str, Any], owner: str = "config") -> Config:
    """A canonical config: names checked and sorted, plain values wrapped in `Constant`.

    Raises ValueError naming the offending hyper-parameter for bad names, distributions left
    unsampled, and values that are not JSON scalars or sequences.
    """
    if not isinstance(config, Mapping):
        raise ValueError(f"{owner} must be a dict of hyper-parameter name -> sequence, got {config!r}")
    if not config:
        raise ValueError(f"{owner} must name at least one hyper-parameter, got {{}}")
    normalized = {}
    for name in sorted(config):
        if not isinstance(name, str) or not _NAME.match(name):
            raise ValueError(
                f"{owner}: hyper-parameter names must be identifiers "
                f"(letters, digits, '_', '.', '-'), got {name!r}"
            )
        value = config[name]
        if isinstance(value, Distribution) or contains_distribution(value):
            raise ValueError(
                f"{owner}[{name!r}] holds a distribution ({value!r}); sample it with dt.Random first"
            )
        if isinstance(value, (list, tuple, dict)):
            raise ValueError(
                f"{owner}[{name!r}] must be a sequence or a JSON scalar, got {value!r}: a value is a "
                "number, string, bool or None, or a dagtune sequence of them (dt.Steps, dt.Cosine, ...); "
                f"give each part of a {type(value).__name__} its own hyper-parameter ({name}_0, "
                f"{name}_1, ...) or a string that setup() parses"
            )
        normalized[name] = as_sequence(value, owner, name)
    return normalized


def check_config_finite(config: Config, steps: int) -> None:
    """Raise a ValueError naming the hyper-parameter, the sequence and the step if a value of
    `config` before `steps` is not finite (it overflows, or is infinite or NaN)."""
    for name, sequence in config.items():
        try:
            sequence.check_finite(steps)
        except ValueError as error:
            raise ValueError(f"config[{name!r}]: {error}") from None


def config_values(config: Config, step: int) -> dict[str, Scalar]:
    """Every hyper-parameter's value at `step`."""
    return {name: sequence(step) for name, sequence in config.items()}


def config_first_difference(a: Config, b: Config, lo: int, hi: int) -> int:
    """The first step in ``[lo, hi)`` where any hyper-parameter differs, or `hi`.

    Configs with different names differ everywhere.
    """
    if a is b or lo >= hi:
        return hi
    if a.keys() != b.keys():
        return lo
    first = hi
    for name, sequence in a.items():
        first = first_difference(sequence, b[name], lo, first)
        if first == lo:
            break
    return first


def value_key(config: Config, step: int) -> tuple:
    """A hashable key of the values at `step` (type-aware), for finding a matching branch:
    name, type and value of each in one flat tuple (the search plan keeps one per root)."""
    items: list = []
    for name, sequence in config.items():  # one pass, no dict of the values in between
        value = sequence(step)
        items += (name, type(value).__name__, value)
    return tuple(items)


def config_to_json(config: Config) -> dict:
    return {name: sequence.to_json() for name, sequence in config.items()}


def config_from_json(data: Mapping[str, Any]) -> Config:
    return {name: Sequence.from_json(data[name]) for name in sorted(data)}


def config_dumps(config: Config, as_json: dict | None = None) -> str:
    """Canonical JSON text of a config (sorted keys, no spaces): equal texts, equal configs.
    `as_json` is its `config_to_json`, when the caller made it already (not made twice)."""
    data = config_to_json(config) if as_json is None else as_json
    return json.dumps(data, sort_keys=True, separators=(",", ":"))
