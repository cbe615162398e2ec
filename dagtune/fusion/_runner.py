"""Running K path tasks as fused groups, with each task's own `PathRunner` event stream.

`FusedPathRunner` takes path tasks that `can_fuse` pairwise and trains them lock-stepped: one
fused step per round for all members still training. For each task it produces exactly the
events a `PathRunner` would (``start``, ``load``, ``metrics``, ``checkpoint``, ``step``,
``end``, ``declined``, ``corrupt``, ``error``, under the task's key), takes directives per
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
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from dagtune.checkpoints import CheckpointError
from dagtune.config import config_values
from dagtune.evalcheck import EvaluateChecks, training_state
from dagtune.fusion._group import FusedGroup, FusionError
from dagtune.fusion._grouping import fusion_conflict
from dagtune.fusion._state import same_state
from dagtune.fusion._trainer import FusibleTrainer
from dagtune.records import CheckpointInfo
from dagtune.runner import (
    Carried,
    CheckpointBackend,
    LiveTrainers,
    checkpoint_parts,
    checkpoint_state,
    failure_fields,
    through_storage,
    timeout_fields,
    to_metrics,
)
from dagtune.sequences import same_value
from dagtune.tasks import Directive, PathTask, Segment
from dagtune.trainer import build_trainer, capture_rng, isolated_rng, restore_rng

__all__ = ["FusedPathRunner", "MemberPath"]


class _CorruptError(Exception):
    """The checkpoint at ``(node, step)`` failed verification."""

    def __init__(self, node: str, step: int, error: CheckpointError):
        super().__init__(str(error))
        self.node, self.step = node, step


class MemberPath:
    """One task of a fused run: its position, directive and event construction, as a
    `PathRunner` keeps them for its single task."""

    def __init__(self, task: PathTask, worker: str, wallclock: Callable[[], float]):
        self.task = task
        self.worker = worker
        self.wallclock = wallclock
        self.attempt = uuid.uuid4().hex[:12]
        self.directive = Directive()
        self.position = task.start
        self.executed = 0
        self.halted = False
        self.done = False
        self.evaluating = False  # evaluating step `position` (an error there is that step's)
        self.values: dict[str, Any] | None = None
        self.carried: Carried = []  # what its next checkpoint carries (`dagtune.runner`)
        self.current: int | None = None  # the step being trained (None: loading its state)

    def event(self, kind: str, node: str | None, step: int, **fields: Any) -> dict:
        return {
            "kind": kind,
            "task": self.task.key,
            "attempt": self.attempt,
            "node": node,
            "step": step,
            **fields,
        }

    def update(self, directive: Directive) -> list[dict]:
        passed = sorted(s for s in directive.checkpoints - self.directive.checkpoints if s <= self.position)
        self.directive = directive
        return [self.event("declined", self.task.node_at(s), s) for s in passed if s > self.task.start]

    @property
    def paused(self) -> bool:
        """At the boundary the coordinator asked to pause at (its checkpoint is saved)."""
        return self.position == self.directive.pause_at and self.task.start < self.position < self.task.end

    def next_step(self) -> tuple[Segment, int] | None:
        """The (segment, step) to train next, or None where this task stops now."""
        for segment in self.task.segments:
            for t in range(max(segment.start, self.position), segment.end):
                if self.directive.stop_at is not None and self.position >= self.directive.stop_at:
                    return None
                if self.paused or self.halted:
                    return None
                return segment, t
        return None

    def changes(self, segment: Segment, t: int) -> dict[str, Any]:
        """The values `setup` gets before step `t`: all of them first, then the changed ones."""
        now = config_values(segment.config, t)
        if self.values is None:
            changes = dict(now)
        else:
            changes = {
                k: v for k, v in now.items() if k not in self.values or not same_value(v, self.values[k])
            }
        self.values = now
        return changes

    def resume_point(
        self, store: CheckpointBackend | None
    ) -> tuple[tuple[str, int] | None, CheckpointInfo | None]:
        """The latest committed checkpoint of this path with its commit info, else the task's
        source (None: the coordinator knows it)."""
        if store is not None:
            for step in sorted(self.task.checkpoints, reverse=True):
                if self.task.start < step < self.task.end:
                    node = self.task.node_at(step)
                    try:
                        committed = through_storage(store.info, self.task.trainer.identity, node, step)
                    except CheckpointError as error:
                        raise _CorruptError(node, step, error) from error
                    if committed is not None:
                        return (node, step), committed
        return self.task.source, None

    def owner(self, step: int) -> str | None:
        if step > self.task.start:
            return self.task.node_at(step)
        return self.task.source[0] if self.task.source is not None else None

    def end_event(self) -> dict:
        reason = "done" if self.position >= self.task.end else "stopped"
        return self.event(
            "end",
            self.owner(self.position),
            self.position,
            worker=self.worker,
            reason=reason,
            time=self.wallclock(),
        )

    def timeout_event(self, seconds: float, stack: str) -> dict:
        """The ``error`` event of its step given up after `seconds` (`PathRunner.timeout_event`)."""
        step = self.position if self.current is None else self.current
        point = min(step + 1, self.task.end)
        return self.event(
            "error",
            self.task.node_at(point),
            point,
            worker=self.worker,
            time=self.wallclock(),
            **timeout_fields(step, seconds, stack),
        )

    def error_event(self, error: BaseException) -> dict:
        step = self.position if self.evaluating else min(self.position + 1, self.task.end)
        return self.event(
            "error",
            self.task.node_at(step),
            step,
            worker=self.worker,
            time=self.wallclock(),
            **failure_fields(error),
        )


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
    produced any (the first round also carries the ``start`` and ``load`` events). `update`
    applies a task's directive between rounds; `run` runs to the end.
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
        self.checks = checks if checks is not None else EvaluateChecks()  # the worker's, if it keeps one
        self.members = {task.key: MemberPath(task, worker, wallclock) for task in tasks}
        self.cohorts: list[_Cohort] = []

    # ------------------------------------------------------------------ directives

    def update(self, key: str, directive: Directive) -> list[dict]:
        """Take task `key`'s new directive; returns ``declined`` events for wanted checkpoints
        it has already passed."""
        return self.members[key].update(directive)

    def halt(self, key: str | None = None) -> None:
        """Train no further step of task `key` (of every task when None)."""
        for member in self.members.values() if key is None else [self.members[key]]:
            member.halted = True

    # ------------------------------------------------------------------ acquiring the states

    def _load(self, member: MemberPath, host_state: dict, host_rng: dict) -> tuple[_Loaded, list[dict]]:
        task = member.task
        point, found = member.resume_point(self.store)
        if point is None:
            member.position = 0
            return _Loaded(member, host_state, host_rng, 0), []
        node, step = point
        member.position = step
        identity = task.trainer.identity
        live = None if self.live is None else self.live.take(identity, node, step)
        if live is not None:
            loaded = _Loaded(member, live.trainer.state_dict(), live.rng, step)
            carried, origin = live.carried, "memory"
        elif self.store is None:
            raise RuntimeError(f"task {task.key} resumes from {point} but has no checkpoint store")
        else:
            try:
                trainer_state, rng_state, carried = checkpoint_parts(
                    through_storage(self.store.load, identity, node, step)
                )
            except CheckpointError as error:
                raise _CorruptError(node, step, error) from error
            loaded, origin = _Loaded(member, trainer_state, rng_state, step), "storage"
        events = [member.event("load", node, step, origin=origin)]
        if found is not None:  # a checkpoint the coordinator may not know: what it covers first
            member.carried = list(carried)
            events.extend(member.event("metrics", n, t, metrics=m) for n, t, m in carried)
            events.append(member.event("checkpoint", node, step, nbytes=found.nbytes, sha256=found.sha256))
        return loaded, events

    def _acquire(self) -> list[dict]:
        """Load every member's state and form the cohorts; the first round's events."""
        spec = next(iter(self.members.values())).task.trainer
        fresh_host = build_trainer(spec.cls, spec.kwargs, spec.seed)
        fresh_state, fresh_rng = fresh_host.state_dict(), capture_rng()
        events: list[dict] = []
        loaded: list[_Loaded] = []
        for member in self.members.values():
            try:
                entry, loads = self._load(member, fresh_state, fresh_rng)
            except _CorruptError as corrupt:
                member.done = True
                fields = {"worker": member.worker, "time": member.wallclock(), "error": str(corrupt)}
                events.append(member.event("corrupt", corrupt.node, corrupt.step, **fields))
                continue
            start = member.event(
                "start",
                member.task.segments[0].node,
                member.position,
                worker=member.worker,
                time=member.wallclock(),
            )
            events.extend([start, *loads])
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

    def steps(self) -> Iterator[list[dict]]:
        events = self._acquire()
        several = len(self.cohorts) > 1
        while True:
            trained = False
            for cohort in self.cohorts:
                trained |= self._round(cohort, several, events)
            if events:
                yield events
            if not trained:
                return
            events = []

    def _round(self, cohort: _Cohort, several: bool, events: list[dict]) -> bool:
        """One step of `cohort` (after its leaving members' ``end`` events); whether it trained."""
        plan = [(k, member, member.next_step()) for k, member in enumerate(cohort.members)]
        staying = [(k, member, step) for k, member, step in plan if step is not None]
        for _, member, step in plan:
            if step is None:
                member.done = True
                events.append(member.end_event())
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
        metrics = group.train()
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
    ) -> list[dict]:
        """A member's events for step `t`, exactly as `PathRunner` makes them."""
        task = member.task
        train_metrics = to_metrics(raw, "Trainer.train()")
        member.position = n = t + 1
        member.executed += 1
        events = []
        wanted = n in task.checkpoints or n in member.directive.checkpoints
        last = n == task.end or n == member.directive.stop_at
        diverging = not all(math.isfinite(v) for v in train_metrics.values())
        if wanted or last or diverging or n % task.eval_every == 0:
            metrics = {**train_metrics, **self._evaluate(member, group, k)}
            member.carried.append((segment.node, n, metrics))
            events.append(member.event("metrics", segment.node, n, metrics=metrics))
        if wanted and self.store is not None:
            state = checkpoint_state(group.state_dict(k), member.carried)
            info = through_storage(self.store.save, task.trainer.identity, segment.node, n, state)
            events.append(member.event("checkpoint", segment.node, n, nbytes=info.nbytes, sha256=info.sha256))
        events.append(member.event("step", segment.node, n, seconds=seconds, train=train_metrics))
        return events

    def _evaluate(self, member: MemberPath, group: FusedGroup, k: int) -> dict[str, float]:
        """Member `k`'s validation metrics, as `PathRunner` evaluates: random draws isolated
        from training, and while the worker's checks are due, the training state of the host
        (holding the member's weights, the group's data order) compared before and after."""
        identity, limit = member.task.trainer.identity, member.task.check_evaluate
        member.evaluating = True
        group.select(k)
        before = training_state(group.host) if self.checks.due(identity, limit) else None
        with isolated_rng():
            metrics = to_metrics(group.host.evaluate(), "Trainer.evaluate()")
        if before is not None:
            self.checks.verify(identity, limit, before, training_state(group.host))
        member.evaluating = False
        return metrics

    def timeout_events(self, seconds: float, stack: str = "") -> list[dict]:
        """The ``error`` events of the round given up after `seconds`, one for every task
        still training (`PathRunner.timeout_event`)."""
        return [member.timeout_event(seconds, stack) for member in self.members.values() if not member.done]

    def error_events(self, error: BaseException) -> list[dict]:
        """An ``error`` event for every task still training when `error` stopped the run."""
        return [member.error_event(error) for member in self.members.values() if not member.done]

    def run(self, on_events: Callable[[list[dict]], None] | None = None) -> list[dict]:
        """Run to the end; returns every event (a failure becomes ``error`` events)."""
        everything: list[dict] = []
        try:
            for events in self.steps():
                everything.extend(events)
                if on_events is not None:
                    on_events(events)
        except Exception as error:  # a trainer's failure is reported, not raised
            events = self.error_events(error)
            for member in self.members.values():
                member.done = True
            everything.extend(events)
            if on_events is not None:
                on_events(events)
        return everything
