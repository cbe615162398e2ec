"""Running K path tasks as fused groups, with each task's own `PathRunner` event stream.

`FusedPathRunner` takes path tasks that `can_fuse` pairwise and trains them lock-stepped: one
fused step per round for all members still training. For each task it produces exactly the
events a `PathRunner` would (`dagtune.events`, under the task's key: each task is a
`dagtune.runner.MemberPath`, which makes them for both), takes directives per
task (extra checkpoints, ``stop_at``, ``pause_at``), saves each task's checkpoints in the
unfused `FusibleTrainer` format at its own steps, and lets a member leave at its own end,
stop or pause at a step boundary while the others go on (the group is compacted).

Members are grouped into *cohorts* when their states are loaded: members at the same step
with the same RNG state and data order train as one `FusedGroup`. Tasks from one checkpoint
or from scratch always form one cohort; members whose resumed states differ there (a rerun
resuming each member from its own latest checkpoint, siblings whose RNG states diverged)
train as separate cohorts, each with its RNG state swapped in for its turn, so each stays
exactly what it would be alone.

Differences from `PathRunner`, by design: a step event's ``seconds`` is the member's share of
its cohort's fused step time (the members' shares add up to the time spent), and a fused
task leaves no live trainer behind (its members continue from their checkpoints).

A task with a ``fusion_check`` first checks its trainer (`check_fusion`, on a throwaway
trainer) and reports the verdict as a `FusionChecked` (``ok``, ``reason``) under its key.
When the trainer cannot fuse, or a fused step later fails with an error of vmap itself (an
operation it cannot batch) or a `FusionError` (what a group cannot do per member, e.g. a
`before_step` reading the optimizer's state), every member still training ends with reason ``"unfused"`` at
the point it reached (its checkpoints are kept) after that `FusionChecked`: the coordinator
then trains it unfused.
"""

from __future__ import annotations

import copy
import functools
import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from dagtune.checkpoints import CheckpointError
from dagtune.config import config_values
from dagtune.errors import DagtuneError
from dagtune.evalcheck import EvaluateChecks, training_state
from dagtune.events import FusionChecked, TaskEvent, TaskFailed
from dagtune.fusion._check import FUSION_CHECKS, FusionVerdict, check_fusion, error_text
from dagtune.fusion._group import FusedGroup, FusionError
from dagtune.fusion._grouping import fusion_conflict
from dagtune.fusion._state import same_state
from dagtune.fusion._trace import describe_module, module_of_error
from dagtune.fusion._trainer import FusibleTrainer
from dagtune.notices import NondeterministicTrainingWarning, ResumeCheckSkippedWarning, warning_event
from dagtune.resumecheck import (
    ResumeChangedTrainingError,
    ResumeChecks,
    StepOutcome,
    differences,
    failed_outcome,
    likely_causes,
    out_of_memory,
    step_outcome,
)
from dagtune.runner import (
    CheckpointBackend,
    CorruptPointError,
    LiveTrainers,
    MemberPath,
    run_to_end,
    to_metrics,
)
from dagtune.tasks import Directive, PathTask, Segment
from dagtune.trainer import (
    build_trainer,
    capture_rng,
    isolated_rng,
    kept_training_modes,
    restore_rng,
    torch_threads,
)

__all__ = ["FusedPathRunner"]


#: in the message of an error vmap raises for what it cannot batch
VMAP_ERROR_MARKERS = ("vmap", "functorch", "Batching rule", "BatchedTensor")


class _UnfusibleError(DagtuneError):
    """A fused step failed with an error of vmap itself or a `FusionError`: the trainer cannot
    train fused. The
    message names the innermost module of `model` that was running, as the check's does."""

    def __init__(self, error: BaseException, model: torch.nn.Module):
        where = module_of_error(model, error)
        place = f"in {describe_module(model, where)}: " if where is not None else ""
        super().__init__(f"{place}{error_text(error)}")


class _NoRoomError(DagtuneError):
    """A second trainer did not fit in memory: the resume check is skipped."""


class _NoCopyError(DagtuneError):
    """The live host could not be copied: the resume check is skipped."""


def _live_copy(host: FusibleTrainer) -> FusibleTrainer:
    """A copy of `host` to train a step on: everything copied but the tensors it holds in
    attributes (its data, which no step changes)."""
    shared = {id(value): value for value in vars(host).values() if isinstance(value, torch.Tensor)}
    try:
        return copy.deepcopy(host, shared)
    except Exception as error:  # something in it can't be copied (a file, a process pool)
        raise _NoCopyError(f"the trainer could not be copied ({type(error).__name__}: {error})") from error


def _host_attributes(host: FusibleTrainer) -> dict[str, Any]:
    """A host's attributes but its model and optimizer (a template and a bystander: a
    member's are in its state): its data order and anything else the trainer keeps."""
    return {name: value for name, value in vars(host).items() if name not in ("model", "optimizer")}


def _skipped(task: PathTask, why: str) -> dict:
    message = (
        f"{task.trainer.cls.__qualname__}: the resume check was skipped: {why}; check_resume=0 turns it off."
    )
    return warning_event(ResumeCheckSkippedWarning, message, f"skipped {task.trainer.identity}")


@dataclass
class _Loaded:
    member: MemberPath
    state: dict  # the unfused trainer state
    rng: dict
    position: int


@dataclass
class _Cohort:
    members: list[MemberPath]
    group: FusedGroup
    rng: dict
    restore: bool = True  # the global RNG must be set to `rng` before its next step


class FusedPathRunner:
    """Trains `tasks` (pairwise `can_fuse`) as fused groups, one step per round.

    Iterate `steps()`: each item is the list of events of one round, for every task that
    produced any (the first round also carries the `TaskStarted` and `StateLoaded` events).
    `update` applies a task's directive between rounds; `run` runs to the end. Each task's
    position, directive and events are its `MemberPath` in `members`, as `PathRunner`'s.
    `clock`, `step_seconds` (here: each member's share of a round) and `started` are
    `PathRunner`'s.
    """

    def __init__(
        self,
        tasks: Sequence[PathTask],
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
        tasks = list(tasks)
        if not tasks:
            raise ValueError("a fused run needs at least one task")
        cls = tasks[0].trainer.cls
        if not (isinstance(cls, type) and issubclass(cls, FusibleTrainer)):
            raise FusionError(f"{getattr(cls, '__qualname__', cls)!r} is not a FusibleTrainer")
        for i, a in enumerate(tasks):
            for b in tasks[i + 1 :]:
                reason = fusion_conflict(a, b)
                if reason is not None:
                    raise FusionError(f"tasks {a.key!r} and {b.key!r} cannot be fused: {reason}")
        self.store = store
        self.live = live
        self.clock = clock
        self.step_seconds = step_seconds
        self.checks = checks if checks is not None else EvaluateChecks()  # the worker's, if it keeps one
        self.resume_checks = resume_checks if resume_checks is not None else ResumeChecks()
        self.members = {task.key: MemberPath(task, worker, wallclock, started, clock) for task in tasks}
        self.cohorts: list[_Cohort] = []
        wanted = [task.fusion_check for task in tasks if task.fusion_check is not None]
        for check in wanted:
            if check not in FUSION_CHECKS:
                raise ValueError(f"fusion_check must be None or one of {list(FUSION_CHECKS)}, got {check!r}")
        self.fusion_check = max(wanted, key=FUSION_CHECKS.index) if wanted else None  # the fullest asked

    # ------------------------------------------------------------------ directives

    def update(self, key: str, directive: Directive) -> list[TaskEvent]:
        """Take task `key`'s new directive (`MemberPath.update`)."""
        return self.members[key].update(directive)

    def halt(self, key: str | None = None) -> None:
        """Train no further step of task `key` (of every task when None)."""
        for member in self.members.values() if key is None else [self.members[key]]:
            member.halted = True

    # ------------------------------------------------------------------ acquiring the states

    def _load(self, member: MemberPath, host_state: dict, host_rng: dict) -> tuple[_Loaded, list[TaskEvent]]:
        point, found = member.resume_point(self.store)
        if point is None:
            member.position = 0
            return _Loaded(member, host_state, host_rng, 0), []
        node, step = point
        member.position = step
        trainer, state, rng, carried, origin = member.read_point(self.store, self.live, node, step)
        loaded = _Loaded(member, trainer.state_dict() if trainer is not None else state, rng, step)
        return loaded, member.resumed(node, step, origin, found, carried)

    def _acquire(self) -> list[TaskEvent]:
        """Load every member's state and form the cohorts; the first round's events."""
        spec = next(iter(self.members.values())).task.trainer
        fresh_host = build_trainer(spec.cls, spec.kwargs, spec.seed)
        fresh_state, fresh_rng = fresh_host.state_dict(), capture_rng()
        events: list[TaskEvent] = []
        loaded: list[_Loaded] = []
        for member in self.members.values():
            try:
                entry, loads = self._load(member, fresh_state, fresh_rng)
            except CorruptPointError as corrupt:
                events.append(member.corrupt(corrupt))
                continue
            events.extend([member.started(), *loads])
            loaded.append(entry)
        cohorts: list[list[_Loaded]] = []
        for entry in loaded:
            for cohort in cohorts:
                first = cohort[0]
                if (
                    entry.position == first.position
                    and same_state(entry.rng, first.rng)
                    and same_state(entry.state["batches"], first.state["batches"])
                ):
                    cohort.append(entry)
                    break
            else:
                cohorts.append([entry])
        # the fresh host serves the fresh cohort, or the first one; every other cohort gets its
        # own host (a host holds its cohort's data order and non-fusible hyper-parameters)
        fresh_first = sorted(cohorts, key=lambda cohort: cohort[0].state is not fresh_state)
        for cohort in cohorts:
            host = fresh_host if cohort is fresh_first[0] else build_trainer(spec.cls, spec.kwargs, spec.seed)
            group = FusedGroup.from_states(host, [entry.state for entry in cohort])
            self.cohorts.append(_Cohort([entry.member for entry in cohort], group, cohort[0].rng))
        return events

    # ------------------------------------------------------------------ the loop

    def steps(self) -> Iterator[list[TaskEvent]]:
        """The events of each round. The trainers' code runs with torch's thread count set to
        the tasks' ``torch_threads``; the caller's count is back between rounds."""
        inner = self._rounds()
        threads = next(iter(self.members.values())).task.torch_threads
        while True:
            with torch_threads(threads):
                events = next(inner, None)
            if events is None:
                return
            yield events

    def _rounds(self) -> Iterator[list[TaskEvent]]:
        events = []
        if self.fusion_check is not None:
            verdict = self._check()
            events.append(self._fusion_event(verdict.ok, verdict.reason))
            if not verdict.ok:
                yield [*events, *self._end_unfused(started=False)]
                return
        events.extend(self._acquire())
        for member in self.members.values():
            member.training()
        several = len(self.cohorts) > 1
        while True:
            trained = False
            try:
                for cohort in self.cohorts:
                    trained |= self._round(cohort, several, events)
            except _UnfusibleError as unfusible:
                failed = self._fusion_event(False, f"a fused step failed: {unfusible}")
                yield [*events, failed, *self._end_unfused(started=True)]
                return
            if events:
                yield events
            if not trained:
                return
            events = []

    def _check(self) -> FusionVerdict:
        """`check_fusion` of the trainer, trained with the first task's starting values."""
        task = next(iter(self.members.values())).task
        spec, values = task.trainer, config_values(task.segments[0].config, task.start)
        return check_fusion(
            spec.cls, spec.kwargs, spec.seed, values, agreement=self.fusion_check == "agreement"
        )

    def _fusion_event(self, ok: bool, reason: str) -> FusionChecked:
        """The `FusionChecked` (under the first task's key) of a verdict."""
        first = next(iter(self.members.values()))
        node = first.task.segments[0].node
        return FusionChecked(
            first.task.key, first.attempt, node, first.position, first.worker, first.wallclock(), ok, reason
        )

    def _end_unfused(self, started: bool) -> list[TaskEvent]:
        """Every member still training ends where it is, with reason ``"unfused"`` (after a
        `TaskStarted` when it had not started)."""
        events: list[TaskEvent] = []
        for member in self.members.values():
            if member.done:
                continue
            if not started:
                events.append(member.started())
            events.append(member.ended("unfused"))
        return events

    def _round(self, cohort: _Cohort, several: bool, events: list[TaskEvent]) -> bool:
        """One step of `cohort` (after its leaving members' `TaskEnded`); whether it trained."""
        plan = [(k, member, member.next_step()) for k, member in enumerate(cohort.members)]
        staying = [(k, member, step) for k, member, step in plan if step is not None]
        for _, member, step in plan:
            if step is None:
                events.append(member.ended())
        if not staying:
            cohort.members = []
            return False
        if len(staying) < len(cohort.members):
            cohort.group.keep([k for k, _, _ in staying])
            cohort.members = [member for _, member, _ in staying]
        if cohort.restore or several:
            restore_rng(cohort.rng)
            cohort.restore = False
        group = cohort.group
        for _, member, (_, t) in staying:
            member.current = t
        group.setup([member.changes(*step) for _, member, step in staying])
        began = self.clock()
        try:
            metrics = group.train()
        except Exception as error:
            if isinstance(error, FusionError) or any(marker in str(error) for marker in VMAP_ERROR_MARKERS):
                raise _UnfusibleError(error, group.host.model) from error
            raise
        if self.step_seconds is not None:  # the executor says each member's share
            seconds = self.step_seconds()
        else:
            seconds = (self.clock() - began) / len(staying)
        for k, (_, member, (segment, t)) in enumerate(staying):
            events.extend(self._after_step(member, group, k, segment, t, metrics[k], seconds))
        if several:
            cohort.rng = capture_rng()
        return True

    def _after_step(
        self,
        member: MemberPath,
        group: FusedGroup,
        k: int,
        segment: Segment,
        t: int,
        raw: Any,
        seconds: float,
    ) -> list[TaskEvent]:
        """A member's events for step `t`, exactly as `PathRunner` makes them."""
        task = member.task
        train_metrics = to_metrics(raw, "Trainer.train()")
        member.position = n = t + 1
        member.executed += 1
        events: list[TaskEvent] = []
        wanted = n in task.checkpoints or n in member.directive.checkpoints
        last = n == task.end or n == member.directive.stop_at
        diverging = not all(math.isfinite(v) for v in train_metrics.values())
        if wanted or last or diverging or n % task.eval_every == 0:
            metrics = {**train_metrics, **self._evaluate(member, group, k)}
            member.carried.append((segment.node, n, metrics))
            events.append(member.metrics(segment.node, n, metrics))
        if wanted and self.store is not None:
            state, saved = member.save(self.store, segment.node, n, group.state_dict(k))
            events.append(saved)
            events.extend(self._check_resume(member, group, state, segment, n))
        elif self.store is not None and member.interval_due(last):  # unplanned, as `PathRunner`'s
            events.append(member.save(self.store, segment.node, n, group.state_dict(k))[1])
        events.append(member.stepped(segment.node, n, seconds, train_metrics))
        return events

    # ------------------------------------------------------------------ the resume check

    def _check_resume(
        self, member: MemberPath, group: FusedGroup, saved: dict, segment: Segment, n: int
    ) -> list[TaskEvent]:
        """At a member's checkpoint at step `n` (`saved`: what was saved there), while this worker's resume checks of the
        model are due: the next step (its path's, or at its end its last segment's) trained
        as a group of one twice, once on a copy of the live host (the trainer object holding
        the cohort's data order and anything else the trainer keeps) with the member's state,
        once on a fresh host loaded from the checkpoint, must agree (`dagtune.resumecheck`).
        A group of one trains bit for bit what the member trains in any group, so this
        checks what a fused task keeps outside the saved state. Both run before the step is
        reported, inside `isolated_rng`; the group itself is untouched."""
        task = member.task
        identity = task.trainer.identity
        if not self.resume_checks.due(identity, task.check_resume):
            return []
        following = next((s for s in task.segments if s.start <= n < s.end), segment)
        values = config_values(following.config, n)
        load = functools.partial(self.store.load, identity, segment.node, n)
        try:
            live = self._step_alone(
                task, lambda: _live_copy(group.host), saved["trainer"], saved["rng"], values
            )
            resumed = self._resumed_step(task, load, values)
        except (_NoRoomError, _NoCopyError) as error:
            return [member.warned(segment.node, n, _skipped(task, str(error)))]
        if resumed is None:
            return []
        keys = differences(live, resumed)
        if not keys:
            self.resume_checks.passed(identity)
            return []
        again = self._resumed_step(task, load, values)
        if again is not None and differences(again, resumed):
            message = (
                f"{task.trainer.cls.__qualname__}: the same step trained twice from the checkpoint at step "
                f"{n} gave different states ({', '.join(keys[:3])}): training is not deterministic, "
                "so results are not bit for bit those of run_alone, and the resume check cannot tell a "
                "resume bug from this noise."
            )
            fields = warning_event(NondeterministicTrainingWarning, message, f"nondeterministic {identity}")
            return [member.warned(segment.node, n, fields)]
        causes = likely_causes(_host_attributes(group.host), load()["trainer"], keys)
        raise ResumeChangedTrainingError(n, keys, causes, task.check_resume, past_end=n >= task.end)

    def _resumed_step(self, task: PathTask, load: Callable[[], Any], values: dict) -> StepOutcome | None:
        """A fresh host loaded from the checkpoint `load` reads trains the step (None if the
        checkpoint can't be read back)."""
        spec = task.trainer
        try:
            saved = load()
        except CheckpointError:
            return None
        return self._step_alone(
            task,
            lambda: build_trainer(spec.cls, spec.kwargs, spec.seed),
            saved["trainer"],
            saved["rng"],
            values,
        )

    def _step_alone(
        self, task: PathTask, host: Callable[[], FusibleTrainer], state: dict, rng: dict, values: dict
    ) -> StepOutcome:
        """The outcome of one step of a group of one on the host `host` makes, from `state`
        and the global generators at `rng` (put back afterwards)."""
        with isolated_rng():
            try:
                alone = FusedGroup.from_states(host(), [state])
                restore_rng(rng)
                alone.setup([dict(values)])
                metrics = to_metrics(alone.train()[0], "Trainer.train()")
                return step_outcome(alone.state_dict(0), _host_attributes(alone.host), metrics)
            except _NoCopyError:
                raise
            except Exception as error:  # a failure is what the step computed
                if out_of_memory(error):
                    raise _NoRoomError(
                        f"a second trainer did not fit in memory ({type(error).__name__}: {error})"
                    ) from error
                return failed_outcome(error)

    def _evaluate(self, member: MemberPath, group: FusedGroup, k: int) -> dict[str, float]:
        """Member `k`'s validation metrics, as `PathRunner` evaluates: random draws isolated
        from training, the host's modules' training modes put back after, and while the worker's checks are due, the training state of the host
        (holding the member's weights, the group's data order) compared before and after."""
        identity, limit = member.task.trainer.identity, member.task.check_evaluate
        member.evaluating = True
        group.select(k)
        before = training_state(group.host) if self.checks.due(identity, limit) else None
        with isolated_rng(), kept_training_modes(group.host):
            metrics = to_metrics(group.host.evaluate(), "Trainer.evaluate()")
        if before is not None:
            self.checks.verify(identity, limit, before, training_state(group.host))
        member.evaluating = False
        return metrics

    def timeout_events(self, seconds: float, stack: str = "") -> list[TaskFailed]:
        """The `TaskFailed` of the round given up after `seconds`, one for every task still
        training (`MemberPath.timed_out`)."""
        return [member.timed_out(seconds, stack) for member in self.members.values() if not member.done]

    def error_events(self, error: BaseException) -> list[TaskFailed]:
        """A `TaskFailed` for every task still training when `error` stopped the run."""
        return [member.failed(error) for member in self.members.values() if not member.done]

    def run(self, on_events: Callable[[list[TaskEvent]], None] | None = None) -> list[TaskEvent]:
        """Run to the end (`dagtune.runner.run_to_end`)."""
        return run_to_end(self, on_events)
