"""Trial records and search plan events as read back from storage, checked field by field.

A journal line's checksum (`dagtune.plan.Journal`) catches accidents: a flipped bit, a write
cut short. It says nothing about a line with a valid checksum and values dagtune never
writes, put there by another program, by hand, or by anyone with write access to the
storage. Such a line must neither take down what reads it (a resumed study, ``dagtune
status``, ``dagtune tree``, the page served from storage) nor be guessed at. So every reader
goes through one parser per kind of line:

- `parse_trial_record` for the lines of a study's records journal (``open``, ``submit``,
  ``extend``, ``end``, ``work``), folded into trials by `read_study_records`, which adds
  the checks that span records (an ``end`` for a trial never submitted, an ``extend`` that
  does not extend, ...);
- `parse_plan_event` for the lines of a search plan journal (``node``, ``checkpoint``,
  ``drop_checkpoint``, ``metrics``).

Each returns the record as a checked value or raises `RecordError` naming the field and the
value; a reader skips that line and reports it as ``file:line``, as it does a bad checksum.
The writers use the same rules (`check_steps`), so nothing dagtune writes is refused when read.

What is checked, for every field a reader uses: its type (a step count is an int, not a
bool or a float), its range (steps from 1 to `MAX_STEPS`, trial ids from 0 to
`MAX_TRIAL_ID`, byte counts >= 0), its form (ids and digests are lowercase hex of their
length, statuses are the known ones, configs parse into sequences with valid names and are
finite over the trial's steps, metrics map names to numbers, finite unless the trial
diverged) and that a node's id is the hash of its content. Fields a reader does not use
(and fields a newer dagtune may add) are ignored. Tags may be any JSON value.

What is not checked: that a record is true. A well-formed line can claim metrics no
training produced or a checkpoint of any size; the checks make every line safe to read,
they do not authenticate it (checkpoints themselves are verified against their commit
marker and loaded with ``weights_only=True``).

This module uses only the value layer (configs and sequences): every layer above it reads
storage through it.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from dagtune.config import (
    Config,
    check_config_finite,
    config_dumps,
    config_from_json,
    config_to_json,
    normalize_config,
)

__all__ = [
    "COMPLETED",
    "DIVERGED",
    "FAILED",
    "MAX_STEPS",
    "MAX_TRIAL_ID",
    "PENDING",
    "STATUSES",
    "STOPPED",
    "Ended",
    "Extended",
    "Opened",
    "PlanEvent",
    "RecordError",
    "StudyRecords",
    "Submitted",
    "TrialState",
    "Worked",
    "check_steps",
    "is_study_name",
    "node_id",
    "parse_config",
    "parse_metrics",
    "parse_plan_event",
    "parse_trial_record",
    "read_study_records",
]

PENDING, COMPLETED, STOPPED, FAILED, DIVERGED = "pending", "completed", "stopped", "failed", "diverged"
STATUSES = (PENDING, COMPLETED, STOPPED, FAILED, DIVERGED)

#: The most steps a trial may have: the largest integer every JSON reader (and a float64 step
#: axis) holds exactly. Nothing is allocated per requested step: plans, curves, results and
#: views cost memory in proportion to the points recorded, whatever a record asks for.
MAX_STEPS = 2**53
#: The largest trial id a record may carry (ids count up from 0 in each study).
MAX_TRIAL_ID = 2**31 - 1

_NODE = re.compile(r"^[0-9a-f]{16}$")  # `node_id`
_IDENTITY = re.compile(r"^[0-9a-f]{16}$")  # `dagtune.study.model_identity`
_SESSION = re.compile(r"^[0-9a-f]{32}$")  # a journal writer (uuid4 hex)
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_STUDY_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_SHOWN = 80  # characters of a bad value quoted in a message


class RecordError(ValueError):
    """A record or event that is not what dagtune writes (the message names field and value)."""


def is_study_name(name: Any) -> bool:
    """Whether `name` can name a study: 1-128 letters, digits, '.', '_' or '-', not starting
    with '.', '_' or '-'. Such a name is one path component that never leaves the storage
    root."""
    return isinstance(name, str) and _STUDY_NAME.match(name) is not None


def node_id(parent: str | None, start: int, config: Config, salt: str = "") -> str:
    """The id of a search plan node: a hash of its content (parent, branch step, config and,
    for a trial-based run's private path, its salt), so that every writer agrees on it."""
    text = f"{parent or ''}|{start}|{config_dumps(config)}|{salt}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def check_steps(value: Any, owner: str = "steps") -> int:
    """`value` if it is a step count a trial may have (an int from 1 to `MAX_STEPS`), else a
    ValueError naming `owner` and the value."""
    if not _is_int(value) or not 1 <= value <= MAX_STEPS:
        raise RecordError(f"{owner} must be a positive int, at most {MAX_STEPS}, got {_shown(value)}")
    return value


def parse_config(value: Any, owner: str = "config") -> Config:
    """The config serialized as `value` (`dagtune.config.config_to_json`), or `RecordError`."""
    if not isinstance(value, dict) or not value:
        raise RecordError(
            f"{owner} must be a non-empty dict of name -> serialized sequence, got {_shown(value)}"
        )
    try:
        return normalize_config(config_from_json(value), owner=owner)
    except (ValueError, TypeError, ArithmeticError, RecursionError) as error:
        raise RecordError(f"{owner} is not a serialized config: {_shorten(str(error))}") from None


def parse_metrics(value: Any, owner: str = "metrics", *, finite: bool = False) -> dict[str, float]:
    """`value` as metrics: a dict of metric name -> number (ints become floats). NaN and
    infinities are metrics too (a diverged step reports them) unless `finite`."""
    if not isinstance(value, dict):
        raise RecordError(f"{owner} must be a dict of metric name -> number, got {_shown(value)}")
    metrics = {}
    for name, number in value.items():
        if not isinstance(name, str):
            raise RecordError(f"{owner} must name its metrics with strings, got {_shown(name)}")
        if not _is_number(number):
            raise RecordError(f"{owner}[{_shown(name)}] must be a number, got {_shown(number)}")
        try:
            number = float(number)
        except OverflowError:  # an int beyond any float
            raise RecordError(f"{owner}[{_shown(name)}] is out of range, got {_shown(number)}") from None
        if finite and not math.isfinite(number):
            raise RecordError(
                f"{owner}[{_shown(name)}] must be finite unless the trial diverged, got {number}"
            )
        metrics[name] = number
    return metrics


# --------------------------------------------------------------------------- fields


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _shorten(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _shown(value: Any) -> str:
    try:
        return _shorten(repr(value), _SHOWN)
    except ValueError:  # it holds an int too long to write out
        return f"a {type(value).__name__} too large to show"


class _Fields:
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
            raise RecordError(f"{self.kind} field {name!r} must be {what}, got {_shown(value)}")
        return value

    def integer(self, name: str, least: int, most: int, what: str) -> int:
        return self.get(name, lambda v: _is_int(v) and least <= v <= most, f"{what} from {least} to {most}")

    def text(self, name: str, *, optional: bool = False, pattern: re.Pattern | None = None) -> str | None:
        what = "a string" if pattern is None else f"a string matching {pattern.pattern}"
        ok = (
            (lambda v: isinstance(v, str))
            if pattern is None
            else (lambda v: isinstance(v, str) and pattern.match(v))
        )
        return self.get(name, ok, what, optional=optional)

    def node(self, name: str) -> str:
        return self.get(name, lambda v: isinstance(v, str) and _NODE.match(v), "a node id (16 hex digits)")

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


# --------------------------------------------------------------------------- trial records


@dataclass(frozen=True)
class Opened:
    """A session of the study began (``open``): the model identity it belongs to."""

    identity: str
    trainer: str | None
    seed: int | None
    version: str | None


@dataclass(frozen=True)
class Submitted:
    """A trial was submitted (``submit``)."""

    trial: int
    config: Config
    steps: int
    tag: Any
    salt: str


@dataclass(frozen=True)
class Extended:
    """A trial was given more steps (``extend``)."""

    trial: int
    steps: int


@dataclass(frozen=True)
class Ended:
    """A trial finished (``end``) with `status` after `reached` steps."""

    trial: int
    status: str
    reached: int
    metrics: dict[str, float] | None
    error: str | None


@dataclass(frozen=True)
class Worked:
    """What one session had trained so far (``work``): its latest record counts."""

    session: str
    executed_steps: int
    gpu_seconds: float


TrialRecord = Opened | Submitted | Extended | Ended | Worked


def parse_trial_record(record: Mapping[str, Any]) -> TrialRecord:
    """One line of a study's records journal, checked (`RecordError` says what is wrong)."""
    kind = record.get("r")
    parse = _TRIAL_RECORDS.get(kind) if isinstance(kind, str) else None
    if parse is None:
        raise RecordError(f"unknown trial record kind 'r' = {_shown(kind)}")
    return parse(_Fields(record, f"{kind} record"))


def _opened(fields: _Fields) -> Opened:
    return Opened(
        identity=fields.text("identity", pattern=_IDENTITY),
        trainer=fields.text("trainer", optional=True),
        seed=fields.get("seed", _is_int, "an int", optional=True),
        version=fields.text("version", optional=True),
    )


def _submitted(fields: _Fields) -> Submitted:
    trial, steps, config = fields.trial(), fields.step("steps"), fields.config()
    try:
        check_config_finite(config, steps)
    except ValueError as error:
        raise RecordError(
            f"{fields.kind} field 'config' is not finite over its {steps} steps: {error}"
        ) from None
    return Submitted(trial, config, steps, fields.record.get("tag"), fields.text("salt", optional=True) or "")


def _extended(fields: _Fields) -> Extended:
    return Extended(fields.trial(), fields.step("steps"))


def _ended(fields: _Fields) -> Ended:
    ends = STATUSES[1:]
    status = fields.get("status", lambda v: v in ends, f"one of {', '.join(ends)}")
    metrics = None
    if fields.record.get("metrics") is not None or status in (COMPLETED, DIVERGED):  # these have results
        metrics = fields.metrics(finite=status != DIVERGED)
    return Ended(
        trial=fields.trial(),
        status=status,
        reached=fields.step("steps", least=0),
        metrics=metrics,
        error=fields.get(
            "error", lambda v: v is None or isinstance(v, str), "a string or null", optional=True
        ),
    )


def _worked(fields: _Fields) -> Worked:
    seconds = fields.get(
        "gpu_seconds", lambda v: _is_number(v) and 0 <= v < math.inf, "a finite number of seconds >= 0"
    )
    return Worked(
        session=fields.text("session", pattern=_SESSION),
        executed_steps=fields.get("executed_steps", lambda v: _is_int(v) and v >= 0, "an int >= 0"),
        gpu_seconds=float(seconds),
    )


_TRIAL_RECORDS: dict[str, Callable[[_Fields], TrialRecord]] = {
    "open": _opened,
    "submit": _submitted,
    "extend": _extended,
    "end": _ended,
    "work": _worked,
}


@dataclass
class TrialState:
    """One trial as a study's records tell it: what resuming it or showing it starts from.

    `where` is the ``file:line`` of its submit record; `reached` the steps it reached when it
    ended (0 while pending)."""

    id: int
    config: Config
    steps: int
    where: str
    tag: Any = None
    salt: str = ""
    status: str = PENDING
    reached: int = 0
    metrics: dict[str, float] | None = None
    error: str | None = None


@dataclass
class StudyRecords:
    """A study's records journal folded: its sessions (all of one model identity: a study
    belongs to one model), the trials, each session's latest work record, and every line
    skipped with why (``(file:line, reason)``)."""

    opened: list[Opened] = field(default_factory=list)
    trials: dict[int, TrialState] = field(default_factory=dict)
    work: dict[str, Worked] = field(default_factory=dict)
    skipped: list[tuple[str, str]] = field(default_factory=list)

    def read(self, record: Mapping[str, Any], where: str) -> None:
        """Take one record (from `where`, ``file:line``), or skip it and say why."""
        try:
            self._fold(parse_trial_record(record), where)
        except RecordError as error:
            self.skipped.append((where, f"unreadable trial record ({error}); skipped"))

    def _fold(self, record: TrialRecord, where: str) -> None:
        if isinstance(record, Opened):
            if self.opened and record.identity != self.opened[0].identity:
                raise RecordError(
                    f"the study belongs to model {self.opened[0].identity}, this session names {record.identity}"
                )
            self.opened.append(record)
        elif isinstance(record, Worked):
            self.work[record.session] = record
        elif isinstance(record, Submitted):
            self._submit(record, where)
        else:
            state = self.trials.get(record.trial)
            if state is None:
                raise RecordError(f"trial {record.trial} was never submitted")
            if isinstance(record, Extended):
                _extend(state, record)
            else:
                _end(state, record)

    def _submit(self, record: Submitted, where: str) -> None:
        earlier = self.trials.get(record.trial)
        if earlier is not None:
            raise RecordError(f"trial {record.trial} was submitted before, at {earlier.where}")
        first = next(iter(self.trials.values()), None)
        if first is not None and record.config.keys() != first.config.keys():
            raise RecordError(
                f"trial {record.trial}'s config names {sorted(record.config)}, the study's trials "
                f"name {sorted(first.config)}"
            )
        self.trials[record.trial] = TrialState(
            record.trial, record.config, record.steps, where, record.tag, record.salt
        )

    def work_total(self) -> dict[str, float] | None:
        """Executed steps and GPU-seconds over the study's sessions (each one's latest
        record), or None if no session recorded any (studies written before these records)."""
        if not self.work:
            return None
        return {
            "executed_steps": sum(w.executed_steps for w in self.work.values()),
            "gpu_seconds": sum(w.gpu_seconds for w in self.work.values()),
        }


def _extend(state: TrialState, record: Extended) -> None:
    if state.status not in (PENDING, COMPLETED):
        raise RecordError(f"trial {state.id} is {state.status} and cannot be extended")
    if record.steps <= state.steps:
        raise RecordError(
            f"trial {state.id} has {state.steps} steps; extending it to {record.steps} does not"
        )
    try:
        check_config_finite(state.config, record.steps)
    except ValueError as error:
        raise RecordError(
            f"trial {state.id}'s config is not finite over {record.steps} steps: {error}"
        ) from None
    state.steps, state.status = record.steps, PENDING


def _end(state: TrialState, record: Ended) -> None:
    if state.status != PENDING:
        raise RecordError(f"trial {state.id} has ended already ({state.status})")
    if record.reached > state.steps or (record.status == COMPLETED and record.reached != state.steps):
        raise RecordError(
            f"trial {state.id} of {state.steps} steps cannot be {record.status} after {record.reached} steps"
        )
    state.status, state.reached = record.status, record.reached
    state.metrics, state.error = record.metrics, record.error


def read_study_records(entries: Iterable[tuple[Mapping[str, Any], str]]) -> StudyRecords:
    """Fold a study's records, given as ``(record, file:line)`` in journal order."""
    records = StudyRecords()
    for record, where in entries:
        records.read(record, where)
    return records


# --------------------------------------------------------------------------- search plan events


@dataclass(frozen=True)
class PlanEvent:
    """A search plan event, checked: `event` holds exactly the fields the plan reads, and
    `config` is a node event's config, parsed."""

    event: dict[str, Any]
    config: Config | None = None

    @property
    def needs(self) -> str | None:
        """The node the plan must know before this event applies: a node's parent, the node
        of any other event."""
        return self.event["parent"] if self.event["e"] == "node" else self.event["node"]


def parse_plan_event(record: Mapping[str, Any]) -> PlanEvent:
    """One line of a search plan journal, checked (`RecordError` says what is wrong)."""
    kind = record.get("e")
    parse = _PLAN_EVENTS.get(kind) if isinstance(kind, str) else None
    if parse is None:
        raise RecordError(f"unknown search plan event 'e' = {_shown(kind)}")
    return parse(_Fields(record, f"{kind} event"))


def _node_event(fields: _Fields) -> PlanEvent:
    identifier = fields.node("id")
    parent = fields.get(
        "parent", lambda v: v is None or (isinstance(v, str) and _NODE.match(v)), "a node id or null"
    )
    if parent is None:
        start = fields.get("start", lambda v: _is_int(v) and v == 0, "0 (a root starts at step 0)")
    else:
        start = fields.integer("start", 1, MAX_STEPS - 1, "a step")
    config = fields.config()
    private = fields.get("private", lambda v: isinstance(v, bool), "true or false", optional=True)
    salt = fields.text("salt", optional=True)
    if private and (parent is not None or not salt):
        raise RecordError("a private node event must be a root with a non-empty 'salt'")
    if not private and salt is not None:
        raise RecordError("node event field 'salt' belongs to private nodes only")
    expected = node_id(parent, start, config, salt or "")
    if identifier != expected:
        raise RecordError(
            f"node id {identifier} does not match its content ({_shorten(config_dumps(config), 80)})"
        )
    event = {
        "e": "node",
        "id": identifier,
        "parent": parent,
        "start": start,
        "config": config_to_json(config),
    }
    if private:
        event["private"], event["salt"] = True, salt
    return PlanEvent(event, config)


def _checkpoint_event(fields: _Fields) -> PlanEvent:
    return PlanEvent(
        {
            "e": "checkpoint",
            "node": fields.node("node"),
            "step": fields.step(),
            "nbytes": fields.integer("nbytes", 0, 2**63 - 1, "a size in bytes"),
            "sha256": fields.text("sha256", pattern=_SHA256),
        }
    )


def _drop_event(fields: _Fields) -> PlanEvent:
    return PlanEvent({"e": "drop_checkpoint", "node": fields.node("node"), "step": fields.step()})


def _metrics_event(fields: _Fields) -> PlanEvent:
    return PlanEvent(
        {"e": "metrics", "node": fields.node("node"), "step": fields.step(), "metrics": fields.metrics()}
    )


_PLAN_EVENTS: dict[str, Callable[[_Fields], PlanEvent]] = {
    "node": _node_event,
    "checkpoint": _checkpoint_event,
    "drop_checkpoint": _drop_event,
    "metrics": _metrics_event,
}
