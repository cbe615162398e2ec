"""A study's trial records (``open``, ``submit``, ``extend``, ``end``, ``retry``,
``work``), checked one by one (`parse_trial_record`) and folded into trials
(`read_study_records`), with the checks that span records: an ``end`` for a trial never
submitted, an ``extend`` that does not extend, a ``retry`` of a trial that did not fail, a
session of another model, a record for another session's trial.

Trial ids are numbers a session gives its trials in order. Should two sessions ever write
one study at once (the writer lease prevents it: `dagtune.study_lease`), both would use the
same numbers; so ``submit`` records name the session that submitted the trial
(``submitted_by``), ``extend``, ``end`` and ``retry`` records the session that submitted the
trial they are about, and a record about another session's trial of the same number is
skipped (and reported) rather than attached to a trial with another config.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from dagtune.config import Config, check_config_finite
from dagtune.records._checks import Fields, RecordError, is_int, is_number, is_study_name, shown
from dagtune.records._trial import CAUSES, COMPLETED, DIVERGED, FAILED, PENDING, STATUSES

__all__ = [
    "Ended",
    "Extended",
    "FoldedTrial",
    "Opened",
    "Retried",
    "StudyLink",
    "StudyRecords",
    "Submitted",
    "TrialRecord",
    "TrialState",
    "Worked",
    "parse_trial_record",
    "read_study_records",
]

_IDENTITY = re.compile(r"^[0-9a-f]{16}$")  # `dagtune.study.model_identity`
_SESSION = re.compile(r"^[0-9a-f]{32}$")  # a journal writer (uuid4 hex)


@dataclass(frozen=True)
class StudyLink:
    """The two studies of a surrogate study (`dagtune.SurrogateStudy`) name each other:
    `role` is this study's (``surrogate``: the search at width scale `scale`; ``target``: the
    full model trained with what the search found), `partner` the other study's name."""

    role: str
    partner: str
    scale: int

    def __post_init__(self) -> None:
        if self.role not in LINK_ROLES:
            raise ValueError(f"StudyLink.role must be one of {', '.join(LINK_ROLES)}, got {self.role!r}")
        if not is_study_name(self.partner):
            raise ValueError(f"StudyLink.partner must be a study name, got {self.partner!r}")
        if not is_int(self.scale) or self.scale < 2:
            raise ValueError(f"StudyLink.scale must be an int >= 2, got {self.scale!r}")

    def fields(self) -> dict[str, Any]:
        """The ``open`` record's fields that hold it."""
        return {"role": self.role, "partner": self.partner, "scale": self.scale}

    def __str__(self) -> str:
        if self.role == "surrogate":
            return f"surrogate (S={self.scale}) of {self.partner}"
        return f"target of {self.partner} (S={self.scale})"


LINK_ROLES = ("surrogate", "target")


@dataclass(frozen=True)
class Opened:
    """A session of the study began (``open``): the model identity it belongs to (trainer
    as ``module.qualname``, seed, version, and the trainer arguments when they survive JSON;
    None in records of a dagtune before they were kept), whether its stages trained fused,
    its partner if it is half of a surrogate study, and the GPUs each of its stages asks for
    (`gpus`; 0: none, so its GPU-seconds are worker-seconds; None: not recorded), and the
    torch thread count its trainers ran with (`torch_threads`, part of the model identity;
    None: each worker's own; 1 where not recorded, the default)."""

    identity: str
    trainer: str | None
    seed: int | None
    version: str | None
    link: StudyLink | None = None
    trainer_kwargs: dict[str, Any] | None = None
    fused: bool = False
    gpus: float | None = None
    torch_threads: int | None = 1


@dataclass(frozen=True)
class Submitted:
    """A trial was submitted (``submit``), by session `submitted_by` (None in records
    written before sessions were named)."""

    trial: int
    config: Config
    steps: int
    tag: Any
    salt: str
    submitted_by: str | None = None


@dataclass(frozen=True)
class Extended:
    """A trial was given more steps (``extend``); `submitted_by` names the session that
    submitted the trial."""

    trial: int
    steps: int
    submitted_by: str | None = None


@dataclass(frozen=True)
class Ended:
    """A trial finished (``end``) with `status` after `reached` steps (a failed one says why:
    `cause`, one of `CAUSES`; None in records written before causes were); `submitted_by`
    names the session that submitted the trial."""

    trial: int
    status: str
    reached: int
    metrics: dict[str, float] | None
    error: str | None
    cause: str | None = None
    submitted_by: str | None = None


@dataclass(frozen=True)
class Retried:
    """A failed trial is pending again (``retry``): a session retries it; `submitted_by`
    names the session that submitted the trial."""

    trial: int
    submitted_by: str | None = None


@dataclass(frozen=True)
class Worked:
    """What one session had trained so far (``work``): its latest record counts."""

    session: str
    executed_steps: int
    gpu_seconds: float


TrialRecord = Opened | Submitted | Extended | Ended | Retried | Worked


def parse_trial_record(record: Mapping[str, Any]) -> TrialRecord:
    """One line of a study's records journal, checked (`RecordError` says what is wrong)."""
    kind = record.get("r")
    parse = _TRIAL_RECORDS.get(kind) if isinstance(kind, str) else None
    if parse is None:
        raise RecordError(f"unknown trial record kind 'r' = {shown(kind)}")
    return parse(Fields(record, f"{kind} record"))


def _opened(fields: Fields) -> Opened:
    link = None
    if fields.get("role", lambda v: v in LINK_ROLES, f"one of {', '.join(LINK_ROLES)}", optional=True):
        link = StudyLink(
            fields.record["role"],
            fields.get("partner", is_study_name, "a study name"),
            fields.get("scale", lambda v: is_int(v) and v >= 2, "an int >= 2"),
        )
    return Opened(
        identity=fields.text("identity", pattern=_IDENTITY),
        trainer=fields.text("trainer", optional=True),
        seed=fields.get("seed", is_int, "an int", optional=True),
        version=fields.text("version", optional=True),
        link=link,
        trainer_kwargs=fields.get(
            "trainer_kwargs",
            lambda v: v is None or isinstance(v, dict),
            "a JSON object or null",
            optional=True,
        ),
        fused=bool(fields.get("fused", lambda v: isinstance(v, bool), "a bool", optional=True)),
        gpus=fields.get("gpus", lambda v: is_number(v) and 0 <= v < math.inf, "a number >= 0", optional=True),
        torch_threads=(
            fields.get("torch_threads", lambda v: v is None or (is_int(v) and v >= 1), "an int >= 1 or null")
            if "torch_threads" in fields.record
            else 1
        ),
    )


def _submitted(fields: Fields) -> Submitted:
    trial, steps, config = fields.trial(), fields.step("steps"), fields.config()
    try:
        check_config_finite(config, steps)
    except ValueError as error:
        raise RecordError(
            f"{fields.kind} field 'config' is not finite over its {steps} steps: {error}"
        ) from None
    return Submitted(
        trial,
        config,
        steps,
        fields.record.get("tag"),
        fields.text("salt", optional=True) or "",
        _submitter(fields),
    )


def _submitter(fields: Fields) -> str | None:
    return fields.text("submitted_by", pattern=_SESSION, optional=True)


def _extended(fields: Fields) -> Extended:
    return Extended(fields.trial(), fields.step("steps"), _submitter(fields))


def _ended(fields: Fields) -> Ended:
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
        cause=fields.get(
            "cause", lambda v: v is None or v in CAUSES, f"one of {', '.join(CAUSES)}", optional=True
        ),
        submitted_by=_submitter(fields),
    )


def _retried(fields: Fields) -> Retried:
    return Retried(fields.trial(), _submitter(fields))


def _worked(fields: Fields) -> Worked:
    seconds = fields.get(
        "gpu_seconds", lambda v: is_number(v) and 0 <= v < math.inf, "a finite number of seconds >= 0"
    )
    return Worked(
        session=fields.text("session", pattern=_SESSION),
        executed_steps=fields.get("executed_steps", lambda v: is_int(v) and v >= 0, "an int >= 0"),
        gpu_seconds=float(seconds),
    )


_TRIAL_RECORDS: dict[str, Callable[[Fields], TrialRecord]] = {
    "open": _opened,
    "submit": _submitted,
    "extend": _extended,
    "end": _ended,
    "retry": _retried,
    "work": _worked,
}


@dataclass
class TrialState:
    """One trial as a study's records tell it: what resuming it or showing it starts from.

    `where` is the ``file:line`` of its submit record; `reached` the steps it reached when it
    ended (0 while pending); `submitted_by` the session that submitted it, if recorded."""

    id: int
    config: Config
    steps: int
    where: str
    tag: Any = None
    salt: str = ""
    submitted_by: str | None = None
    status: str = PENDING
    reached: int = 0
    metrics: dict[str, float] | None = None
    error: str | None = None
    cause: str | None = None


class FoldedTrial(Protocol):
    """What a study's records say of one trial once folded: a `TrialState` has it, and so
    has a `dagtune.records.Trial` whose records its study's writer wrote itself (the
    closing writer builds its study's read index from what it holds:
    `dagtune.durable.Persistence.session_study`). `reached` is read only of a trial that
    ended."""

    id: int
    config: Config
    steps: int
    status: str
    reached: int
    metrics: dict[str, float] | None
    error: str | None
    cause: str | None
    salt: str


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
            if (
                None not in (record.submitted_by, state.submitted_by)
                and record.submitted_by != state.submitted_by
            ):
                raise RecordError(
                    f"it is about the trial {record.trial} that session {record.submitted_by} submitted, "
                    f"but trial {record.trial} here is session {state.submitted_by}'s (submitted at "
                    f"{state.where}); two sessions wrote the study at once"
                )
            if isinstance(record, Extended):
                _extend(state, record)
            elif isinstance(record, Retried):
                _retry(state)
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
            record.trial, record.config, record.steps, where, record.tag, record.salt, record.submitted_by
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
    state.metrics, state.error, state.cause = record.metrics, record.error, record.cause


def _retry(state: TrialState) -> None:
    if state.status != FAILED:
        raise RecordError(f"trial {state.id} is {state.status}: only a failed trial is retried")
    state.status, state.reached = PENDING, 0
    state.metrics, state.error, state.cause = None, None, None


def read_study_records(entries: Iterable[tuple[Mapping[str, Any], str]]) -> StudyRecords:
    """Fold a study's records, given as ``(record, file:line)`` in journal order."""
    records = StudyRecords()
    for record, where in entries:
        records.read(record, where)
    return records
