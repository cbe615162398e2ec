"""What a Dask task of the executor runs on its worker: a path task (`run_path`) or a fused
group (`run_group`), streaming each step's events as one ``log_event`` message (the last
step's with the task's end: `_Relay`; packed into one ``bytes``: `_wire`), reading the
directives between steps from a `distributed.Variable`, and watching each step against the
study's ``step_timeout`` (`_StepWatch`). A worker process keeps, per worker, the trainer it
ran last and its evaluate and resume checks, so the next task there may continue in memory.
"""

from __future__ import annotations

import sys
import threading
import traceback
from collections.abc import Callable
from typing import Any

from distributed import Variable, Worker, get_worker

from dagtune.evalcheck import EvaluateChecks
from dagtune.events import TaskEvent, TaskFailed
from dagtune.execution._private_random import private_random_for_dask
from dagtune.execution._wire import pack
from dagtune.execution._worker_store import StoreRef, store_on
from dagtune.fusion import FusedPathRunner
from dagtune.resumecheck import ResumeChecks
from dagtune.runner import LiveTrainers, MemberPath, PathRunner
from dagtune.tasks import Directive, PathTask

__all__ = ["run_group", "run_path"]

_LIVE: dict[str, LiveTrainers] = {}  # worker address -> the trainer it ran last (per process)
_CHECKS: dict[str, EvaluateChecks] = {}  # worker address -> its clean evaluate checks
_RESUME_CHECKS: dict[str, ResumeChecks] = {}  # worker address -> its passed resume checks
_LIVE_LOCK = threading.Lock()


def run_path(task: PathTask, store: StoreRef | None, directives: str) -> list[TaskEvent]:
    """The Dask task: train `task` on this worker (checkpoints in the store `store` names),
    streaming events and obeying directives."""
    return _run(PathRunner, task, task, store, directives)


def run_group(tasks: list[PathTask], store: StoreRef | None, directives: str) -> list[TaskEvent]:
    """The Dask task of a fused group: train `tasks` lock-stepped on this worker, streaming
    each member's events under its own key and applying each member's directive."""
    return _run(FusedPathRunner, tasks, tasks[0], store, directives)


def _run(
    runner_type: type[PathRunner] | type[FusedPathRunner],
    given: Any,
    first: PathTask,
    store: StoreRef | None,
    directives: str,
) -> list[TaskEvent]:
    """Run `given` (a task, or the tasks of a fused group, `first` among them) with a
    `runner_type` on this worker: each step's events sent as one message, each member's
    directive handed to it between steps, every step watched against the step timeout.
    Before the trainer is built, Dask's own random draws leave the global generator
    (`private_random_for_dask`)."""
    private_random_for_dask()
    worker, live, checks, resume_checks = _this_worker()
    runner = runner_type(
        given,
        None if store is None else store_on(worker, store),
        live,
        worker=worker.address,
        checks=checks,
        resume_checks=resume_checks,
    )
    with _StepWatch(worker, first.topic, first.step_timeout, runner.timeout_events) as watch:
        relay = _Relay(worker, first.topic, directives, runner.members, watch)
        try:
            return runner.run(relay)
        finally:
            relay.flush()


class _StepWatch:
    """The worker's side of a study's ``step_timeout``: when the task's thread spends
    `seconds` on one step (the first from the task's start, which includes building or
    loading the trainer; the others from when the step before was sent and the directives
    read: dagtune's own messages are not the step's), send the error events `give_up` makes
    (given the seconds and where that thread is) and watch no more. The task can't be cancelled:
    the coordinator fails the step and replaces this worker (`DaskExecutor.abandon`). A
    thread that holds the interpreter lock (a hang in native code that never releases it)
    stops the watch too; Dask's own heartbeats then remove the worker."""

    def __init__(
        self,
        worker: Worker,
        topic: str,
        seconds: float | None,
        give_up: Callable[[float, str], list[TaskFailed]],
    ):
        self.worker, self.topic, self.seconds, self.give_up = worker, topic, seconds, give_up
        self.thread = threading.get_ident()
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = None
        self._round = 0  # which step the running timer watches
        self._done = False  # fired, or the task ended

    def __enter__(self) -> _StepWatch:
        self.restart()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        with self._lock:
            self._done = True
            if self._timer is not None:
                self._timer.cancel()

    def pause(self) -> None:
        """A step ended: nothing is watched until `restart`."""
        with self._lock:
            self._round += 1
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None

    def restart(self) -> None:
        """A step begins (or the task): it has `seconds` from now."""
        if self.seconds is None:
            return
        with self._lock:
            if self._done:
                return
            if self._timer is not None:
                self._timer.cancel()
            self._round += 1
            self._timer = threading.Timer(self.seconds, self._fire, args=(self._round,))
            self._timer.daemon = True
            self._timer.start()

    def _fire(self, watched: int) -> None:
        with self._lock:
            if self._done or watched != self._round:  # the step ended meanwhile
                return
            self._done = True
        frame = sys._current_frames().get(self.thread)
        stack = "".join(traceback.format_stack(frame)) if frame is not None else ""
        self.worker.log_event(self.topic, pack(self.give_up(self.seconds, stack)))


def _this_worker() -> tuple[Worker, LiveTrainers, EvaluateChecks, ResumeChecks]:
    """The worker running this task, with the trainer it ran last and its evaluate and
    resume checks."""
    worker = get_worker()
    with _LIVE_LOCK:
        live = _LIVE.setdefault(worker.address, LiveTrainers())
        checks = _CHECKS.setdefault(worker.address, EvaluateChecks())
        resume_checks = _RESUME_CHECKS.setdefault(worker.address, ResumeChecks())
    return worker, live, checks, resume_checks


class _Relay:
    """What a runner calls after each step (`__call__`): send the step's events as one
    message (so they arrive together), then read the current directives and hand each
    task's to its entry of `members`, sending back the checkpoints it declines; `watch`
    times the steps, not this.

    The directives are read (a round trip to the scheduler) only while a member may train
    another step: once every member is `MemberPath.finished` no directive changes what it
    does, and a checkpoint it would decline is replanned anyway when its end arrives. What
    comes from then on (the last step's events, then the task's end, or its failure) is
    held and sent as one message by `flush`, which the task calls once its runner has
    returned (or raised): a one-step stage is one message, its end in it, and no event
    travels after the one that ends its task. The watch is not restarted then (no step is
    left), so no step timeout is sent before the held events."""

    def __init__(
        self,
        worker: Worker,
        topic: str,
        directives: str,
        members: dict[str, MemberPath],
        watch: _StepWatch,
    ):
        self.worker, self.topic, self.members, self.watch = worker, topic, members, watch
        self.variable = Variable(directives)
        self.held: list[TaskEvent] = []  # the events since every member finished

    def __call__(self, events: list[TaskEvent]) -> None:
        self.watch.pause()
        if all(member.finished for member in self.members.values()):
            self.held.extend(events)  # no step is left to watch: a timeout can't overtake them
            return
        self._send(events)
        try:
            current = self.variable.get(timeout=5) or {}
        except Exception:  # a slow scheduler only delays a directive
            current = None
        if current is not None:
            declined = [
                event
                for key, member in self.members.items()
                for event in member.update(Directive.from_dict(current.get(key)))
            ]
            if declined:
                self._send(declined)
        self.watch.restart()

    def flush(self) -> None:
        """Send what is held (the task's last events), if anything."""
        held, self.held = self.held, []
        if held:
            self._send(held)

    def _send(self, events: list[TaskEvent]) -> None:
        self.worker.log_event(self.topic, pack(events))  # one bytes: Dask walks no dicts (`_wire`)
