"""Running a path of stages with a trainer: the step protocol every execution shares.

The Dask executor, the simulated executor and `run_alone` all train through `PathRunner`,
so a trial trained alone and the same trial trained in shared stages see exactly the same
calls: ``setup`` with every value when training starts or resumes and with the changed
values before a later step where something changed, one ``train`` per step (its metrics go
with the step's validation metrics; a non-finite one makes the step evaluated, so divergence
shows at once), ``evaluate`` inside an isolated RNG and with every module's training mode put back after it,
so evaluating more often never changes training (each worker's first evaluations are checked
to leave the rest, ``state_dict()``, alone: `dagtune.evalcheck`), and RNG states saved and restored with every checkpoint.

A worker keeps the trainer of the last path it ran (`LiveTrainers`); a path that resumes
from exactly that point continues in memory without reading storage.

A checkpoint that fails verification (`CheckpointError`: missing marker, bad checksum,
truncated file, or a committed state that is not a trainer state and RNG states as this
module saves them) is never used: the task ends with a `CheckpointCorrupt` naming the point,
and the coordinator plans the work again from an earlier one.

A checkpoint also carries the metrics of the steps it covers that the coordinator may not
have recorded: those evaluated since the point the task was given (its source, which the
coordinator knew with its metrics). A task resumes from the latest checkpoint of its path
that storage holds, which may be one the coordinator never heard of (it died, or the
worker died, between the commit and the events); the task then sends those metrics and
that checkpoint first, so a step's metrics reach the search plan no later than any
checkpoint that covers it, and a learning curve is complete after any crash.

Besides the checkpoints its task plans, a task with a ``checkpoint_interval`` saves one at
the end of the first step that ends that many seconds (on the runner's clock) after its
last save, or after it began training. Such a checkpoint is not evaluated, nor probed by the
resume check: the clock decides only which checkpoints exist, never what is trained or
reported. A rerun finds them by listing its path's nodes in a durable store.
"""

from __future__ import annotations

import dataclasses
import functools
import io
import math
import re
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from dagtune.checkpoints import CheckpointError, CheckpointStore, UnsavableStateError, serialize_state
from dagtune.config import config_values
from dagtune.errors import DagtuneError, TrainerCheckError
from dagtune.evalcheck import EvaluateChecks, training_state
from dagtune.events import (
    CheckpointCorrupt,
    CheckpointDeclined,
    CheckpointSaved,
    MetricsReported,
    StateLoaded,
    StepDone,
    TaskEnded,
    TaskEvent,
    TaskFailed,
    TaskStarted,
    TrainerWarned,
)
from dagtune.hpreads import RecordingValues, SetupValues, defaulted_message, unread_message
from dagtune.notices import (
    DefaultedHyperparameterWarning,
    NondeterministicTrainingWarning,
    ResumeCheckSkippedWarning,
    UnreadHyperparameterWarning,
    warning_event,
)
from dagtune.records import CheckpointInfo
from dagtune.resumecheck import (
    LoadStateError,
    ResumeChangedTrainingError,
    ResumeChecks,
    StepOutcome,
    differences,
    failed_outcome,
    likely_causes,
    load_state,
    out_of_memory,
    resumed_setup,
    trainer_outcome,
)
from dagtune.sequences import same_value
from dagtune.tasks import Directive, PathTask, Segment
from dagtune.trainer import (
    Trainer,
    build_trainer,
    capture_rng,
    check_rng_state,
    explained,
    isolated_rng,
    kept_training_modes,
    restore_rng,
    torch_threads,
)
from dagtune.validation import is_number

__all__ = [
    "Carried",
    "CheckpointBackend",
    "CorruptPointError",
    "LiveTrainers",
    "MemberPath",
    "PathRunner",
    "StepTimeoutError",
    "StorageFailedError",
    "checkpoint_parts",
    "checkpoint_state",
    "failure_fields",
    "run_to_end",
    "through_storage",
    "timeout_fields",
    "to_metrics",
]


class CheckpointBackend(Protocol):
    """The part of a checkpoint store the runner uses."""

    def save(self, identity: str, node: str, step: int, state: dict) -> CheckpointInfo: ...

    def load(self, identity: str, node: str, step: int) -> dict: ...

    def info(self, identity: str, node: str, step: int) -> CheckpointInfo | None: ...


#: metrics a checkpoint carries: ``(node, step, metrics)`` of each step evaluated on its path
#: since the point its task was given (see the module docstring)
Carried = list[tuple[str, int, dict[str, float]]]


@dataclass
class _Live:
    identity: str
    node: str
    step: int
    trainer: Trainer
    rng: dict
    carried: Carried = field(default_factory=list)


class LiveTrainers:
    """The trainer a worker ran last, kept in memory at the point where it stopped."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._live: _Live | None = None

    def take(self, identity: str, node: str, step: int) -> _Live | None:
        """The live trainer if it is exactly at ``(node, step)`` of `identity` (it is removed:
        the taker now owns it)."""
        with self._lock:
            live = self._live
            if live is not None and (live.identity, live.node, live.step) == (identity, node, step):
                self._live = None
                return live
            return None

    def holds(self, identity: str, node: str, step: int) -> bool:
        live = self._live
        return live is not None and (live.identity, live.node, live.step) == (identity, node, step)

    def put(self, live: _Live) -> None:
        with self._lock:
            self._live = live

    def clear(self) -> None:
        with self._lock:
            self._live = None


def to_metrics(raw: Any, where: str) -> dict[str, float]:
    """Metrics as plain floats (msgpack-able), from a dict of numbers or 0-d tensors."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise TypeError(f"{where} must return a dict of metric name -> number, got {raw!r}")
    metrics = {}
    for name, value in raw.items():
        if hasattr(value, "item"):
            try:
                value = value.item()
            except (RuntimeError, ValueError) as error:  # a tensor or array of several numbers
                shape = tuple(getattr(value, "shape", ()))
                raise TypeError(
                    f"{where} returned metric {name!r} as a {type(value).__name__} of shape {shape}, "
                    f"not one number ({error})"
                ) from None
        if not is_number(value):
            raise TypeError(f"{where} returned a non-numeric metric {name!r}: {value!r}")
        metrics[str(name)] = float(value)
    return metrics


def checkpoint_state(trainer_state: Any, carried: Carried) -> dict:
    """What a checkpoint holds: the trainer's state, the RNG states now, the carried metrics."""
    return {
        "trainer": trainer_state,
        "rng": capture_rng(),
        "metrics": [[node, step, dict(metrics)] for node, step, metrics in carried],
    }


def stored_state(state: dict) -> dict:
    """`state` as it is saved: python's RNG state (625 words) as one int64 tensor, since
    torch.save pickles a list of them one object at a time (more CPU than the rest of a
    no-op stage's save); `checkpoint_parts` gives the list back."""
    python = state["rng"]["python"]
    compact = {**python, "state": torch.tensor(python["state"], dtype=torch.int64)}
    return {**state, "rng": {**state["rng"], "python": compact}}


def checkpoint_parts(state: Any) -> tuple[Any, Any, Carried]:
    """The trainer's state, the RNG states and the carried metrics of a loaded checkpoint (none
    in one saved before checkpoints carried them); a `CheckpointError` if it holds anything
    else (committed and intact, but not a state this module saved)."""
    if not isinstance(state, dict) or not {"trainer", "rng"} <= state.keys():
        found = sorted(map(str, state)) if isinstance(state, dict) else type(state).__name__
        raise CheckpointError(f"not a training state: it needs 'trainer' and 'rng', it holds {found}")
    rng = state["rng"]
    python = rng.get("python") if isinstance(rng, dict) else None
    if isinstance(python, dict) and isinstance(python.get("state"), torch.Tensor):
        rng = {**rng, "python": {**python, "state": python["state"].tolist()}}  # as capture_rng gives it
    try:
        check_rng_state(rng)
    except ValueError as error:
        raise CheckpointError(f"not a training state: {error}") from None
    return state["trainer"], rng, _carried(state.get("metrics", []))


def _carried(entries: Any) -> Carried:
    """A checkpoint's carried metrics, checked (`CheckpointError` names what is wrong)."""
    if not isinstance(entries, list):
        raise CheckpointError(
            f"not a training state: its 'metrics' is a {type(entries).__name__}, not a list"
        )
    carried = []
    for entry in entries:
        try:
            node, step, metrics = entry
            valid = (
                isinstance(node, str)
                and _NODE.match(node) is not None
                and type(step) is int
                and step >= 1
                and isinstance(metrics, dict)
                and all(isinstance(k, str) and type(v) is float for k, v in metrics.items())
            )
        except (TypeError, ValueError):
            valid = False
        if not valid:
            raise CheckpointError(
                f"not a training state: its 'metrics' hold {str(entry)[:80]!r}, not [node, step, {{name: float}}]"
            )
        carried.append((node, step, metrics))
    return carried


_NODE = re.compile(r"^[0-9a-f]{16}$")  # a node id (`dagtune.records.node_id`)


class StorageFailedError(DagtuneError):
    """Reading or writing a checkpoint failed in storage itself (a full disk, an unreachable
    object store): not the trainer's failure, nor a corrupt checkpoint (`CheckpointError`).
    A trial it fails is retried when its study is opened again (`dagtune.records.CAUSES`)."""


def through_storage(call: Callable[..., Any], *args: Any) -> Any:
    """``call(*args)``, a checkpoint store's method: what storage raises becomes a
    `StorageFailedError` (its cause kept); a `CheckpointError` stays what it is, and so does
    an `UnsavableStateError` (the trainer's state, not the storage, is at fault)."""
    try:
        return call(*args)
    except (CheckpointError, UnsavableStateError):
        raise
    except Exception as error:
        raise StorageFailedError(f"{type(error).__name__}: {error}") from error


class StepTimeoutError(DagtuneError):
    """A step did not finish within the study's ``step_timeout`` (a hanging ``train()``)."""


def failure_fields(error: BaseException) -> dict[str, Any]:
    """The fields a `TaskFailed` gives a failure: `error` (one line), `traceback`, `cause`
    (``storage`` for a `StorageFailedError`, ``timeout`` for a `StepTimeoutError`, else
    ``trainer``) and `retry` (False for a failed check of the trainer's code,
    `TrainerCheckError`: training again fails it again). An error whose fix dagtune knows
    is reported as the clearer error `dagtune.trainer.explained` makes of it."""
    error = explained(error)
    if isinstance(error, StorageFailedError):
        cause = "storage"
    elif isinstance(error, StepTimeoutError):
        cause = "timeout"
    else:
        cause = "trainer"
    return {
        "error": str(error) if cause == "storage" else f"{type(error).__name__}: {error}",
        "traceback": "".join(traceback.format_exception(error)),
        "cause": cause,
        "retry": not isinstance(error, TrainerCheckError),
    }


def timeout_fields(step: int, seconds: float, stack: str) -> dict[str, Any]:
    """`failure_fields` of step `step` given up after `seconds`, with `stack` (where its
    thread was) as the traceback."""
    fields = failure_fields(
        StepTimeoutError(
            f"step {step} did not finish within step_timeout={seconds:g} s; its worker is replaced"
        )
    )
    if stack:
        fields["traceback"] = f"{fields['error']}\nWhere the step was when it was given up:\n{stack}"
    return fields


class CorruptPointError(DagtuneError):
    """The checkpoint at ``(node, step)`` failed verification (`CheckpointError`): the task
    ends with a `CheckpointCorrupt` event instead of training."""

    def __init__(self, node: str, step: int, error: CheckpointError):
        super().__init__(str(error))
        self.node, self.step = node, step


class MemberPath:
    """One task as a runner trains it, alone (`PathRunner`) or in a fused group
    (`dagtune.fusion.FusedPathRunner`): where it is on its path, its directive, where it
    resumes, what it reads back there, and every event it sends, made here once for both."""

    def __init__(
        self,
        task: PathTask,
        worker: str,
        wallclock: Callable[[], float],
        started: float | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ):
        self.task = task
        self.worker = worker
        self.wallclock = wallclock
        self.clock = clock  # measures `checkpoint_interval` (the runner's: virtual in a simulation)
        self.saved_at: float | None = None  # when it last saved, or began training (`clock`)
        self.started_at = started  # when the task started (None: when it sends `started`)
        self.attempt = uuid.uuid4().hex[:12]
        self.directive = Directive()
        self.position = task.start  # steps trained so far along the path
        self.executed = 0
        self.halted = False  # set by `halt`: no further step, whatever later directives say
        self.done = False  # its end (or failure) is sent
        self.evaluating = False  # evaluating step `position` (an error there is that step's)
        self.values: dict[str, Any] | None = None  # the values its trainer was last set up with
        self.carried: Carried = []  # what its next checkpoint carries (the module docstring)
        self.current: int | None = None  # the step being trained (None: acquiring the trainer)

    # ------------------------------------------------------------------ the path

    def update(self, directive: Directive) -> list[CheckpointDeclined]:
        """Take a new directive; returns a `CheckpointDeclined` for each wanted checkpoint
        already passed (the coordinator then plans to recompute it)."""
        passed = sorted(s for s in directive.checkpoints - self.directive.checkpoints if s <= self.position)
        self.directive = directive
        task = self.task
        return [
            CheckpointDeclined(task.key, self.attempt, task.node_at(s), s) for s in passed if s > task.start
        ]

    @property
    def finished(self) -> bool:
        """No directive can make it train another step: it reached its path's end, was
        halted, or its end (or failure) is sent. Its directive need not be read again."""
        return self.done or self.halted or self.position >= self.task.end

    @property
    def paused(self) -> bool:
        """At the boundary the coordinator asked to pause at (its checkpoint is saved)."""
        return self.position == self.directive.pause_at and self.task.start < self.position < self.task.end

    def next_step(self) -> tuple[Segment, int] | None:
        """The (segment, step) to train next, or None where this task stops now (its end,
        the directive's stop or pause, or `halted`)."""
        for segment in self.task.segments:
            if self.position < segment.end:
                if self.directive.stop_at is not None and self.position >= self.directive.stop_at:
                    return None
                if self.paused or self.halted:
                    return None
                return segment, max(segment.start, self.position)
        return None

    def changes(self, segment: Segment, t: int) -> dict[str, Any]:
        """The values `setup` gets before step `t`: all of them first, then the changed ones."""
        now = config_values(segment.config, t)
        if self.values is None:
            changes = dict(now)
        else:
            changes = {k: v for k, v in now.items() if not same_value(v, self.values.get(k, _MISSING))}
        self.values = now
        return changes

    def owner(self, step: int) -> str | None:
        """The node owning point `step` of this path (None for a fresh trainer at step 0)."""
        if step > self.task.start:
            return self.task.node_at(step)
        return self.task.source[0] if self.task.source is not None else None

    # ------------------------------------------------------------------ checkpoints

    def training(self) -> None:
        """Training begins (its first step is next): the `checkpoint_interval` counts from now
        until its first save."""
        if self.saved_at is None:
            self.saved_at = self.clock()

    def interval_due(self, last: bool) -> bool:
        """Whether the step just trained is to save an unplanned checkpoint: the task's
        `checkpoint_interval` has passed since its last save (or since it began training),
        and the step is not where it stops (`last`: its end or its directive's stop, which
        need none of their own)."""
        interval = self.task.checkpoint_interval
        if interval is None or last or self.saved_at is None:
            return False
        return self.clock() - self.saved_at >= interval

    def save(
        self, store: CheckpointBackend, node: str, step: int, trainer_state: Any
    ) -> tuple[dict, CheckpointSaved]:
        """Save the checkpoint at ``(node, step)`` (the trainer's state, the RNG states now,
        the carried metrics): what was saved and its `CheckpointSaved`. The
        `checkpoint_interval` counts again from when it is committed."""
        state = checkpoint_state(trainer_state, self.carried)
        info = through_storage(store.save, self.task.trainer.identity, node, step, stored_state(state))
        self.saved_at = self.clock()
        return state, self.saved(node, step, info)

    # ------------------------------------------------------------------ where it resumes

    def resume_point(
        self, store: CheckpointBackend | None
    ) -> tuple[tuple[str, int] | None, CheckpointInfo | None]:
        """The latest committed checkpoint of this path (a rerun after a lost worker or a lost
        coordinator resumes from it) with its commit info, else the task's own source (None:
        the coordinator knows it). With a `checkpoint_interval`, the unplanned checkpoints
        of its path count too: a durable store lists each node's (one listing per segment,
        from the last, until one is found)."""
        if store is None:
            return self.task.source, None
        task, identity = self.task, self.task.trainer.identity
        listing = task.checkpoint_interval is not None and isinstance(store, CheckpointStore)
        for segment in reversed(task.segments):
            low, high = max(segment.start, task.start), min(segment.end, task.end - 1)
            steps = {s for s in task.checkpoints if low < s <= high}
            if listing and low < high:  # a segment with no step to resume at is not listed
                steps.update(
                    s for s in through_storage(store.steps, identity, segment.node) if low < s <= high
                )
            for step in sorted(steps, reverse=True):
                try:
                    committed = through_storage(store.info, identity, segment.node, step)
                except CheckpointError as error:  # a malformed commit marker
                    raise CorruptPointError(segment.node, step, error) from error
                if committed is not None:
                    return (segment.node, step), committed
        return task.source, None

    def read_point(
        self, store: CheckpointBackend | None, live: LiveTrainers | None, node: str, step: int
    ) -> tuple[Trainer | None, Any, Any, Carried, str]:
        """What the task resumes from at ``(node, step)``: the worker's live trainer (then
        its state is None) or the state storage holds (then the trainer is None), the RNG
        states, the carried metrics, and where it came from (``memory``, ``storage``)."""
        identity = self.task.trainer.identity
        taken = None if live is None else live.take(identity, node, step)
        if taken is not None:
            return taken.trainer, None, taken.rng, taken.carried, "memory"
        if store is None:
            raise RuntimeError(
                f"task {self.task.key} resumes from {(node, step)} but has no checkpoint store"
            )
        try:
            state, rng, carried = checkpoint_parts(through_storage(store.load, identity, node, step))
        except CheckpointError as error:
            raise CorruptPointError(node, step, error) from error
        return None, state, rng, carried, "storage"

    def resumed(
        self, node: str, step: int, origin: str, found: CheckpointInfo | None, carried: Carried
    ) -> list[TaskEvent]:
        """The events of resuming at ``(node, step)`` from `origin`: when the checkpoint is
        one the coordinator may not know (`found`), the metrics it carries and itself first."""
        task, attempt = self.task.key, self.attempt
        events: list[TaskEvent] = [StateLoaded(task, attempt, node, step, origin)]
        if found is not None:
            self.carried = list(carried)
            events.extend(MetricsReported(task, attempt, n, t, m) for n, t, m in carried)
            events.append(CheckpointSaved(task, attempt, node, step, found.nbytes, found.sha256))
        return events

    # ------------------------------------------------------------------ events

    def started(self) -> TaskStarted:
        when = self.wallclock() if self.started_at is None else self.started_at
        return TaskStarted(
            self.task.key, self.attempt, self.task.segments[0].node, self.position, self.worker, when
        )

    def corrupt(self, corrupt: CorruptPointError) -> CheckpointCorrupt:
        self.done = True
        return CheckpointCorrupt(
            self.task.key,
            self.attempt,
            corrupt.node,
            corrupt.step,
            self.worker,
            self.wallclock(),
            str(corrupt),
        )

    def metrics(self, node: str, step: int, metrics: dict[str, float]) -> MetricsReported:
        return MetricsReported(self.task.key, self.attempt, node, step, metrics)

    def saved(self, node: str, step: int, info: CheckpointInfo) -> CheckpointSaved:
        return CheckpointSaved(self.task.key, self.attempt, node, step, info.nbytes, info.sha256)

    def stepped(self, node: str, step: int, seconds: float, train: dict[str, float]) -> StepDone:
        return StepDone(self.task.key, self.attempt, node, step, seconds, train)

    def warned(self, node: str, step: int, fields: dict[str, str]) -> TrainerWarned:
        """A `TrainerWarned` with `dagtune.notices.warning_event`'s `fields`."""
        return TrainerWarned(self.task.key, self.attempt, node, step, **fields)

    def ended(self, reason: str | None = None) -> TaskEnded:
        """Its `TaskEnded` where it is (`reason`: ``done`` at its end, else ``stopped``)."""
        self.done = True
        reason = reason or ("done" if self.position >= self.task.end else "stopped")
        return TaskEnded(
            self.task.key,
            self.attempt,
            self.owner(self.position),
            self.position,
            self.worker,
            reason,
            self.wallclock(),
        )

    def failed(self, error: BaseException) -> TaskFailed:
        """The `TaskFailed` of a failure while training the step after ``position``, or while
        evaluating the step ``position`` it has trained."""
        self.done = True
        step = self.position if self.evaluating else min(self.position + 1, self.task.end)
        return self._failed(step, failure_fields(error))

    def timed_out(self, seconds: float, stack: str = "") -> TaskFailed:
        """The `TaskFailed` of a step that has not finished `seconds` after it began
        (`StepTimeoutError`; `stack`: where the step was then, for the traceback); the
        task may still end or fail later."""
        step = self.position if self.current is None else self.current
        return self._failed(min(step + 1, self.task.end), timeout_fields(step, seconds, stack))

    def _failed(self, step: int, fields: dict[str, Any]) -> TaskFailed:
        return TaskFailed(
            self.task.key,
            self.attempt,
            self.task.node_at(step),
            step,
            self.wallclock(),
            worker=self.worker,
            **fields,
        )


def run_to_end(runner: Any, on_events: Callable[[list[TaskEvent]], None] | None = None) -> list[TaskEvent]:
    """Run `runner` (a `PathRunner` or a `FusedPathRunner`) to its end, handing each step's
    events to `on_events`; returns every event (a failure becomes the `TaskFailed` of every
    task still training, not an exception)."""
    everything: list[TaskEvent] = []
    try:
        for events in runner.steps():
            everything.extend(events)
            if on_events is not None:
                on_events(events)
    except Exception as error:  # a trainer's failure is reported, not raised
        events = runner.error_events(error)
        everything.extend(events)
        if on_events is not None:
            on_events(events)
    return everything


class PathRunner:
    """Trains one `PathTask`, one step at a time, producing events (`dagtune.events`).

    Iterate `steps()`: each item is the list of events of one step (`MetricsReported`,
    `CheckpointSaved`, then `StepDone`) after the first, which also carries `TaskStarted`
    and `StateLoaded` (and, resuming from a checkpoint the coordinator may not know, the
    metrics it carries and its `CheckpointSaved`); the last item carries `TaskEnded`.
    `update` applies a directive between steps. Its task's position, directive and events
    are its `path` (`MemberPath`, as a fused group's member's), also its only entry in
    `members`.

    `clock` measures the steps; `step_seconds`, when given, says instead how long the step
    just trained took (an executor in virtual time charges it before the step runs);
    `started`, when given, is the wall-clock time the task started (default: when `steps`
    begins: an executor that queued the task knows better).
    """

    def __init__(
        self,
        task: PathTask,
        store: CheckpointBackend | None,
        live: LiveTrainers | None = None,
        worker: str = "local",
        clock: Callable[[], float] = time.perf_counter,
        wallclock: Callable[[], float] = time.time,
        checks: EvaluateChecks | None = None,
        resume_checks: ResumeChecks | None = None,
        step_seconds: Callable[[], float] | None = None,
        started: float | None = None,
    ):
        self.task = task
        self.store = store
        self.live = live
        self.checks = checks if checks is not None else EvaluateChecks()  # the worker's, if it keeps one
        self.resume_checks = resume_checks if resume_checks is not None else ResumeChecks()
        self.clock = clock
        self.step_seconds = step_seconds
        self.path = MemberPath(task, worker, wallclock, started, clock)
        self.members = {task.key: self.path}
        self._probe: _Probe | None = None  # a fresh trainer's step after a checkpoint, to compare
        self._after_checkpoint: tuple | None = None  # (segment, step, load) of one still to probe
        # the `DefaultedHyperparameterWarning` messages of this task's setup() calls: a resume
        # check that fails after one names it first (a resumed trainer is handed the value)
        self._defaulted_messages: list[str] = []

    def update(self, directive: Directive) -> list[CheckpointDeclined]:
        """Take a new directive (`MemberPath.update`)."""
        return self.path.update(directive)

    def halt(self, key: str | None = None) -> None:
        """Train no further step (an executor that has decided this task ends now: the
        simulated one charges virtual time before a step runs, so it must not run one it
        did not charge)."""
        self.path.halted = True

    # ------------------------------------------------------------------ acquiring the trainer

    def _acquire(self) -> tuple[Trainer, list[TaskEvent]]:
        spec, path = self.task.trainer, self.path
        point, found = path.resume_point(self.store)
        if point is None:
            path.position = 0
            return build_trainer(spec.cls, spec.kwargs, spec.seed), []
        node, step = point
        path.position = step
        trainer, state, rng_state, carried, origin = path.read_point(self.store, self.live, node, step)
        if trainer is None:
            trainer = build_trainer(spec.cls, spec.kwargs, spec.seed)
            load_state(trainer, state)
        restore_rng(rng_state)
        return trainer, path.resumed(node, step, origin, found, carried)

    # ------------------------------------------------------------------ the loop

    def steps(self) -> Iterator[list[TaskEvent]]:
        """The events of each step (see the class docstring). The trainer's code (building,
        loading, every step) runs with torch's thread count set to the task's
        ``torch_threads``; the caller's count is back between steps."""
        inner = self._steps()
        while True:
            with torch_threads(self.task.torch_threads):
                events = next(inner, None)
            if events is None:
                return
            yield events

    def _steps(self) -> Iterator[list[TaskEvent]]:
        task, path = self.task, self.path
        try:
            trainer, events = self._acquire()
        except CorruptPointError as corrupt:
            yield [path.corrupt(corrupt)]
            return
        events.insert(0, path.started())
        recording: RecordingValues | None = None
        keep = True  # the trainer stays live at its end (not if it trained a step past it)
        path.training()
        while (next_step := path.next_step()) is not None:
            segment, t = next_step
            if self._after_checkpoint is not None:  # its events are out: probe the step after it
                events.extend(self._resumed_next(*self._after_checkpoint))
                self._after_checkpoint = None
            path.current = t
            first = path.values is None
            changes = path.changes(segment, t)
            if first:
                recording = RecordingValues(changes, path.values, t, self._unchanged(segment, t))
                trainer.setup(recording)
                events.extend(self._defaulted(recording))
            elif changes:
                handed = SetupValues(changes, path.values, t)
                trainer.setup(handed)
                events.extend(self._defaulted(handed))
            began = self.clock()
            train_metrics = to_metrics(trainer.train(), "Trainer.train()")
            seconds = self.step_seconds() if self.step_seconds is not None else self.clock() - began
            if recording is not None:  # the first setup() and train() of the task are over
                recording.recording = False
                events.extend(self._unread(recording))
                recording = None
            if self._probe is not None and self._probe.step == t:
                events.extend(self._compare(trainer, trainer_outcome(trainer, train_metrics)))
            path.position = n = t + 1
            path.executed += 1
            wanted = n in task.checkpoints or n in path.directive.checkpoints
            last = n == task.end or n == path.directive.stop_at
            diverging = not all(math.isfinite(v) for v in train_metrics.values())
            if wanted or last or diverging or n % task.eval_every == 0:
                # training metrics go with the step's validation metrics (which win a name clash)
                metrics = {**train_metrics, **self._evaluate(trainer)}
                path.carried.append((segment.node, n, metrics))
                events.append(path.metrics(segment.node, n, metrics))
            if wanted and self.store is not None:
                events.append(path.save(self.store, segment.node, n, trainer.state_dict())[1])
                if self._probe is None and self._resume_due():
                    load = functools.partial(self.store.load, task.trainer.identity, segment.node, n)
                    if n < task.end:  # the next step is the path's own: probed once this one is out
                        self._after_checkpoint = (segment, n, load)
                    else:  # checked before the step is reported, so a failure fails the trials ending here
                        events.extend(self._resumed_next(segment, n, load))
                        if self._probe is not None:
                            events.extend(self._check_at_the_end(trainer, path.values))
                            keep = False
            elif self.store is None and n == task.start + 1 and self._resume_due():  # run_alone: in memory
                saved = serialize_state({"trainer": trainer.state_dict(), "rng": capture_rng()})
                self._after_checkpoint = (segment, n, functools.partial(_in_memory, saved))
            elif self.store is not None and path.interval_due(last):
                # unplanned: not evaluated (nor probed by the resume check), so that what is
                # trained and reported is the same whenever the clock makes one due
                events.append(path.save(self.store, segment.node, n, trainer.state_dict())[1])
            # ``step`` comes last: a coordinator that has seen it has seen everything the step
            # produced, so a point it believes passed is never one whose checkpoint is on its way
            events.append(path.stepped(segment.node, n, seconds, train_metrics))
            yield events
            events = []
        end_node = path.owner(path.position)
        if self._after_checkpoint is not None:  # it stopped or paused at its last checkpoint
            events.extend(self._resumed_next(*self._after_checkpoint))
            if self._probe is not None:
                events.extend(self._check_at_the_end(trainer, path.values or {}))
                keep = False
        if self.live is not None and end_node is not None and keep:
            self.live.put(
                _Live(task.trainer.identity, end_node, path.position, trainer, capture_rng(), path.carried)
            )
        events.append(path.ended())
        yield events

    def _unchanged(self, segment: Segment, t: int) -> set[str]:
        """The values that did not change before step `t`, where others did and the task
        starts there (after step 0): `run_alone`, one task, hands setup() only those that
        changed, so the task's first setup(), handed every value, reads these as it would
        (`SetupValues.unchanged`). None where nothing changed: `run_alone` calls no setup()."""
        if t == 0:
            return set()
        now, before = config_values(segment.config, t), config_values(segment.config, t - 1)
        unchanged = {k for k, v in now.items() if same_value(v, before.get(k, _MISSING))}
        return unchanged if len(unchanged) < len(now) else set()

    def _evaluate(self, trainer: Trainer) -> dict[str, float]:
        """The trainer's validation metrics, its random draws isolated from training and its
        modules' training modes put back after; while the worker's checks are due, the state
        (``state_dict()``) is compared before and after."""
        identity, limit = self.task.trainer.identity, self.task.check_evaluate
        self.path.evaluating = True
        before = training_state(trainer) if self.checks.due(identity, limit) else None
        with isolated_rng(), kept_training_modes(trainer):
            metrics = to_metrics(trainer.evaluate(), "Trainer.evaluate()")
        if before is not None:
            self.checks.verify(identity, limit, before, training_state(trainer))
        self.path.evaluating = False
        return metrics

    # ------------------------------------------------------------------ warnings and the resume check

    def _defaulted(self, handed: SetupValues) -> list[TaskEvent]:
        """A `TrainerWarned` for each ``hp.get(name, default)`` whose default hid the config's
        value of a hyper-parameter that did not change (`SetupValues.defaulted`)."""
        name = _qualname(self.task.trainer.cls)
        warnings = [
            (key, defaulted_message(name, key, default, value, handed.step))
            for key, default, value in handed.defaulted
        ]
        self._defaulted_messages.extend(message for _, message in warnings)
        return self._warned(DefaultedHyperparameterWarning, "defaulted", warnings)

    def _unread(self, recording: RecordingValues) -> list[TaskEvent]:
        """A `TrainerWarned` for each hyper-parameter the first setup() and train() never read."""
        name = _qualname(self.task.trainer.cls)
        return self._warned(
            UnreadHyperparameterWarning,
            "unread",
            [(key, unread_message(name, key, recording.asked)) for key in recording.unread()],
        )

    def _warned(self, category: type[Warning], kind: str, warnings: list[tuple[str, str]]) -> list[TaskEvent]:
        """A `TrainerWarned` of `category` for each (hyper-parameter, message) of `warnings`,
        keyed by `kind`, the trainer class and the name, so a study shows each once."""
        cls = self.task.trainer.cls
        trainer = f"{getattr(cls, '__module__', '')}.{_qualname(cls)}"
        return [
            self.path.warned(
                self.task.segments[0].node,
                self.path.position,
                warning_event(category, message, f"{kind} {trainer} {key}"),
            )
            for key, message in warnings
        ]

    def _resumed_next(self, segment: Segment, n: int, load: Callable[[], Any]) -> list[TaskEvent]:
        """At a checkpoint at step `n` (`load` reads it back), while this worker's resume
        checks of the model are due: train the next step on a fresh trainer loaded from it,
        to compare with the next step of this one (`_compare`). The next step is this path's
        (at its end: the step the last segment's values give). Returns warning events."""
        task = self.task
        if self._probe is not None or not self._resume_due():
            return []
        following = next((s for s in task.segments if s.start <= n < s.end), segment)
        values = config_values(following.config, n)
        try:
            outcome = self._resumed_step(load, values)
        except _NoRoomError as error:
            return [self._skipped(f"a second trainer did not fit in memory ({error})")]
        if outcome is not None:
            self._probe = _Probe(n, values, load, outcome)
        return []

    def _resume_due(self) -> bool:
        """Whether this worker's resume checks of the model are due."""
        return self.resume_checks.due(self.task.trainer.identity, self.task.check_resume)

    def _resumed_step(self, load: Callable[[], Any], values: dict) -> StepOutcome | None:
        """A fresh trainer, loaded from the checkpoint `load` reads, trains one step with
        `values`: its outcome (None if the checkpoint can't be read back). Nothing global
        changes: the random generators are put back."""
        spec = self.task.trainer
        try:
            trainer_state, rng_state, _ = checkpoint_parts(load())
        except CheckpointError:
            return None
        with isolated_rng():
            try:
                fresh = build_trainer(spec.cls, spec.kwargs, spec.seed)
                load_state(fresh, trainer_state)
                restore_rng(rng_state)
                changed = resumed_setup(fresh, SetupValues(values))
                outcome = trainer_outcome(fresh, to_metrics(fresh.train(), "Trainer.train()"))
                return dataclasses.replace(outcome, setup_changed=changed)
            except LoadStateError:  # every resume of this trainer would fail: not a difference
                raise
            except Exception as error:  # the resumed trainer's failure is what it computed
                if out_of_memory(error):
                    raise _NoRoomError(f"{type(error).__name__}: {error}") from error
                return failed_outcome(error)

    def _compare(self, trainer: Trainer, live: StepOutcome, past_end: bool = False) -> list[TaskEvent]:
        """Compare the step this trainer just trained after the probed checkpoint with the
        fresh trainer's (`past_end`: a step past the path's end, trained for the check): a
        pass is counted; a difference raises `ResumeChangedTrainingError`, unless a second
        fresh trainer differs from the first too (training is not deterministic: a warning
        event, nothing counted)."""
        probe, self._probe = self._probe, None
        identity, limit = self.task.trainer.identity, self.task.check_resume
        keys = differences(live, probe.outcome)
        if not keys:
            self.resume_checks.passed(identity)
            return []
        try:
            again = self._resumed_step(probe.load, probe.values)
        except _NoRoomError:
            again = None
        if again is not None and differences(again, probe.outcome):
            return [self._nondeterministic(probe.step, keys)]
        saved = checkpoint_parts(probe.load())[0]
        # a default setup() applied instead of the config's value is named too: its warning
        # goes with the step's events, which this error fails
        causes = likely_causes(
            vars(trainer), saved, keys, probe.outcome.setup_changed, self._defaulted_messages
        )
        raise ResumeChangedTrainingError(probe.step, keys, causes, limit, past_end)

    def _check_at_the_end(self, trainer: Trainer, values: dict) -> list[TaskEvent]:
        """The path ends at the probed checkpoint (`values`: the last step's): this trainer
        trains the probed step too (it is not kept live afterwards: a later stage loads the
        checkpoint), and the two are compared. Its random draws are isolated; a failure of
        that step is only compared. At the path's own end this runs before the last step is
        reported, so that a failure fails the trials ending there."""
        probe = self._probe
        changes = {k: v for k, v in probe.values.items() if not same_value(v, values.get(k, _MISSING))}
        with isolated_rng():
            try:
                if changes:
                    trainer.setup(SetupValues(changes, probe.values, probe.step))
                live = trainer_outcome(trainer, to_metrics(trainer.train(), "Trainer.train()"))
            except Exception as error:
                if out_of_memory(error):
                    self._probe = None
                    return [self._skipped(f"the step after the path's end ran out of memory ({error})")]
                live = failed_outcome(error)
        return self._compare(trainer, live, past_end=True)

    def _nondeterministic(self, step: int, keys: list[str]) -> TrainerWarned:
        cls = self.task.trainer.cls
        message = (
            f"{getattr(cls, '__qualname__', cls)}: the same step trained twice from the checkpoint at "
            f"step {step} gave different states ({', '.join(keys[:3])}): training is not deterministic "
            "(e.g. GPU kernels that add in any order), so results are not bit for bit those of "
            "run_alone, and the resume check cannot tell a resume bug from this noise."
        )
        return self.path.warned(
            self.task.node_at(step) if step > self.task.start else self.task.segments[0].node,
            step,
            warning_event(
                NondeterministicTrainingWarning, message, f"nondeterministic {self.task.trainer.identity}"
            ),
        )

    def _skipped(self, why: str) -> TrainerWarned:
        cls = self.task.trainer.cls
        message = f"{getattr(cls, '__qualname__', cls)}: the resume check was skipped: {why}; check_resume=0 turns it off."
        return self.path.warned(
            self.task.segments[0].node,
            self.path.position,
            warning_event(ResumeCheckSkippedWarning, message, f"skipped {self.task.trainer.identity}"),
        )

    def error_events(self, error: BaseException) -> list[TaskFailed]:
        """The `TaskFailed` of its task when `error` stopped it (`MemberPath.failed`)."""
        return [self.path.failed(error)]

    def timeout_events(self, seconds: float, stack: str = "") -> list[TaskFailed]:
        """The `TaskFailed` of its step given up after `seconds` (`MemberPath.timed_out`)."""
        return [self.path.timed_out(seconds, stack)]

    def run(self, on_events: Callable[[list[TaskEvent]], None] | None = None) -> list[TaskEvent]:
        """Run to the end (`run_to_end`)."""
        return run_to_end(self, on_events)


_MISSING = object()


@dataclass
class _Probe:
    """A fresh trainer's step `step` from the checkpoint at `step` (`load` reads it), trained
    with `values`: what the trainer that saved it must match at its own step `step`."""

    step: int
    values: dict
    load: Callable[[], Any]
    outcome: StepOutcome


class _NoRoomError(DagtuneError):
    """A second trainer did not fit in memory: the resume check is skipped."""


def _in_memory(data: bytes) -> dict:
    """A checkpoint state read back from `serialize_state`'s bytes, as a store reads it."""
    return torch.load(io.BytesIO(data), weights_only=True)


def _qualname(cls: Any) -> str:
    """A trainer class's name as its warnings give it."""
    return getattr(cls, "__qualname__", repr(cls))
