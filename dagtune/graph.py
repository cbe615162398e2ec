"""Path tasks as Dask futures: keys, resources, priorities, directives and events.

Dask pushes a resource-restricted task to a worker as soon as it is submitted and can't
change its priority afterwards, so the coordinator keeps the ready queue itself and this
executor submits just in time: one task per free slot. A running task can't be cancelled,
so directives (extra checkpoints, where to stop) travel through a `distributed.Variable`
that the task reads between steps, and events travel back through ``log_event`` →
``Client.subscribe_topic``. The events of one step (its metrics, checkpoint and ``step``)
travel as one message and are polled together, so the coordinator never sees a step's
metrics without the step itself (a run could otherwise end on a trial's last metrics and
report one executed step too few). The task's result repeats every event, so nothing is
lost if the stream lags. A fused group of tasks (`launch_group`) is one Dask task running
`dagtune.fusion.FusedPathRunner` (`run_group`): its events carry each member's own key and
each member reads its own directive, so the coordinator sees K tasks on one slot. The checkpoint store reaches the workers once, as a worker
plugin, and a task names it (`dagtune.worker_store`): storage credentials are not part of
any task.
"""

from __future__ import annotations

import functools
import logging
import queue
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

from distributed import Client, Future, KilledWorker, Variable, Worker, get_worker
from distributed.client import FutureCancelledError

from dagtune.cluster import adapts, asking_for_a_worker
from dagtune.evalcheck import EvaluateChecks
from dagtune.events import TaskEvent, TaskFailed, from_wire, to_wire
from dagtune.executor import Executor
from dagtune.fusion import FusedPathRunner
from dagtune.resumecheck import ResumeChecks
from dagtune.runner import LiveTrainers, PathRunner
from dagtune.tasks import Directive, PathTask
from dagtune.worker_store import StoreRef, register, store_on, unregister

__all__ = ["DaskExecutor", "check_resources"]

log = logging.getLogger(__name__)

_LIVE: dict[str, LiveTrainers] = {}  # worker address -> the trainer it ran last (per process)
_CHECKS: dict[str, EvaluateChecks] = {}  # worker address -> its clean evaluate checks
_RESUME_CHECKS: dict[str, ResumeChecks] = {}  # worker address -> its passed resume checks
_LIVE_LOCK = threading.Lock()


def run_path(task: PathTask, store: StoreRef | None, directives: str) -> list[TaskEvent]:
    """The Dask task: train `task` on this worker (checkpoints in the store `store` names),
    streaming events and obeying directives."""
    worker, live, checks, resume_checks = _this_worker()
    runner = PathRunner(
        task,
        None if store is None else store_on(worker, store),
        live,
        worker=worker.address,
        checks=checks,
        resume_checks=resume_checks,
    )

    with _StepWatch(worker, task.topic, task.step_timeout, runner.timeout_events) as watch:
        return runner.run(_relay(worker, task.topic, directives, {task.key: runner.update}, watch))


def run_group(tasks: list[PathTask], store: StoreRef | None, directives: str) -> list[TaskEvent]:
    """The Dask task of a fused group: train `tasks` lock-stepped on this worker, streaming
    each member's events under its own key and applying each member's directive."""
    worker, live, checks, resume_checks = _this_worker()
    runner = FusedPathRunner(
        tasks,
        None if store is None else store_on(worker, store),
        live,
        worker=worker.address,
        checks=checks,
        resume_checks=resume_checks,
    )
    updates = {key: functools.partial(runner.update, key) for key in runner.members}
    with _StepWatch(worker, tasks[0].topic, tasks[0].step_timeout, runner.timeout_events) as watch:
        return runner.run(_relay(worker, tasks[0].topic, directives, updates, watch))


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
        self.worker.log_event(self.topic, [to_wire(event) for event in self.give_up(self.seconds, stack)])


def _this_worker() -> tuple[Worker, LiveTrainers, EvaluateChecks, ResumeChecks]:
    """The worker running this task, with the trainer it ran last and its evaluate and
    resume checks."""
    worker = get_worker()
    with _LIVE_LOCK:
        live = _LIVE.setdefault(worker.address, LiveTrainers())
        checks = _CHECKS.setdefault(worker.address, EvaluateChecks())
        resume_checks = _RESUME_CHECKS.setdefault(worker.address, ResumeChecks())
    return worker, live, checks, resume_checks


def _relay(
    worker: Worker,
    topic: str,
    directives: str,
    updates: dict[str, Callable[[Directive], list[TaskEvent]]],
    watch: _StepWatch,
) -> Callable[[list[TaskEvent]], None]:
    """What a runner calls after each step: send the step's events as one message (so they
    arrive together), then read the current directives and hand each task's to its `updates`
    entry, sending back the checkpoints it declines; `watch` times the steps, not this."""
    variable = Variable(directives)

    def relay(events: list[TaskEvent]) -> None:
        watch.pause()
        worker.log_event(topic, [to_wire(event) for event in events])
        try:
            current = variable.get(timeout=5) or {}
        except Exception:  # a slow scheduler only delays a directive
            current = None
        if current is not None:
            declined = [
                event
                for key, update in updates.items()
                for event in update(Directive.from_dict(current.get(key)))
            ]
            if declined:
                worker.log_event(topic, [to_wire(event) for event in declined])
        watch.restart()

    return relay


def check_resources(client: Client, resources: dict[str, float] | None, wait: float | None = None) -> None:
    """Raise a clear error if no worker offers `resources` (such a task would wait forever).

    With no workers at all yet, waits for one, asking for it meanwhile (a published demand
    of one worker, which `dagtune.cluster.DemandAdaptive` scales for even at ``minimum=0``):
    up to `wait` seconds, by default Dask's config ``dagtune.adaptive-wait`` (1 hour) on an
    adaptive cluster, whose jobs may queue that long, else ``dagtune.worker-wait`` (30 s).
    Raises `TimeoutError` if none joined.
    """
    import dask
    from dask.utils import parse_timedelta

    workers = client.scheduler_info(n_workers=-1)["workers"]
    if not workers:
        adaptive = adapts(client)
        if wait is None:
            setting = "dagtune.adaptive-wait" if adaptive else "dagtune.worker-wait"
            wait = parse_timedelta(dask.config.get(setting, default="1h" if adaptive else "30s"), "seconds")
        deadline = time.monotonic() + wait
        with asking_for_a_worker(client):
            while not workers and time.monotonic() < deadline:
                time.sleep(0.5)
                workers = client.scheduler_info(n_workers=-1)["workers"]
        if not workers:
            kind = "adaptive cluster's " if adaptive else ""
            setting = "dagtune.adaptive-wait" if adaptive else "dagtune.worker-wait"
            raise TimeoutError(
                f"no Dask worker joined the {kind}scheduler at {client.scheduler.address} within "
                f"{wait:.0f} s (Dask config {setting} sets how long to wait)"
            )
    if not resources:
        return
    offers = [w.get("resources", {}) for w in workers.values()]
    if any(all(offer.get(name, 0) >= need for name, need in resources.items()) for offer in offers):
        return
    seen = sorted({", ".join(f"{k}={v:g}" for k, v in sorted(o.items())) or "no resources" for o in offers})
    hint = " ".join(f"--resources {k}={v:g}" for k, v in resources.items())
    raise ValueError(
        f"resources={resources!r}: no worker offers that much (workers offer: {'; '.join(seen)}). "
        f"Start workers with `dask worker ADDRESS {hint}` or ask for less."
    )


class DaskExecutor(Executor):
    """Runs path tasks as futures of `client`, `resources` per task (e.g. ``{"GPU": 1}``),
    with checkpoints in `store` (given to the workers once, as a plugin named after `topic`,
    and withdrawn on `close` unless `withdraw` is False: a cluster that closes with the study
    takes it with its workers, and withdrawing it waits for every worker, a hung one too)."""

    virtual = False

    def __init__(
        self,
        client: Client,
        store: Any,
        topic: str,
        resources: dict[str, float] | None = None,
        *,
        withdraw: bool = True,
    ):
        self.client = client
        self.withdraw = withdraw
        self.store = store
        self.topic = topic
        self.resources = dict(resources) if resources else None
        self._store_ref = None if store is None else register(client, store, f"{topic}-store")
        self._events: queue.Queue[list[TaskEvent]] = queue.Queue()  # batches: a step's events, a result
        self._futures: dict[str, Future] = {}
        self._members: dict[str, list[str]] = {}  # a fused group's Dask key -> its tasks' keys
        self._directives: dict[str, dict] = {}
        self._directives_lock = threading.Lock()
        self._variable = Variable(f"{topic}-directives", client=client)
        self._variable.set({})
        self._slots_cache: tuple[float, int] | None = None
        self._closed = False
        self._replacing: set[str] = set()  # workers being restarted (`abandon`)
        client.subscribe_topic(topic, self._on_event)

    def _on_event(self, event: tuple[float, list[dict]]) -> None:
        self._events.put([from_wire(wire) for wire in event[1]])

    def slots(self) -> int:
        now = time.monotonic()
        if self._slots_cache is None or now - self._slots_cache[0] > 1.0:
            workers = self.client.scheduler_info(n_workers=-1)["workers"].values()
            if self.resources:
                count = sum(
                    int(min(w.get("resources", {}).get(k, 0) // v for k, v in self.resources.items()))
                    for w in workers
                )
            else:
                count = sum(w.get("nthreads", 1) for w in workers)
            self._slots_cache = (now, count)
        return self._slots_cache[1]

    def launch(self, task: PathTask, priority: float = 0.0, prefer: str | None = None) -> None:
        future = self.client.submit(
            run_path,
            task,
            self._store_ref,
            f"{self.topic}-directives",
            key=task.key,
            resources=self.resources,
            priority=round(priority * 1000),  # Dask wants ints; keep millisecond differences
            pure=False,
            workers=[prefer] if prefer else None,
            allow_other_workers=bool(prefer),
        )
        self._futures[task.key] = future
        future.add_done_callback(self._on_done)

    def launch_group(self, tasks: list[PathTask], priority: float = 0.0, prefer: str | None = None) -> None:
        key = f"{tasks[0].key}-fused{len(tasks)}"
        self._members[key] = [task.key for task in tasks]
        future = self.client.submit(
            run_group,
            list(tasks),
            self._store_ref,
            f"{self.topic}-directives",
            key=key,
            resources=self.resources,
            priority=round(priority * 1000),
            pure=False,
            workers=[prefer] if prefer else None,
            allow_other_workers=bool(prefer),
        )
        self._futures[key] = future
        future.add_done_callback(self._on_done)

    def _on_done(self, future: Future) -> None:
        key = future.key
        self._futures.pop(key, None)
        keys = self._members.pop(key, None) or [key]
        if self._closed:  # cancelled by `close`: nobody reads events or directives any more
            return
        try:
            self._events.put(future.result())
        except FutureCancelledError:
            self._events.put([_lost(k, "cancelled") for k in keys])
        except KilledWorker as error:  # it took down allowed-failures workers: the trainer's fault
            self._events.put([_lost(k, f"KilledWorker: {error}", killed=True) for k in keys])
        except Exception as error:  # e.g. the scheduler restarted: the stage is planned again
            self._events.put([_lost(k, repr(error)) for k in keys])
        finally:
            with self._directives_lock:
                if [self._directives.pop(k, None) for k in keys] != [None] * len(keys):
                    self._variable.set(dict(self._directives))

    def abandon(self, key: str, worker: str | None) -> None:
        """Cancel the future running task `key` (its fused group's, for a member) and restart
        `worker` through its nanny, in the background: the task's thread can't be stopped
        otherwise. A worker without a nanny can't be restarted: it is logged, and that
        worker keeps a thread busy until the step returns, if ever."""
        group = next((k for k, members in self._members.items() if key in members), key)
        future = self._futures.get(group)
        if future is not None:
            future.cancel()
        if worker is None or worker in self._replacing:
            return
        self._replacing.add(worker)
        threading.Thread(
            target=self._replace, args=(worker,), name="dagtune-replace-worker", daemon=True
        ).start()

    def _replace(self, worker: str) -> None:
        try:
            outcome = self.client.restart_workers([worker], timeout=60, raise_for_error=False)
            if outcome.get(worker) != "OK":
                log.warning(
                    "dagtune: restarting worker %s after a step timeout: %s", worker, outcome.get(worker)
                )
        except Exception as error:
            log.warning(
                "dagtune: worker %s could not be restarted after a step timeout (%s: %s); it stays busy until "
                "the step returns",
                worker,
                type(error).__name__,
                error,
            )
        finally:
            self._replacing.discard(worker)

    def direct(self, key: str, directive: Directive) -> None:
        with self._directives_lock:
            self._directives[key] = directive.to_dict()
            self._variable.set(dict(self._directives))

    def poll(self, timeout: float | None = None) -> list[TaskEvent]:
        events: list[TaskEvent] = []
        try:
            events.extend(self._events.get(timeout=timeout) if timeout else self._events.get_nowait())
        except queue.Empty:
            return events
        while True:
            try:
                events.extend(self._events.get_nowait())
            except queue.Empty:
                return events

    def now(self) -> float:
        return time.time()

    def close(self) -> None:
        self._closed = True
        try:
            self.client.unsubscribe_topic(self.topic)
        except Exception:  # the client may already be closing
            log.debug("unsubscribe_topic failed", exc_info=True)
        for future in list(self._futures.values()):
            future.cancel()
        try:
            self._variable.delete()
        except Exception:
            log.debug("deleting the directives variable failed", exc_info=True)
        if self._store_ref is not None and self.withdraw:
            unregister(self.client, self._store_ref)


def _lost(key: str, error: str, killed: bool = False) -> TaskFailed:
    """The `TaskFailed` of a task whose result never came (the stage is planned again;
    `killed`: it took down the workers that ran it)."""
    return TaskFailed(key, "", "", 0, time.time(), error, lost=True, killed=killed)
