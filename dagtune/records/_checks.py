"""The checks every record parser shares: limits, step counts, study names, configs,
metrics, and `Fields`, which reads one field of a record with a check.

A failed check is a `RecordError` naming the field and the value (quoted, shortened), so a
reader can skip the line and say why. The writers use the same rules (`check_steps`,
`is_study_name`), so nothing dagtune writes is refused when read.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import math
import re
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from dagtune.config import Config, config_from_json, normalize_config
from dagtune.errors import DagtuneError
from dagtune.validation import is_int, is_number

__all__ = [
    "MAX_STEPS",
    "MAX_TRIAL_ID",
    "NODE_ID",
    "Fields",
    "RecordError",
    "check_steps",
    "is_int",
    "is_number",
    "is_study_name",
    "parse_config",
    "parse_metrics",
    "parsed_configs_shared",
    "shorten",
    "shown",
]

#: The most steps a trial may have: the largest integer every JSON reader (and a float64 step
#: axis) holds exactly. Nothing is allocated per requested step: plans, curves, results and
#: views cost memory in proportion to the points recorded, whatever a record asks for.
MAX_STEPS = 2**53
#: The largest trial id a record may carry (ids count up from 0 in each study).
MAX_TRIAL_ID = 2**31 - 1

NODE_ID = re.compile(r"^[0-9a-f]{16}$")  # `dagtune.records.node_id`
_STUDY_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_SHOWN = 80  # characters of a bad value quoted in a message


class RecordError(DagtuneError, ValueError):
    """A record or event that is not what dagtune writes (the message names field and value)."""


def is_study_name(name: Any) -> bool:
    """Whether `name` can name a study: 1-128 letters, digits, '.', '_' or '-', not starting
    with '.', '_' or '-'. Such a name is one path component that never leaves the storage
    root."""
    return isinstance(name, str) and _STUDY_NAME.match(name) is not None


def check_steps(value: Any, owner: str = "steps") -> int:
    """`value` if it is a step count a trial may have (an int from 1 to `MAX_STEPS`), else a
    ValueError naming `owner` and the value."""
    if not is_int(value) or not 1 <= value <= MAX_STEPS:
        raise RecordError(f"{owner} must be a positive int, at most {MAX_STEPS}, got {shown(value)}")
    return value


_PARSED: contextvars.ContextVar[dict[str, Config] | None] = contextvars.ContextVar(
    "parsed_configs", default=None
)


@contextlib.contextmanager
def parsed_configs_shared() -> Iterator[None]:
    """Within the block, `parse_config` parses each distinct serialized config once (a
    study's trial records and its search plan's node events carry the same configs: reading
    both parses half as many); the configs it returns are copies (their sequences shared,
    which nothing changes). What was parsed is let go when the block ends."""
    token = _PARSED.set({})
    try:
        yield
    finally:
        _PARSED.reset(token)


def parse_config(value: Any, owner: str = "config") -> Config:
    """The config serialized as `value` (`dagtune.config.config_to_json`), or `RecordError`."""
    if not isinstance(value, dict) or not value:
        raise RecordError(
            f"{owner} must be a non-empty dict of name -> serialized sequence, got {shown(value)}"
        )
    parsed = _PARSED.get()
    key = None
    if parsed is not None:
        with contextlib.suppress(TypeError, ValueError):  # not JSON-ready: parsed (and refused) below
            key = json.dumps(value, sort_keys=True, separators=(",", ":"))
        if key in parsed:
            return dict(parsed[key])
    try:
        config = normalize_config(config_from_json(value), owner=owner)
    except (ValueError, TypeError, ArithmeticError, RecursionError) as error:
        raise RecordError(f"{owner} is not a serialized config: {shorten(str(error))}") from None
    if key is not None:
        parsed[key] = config
        return dict(config)
    return config


def parse_metrics(value: Any, owner: str = "metrics", *, finite: bool = False) -> dict[str, float]:
    """`value` as metrics: a dict of metric name -> number (ints become floats). NaN and
    infinities are metrics too (a diverged step reports them) unless `finite`."""
    if not isinstance(value, dict):
        raise RecordError(f"{owner} must be a dict of metric name -> number, got {shown(value)}")
    metrics = {}
    for name, number in value.items():
        if not isinstance(name, str):
            raise RecordError(f"{owner} must name its metrics with strings, got {shown(name)}")
        if not is_number(number):
            raise RecordError(f"{owner}[{shown(name)}] must be a number, got {shown(number)}")
        try:
            number = float(number)
        except OverflowError:  # an int beyond any float
            raise RecordError(f"{owner}[{shown(name)}] is out of range, got {shown(number)}") from None
        if finite and not math.isfinite(number):
            raise RecordError(
                f"{owner}[{shown(name)}] must be finite unless the trial diverged, got {number}"
            )
        metrics[name] = number
    return metrics


def shorten(text: str, limit: int = 200) -> str:
    """`text` cut to `limit` characters (a message quotes what it was given, not all of it)."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def shown(value: Any) -> str:
    """`value` as an error message quotes it: its repr, shortened."""
    try:
        return shorten(repr(value), _SHOWN)
    except ValueError:  # it holds an int too long to write out
        return f"a {type(value).__name__} too large to show"


class Fields:
    """The fields of one record of kind `kind` (``"submit record"``, ``"node event"``), each
    read with a check; a missing or bad field is a `RecordError` naming it and its value."""

    def __init__(self, record: Mapping[str, Any], kind: str):
        self.record = record
        self.kind = kind

    def get(self, name: str, ok: Callable[[Any], bool], what: str, *, optional: bool = False) -> Any:
        if name not in self.record:
            if optional:
                return None
            raise RecordError(f"{self.kind} has no field {name!r}")
        value = self.record[name]
        if not ok(value):
            raise RecordError(f"{self.kind} field {name!r} must be {what}, got {shown(value)}")
        return value

    def integer(self, name: str, least: int, most: int, what: str) -> int:
        return self.get(name, lambda v: is_int(v) and least <= v <= most, f"{what} from {least} to {most}")

    def text(self, name: str, *, optional: bool = False, pattern: re.Pattern | None = None) -> str | None:
        what = "a string" if pattern is None else f"a string matching {pattern.pattern}"
        ok = (
            (lambda v: isinstance(v, str))
            if pattern is None
            else (lambda v: isinstance(v, str) and pattern.match(v))
        )
        return self.get(name, ok, what, optional=optional)

    def node(self, name: str) -> str:
        return self.get(name, lambda v: isinstance(v, str) and NODE_ID.match(v), "a node id (16 hex digits)")

    def step(self, name: str = "step", least: int = 1) -> int:
        return self.integer(name, least, MAX_STEPS, "a step")

    def trial(self) -> int:
        return self.integer("trial", 0, MAX_TRIAL_ID, "a trial id")

    def config(self, name: str = "config") -> Config:
        if name not in self.record:
            raise RecordError(f"{self.kind} has no field {name!r}")
        return parse_config(self.record[name], f"{self.kind} field {name!r}")

    def metrics(self, name: str = "metrics", *, finite: bool = False) -> dict[str, float]:
        if name not in self.record:
            raise RecordError(f"{self.kind} has no field {name!r}")
        return parse_metrics(self.record[name], f"{self.kind} field {name!r}", finite=finite)
