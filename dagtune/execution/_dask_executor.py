"""Path tasks as Dask futures: keys, resources, priorities, directives and events.

Dask pushes a resource-restricted task to a worker as soon as it is submitted and can't
change its priority afterwards, so the coordinator keeps the ready queue itself and this
executor submits just in time: one task per free slot, sent to the scheduler at once
(`_submit_promptly`: Dask's client would hold it for up to 10 ms to batch it). A running task can't be cancelled,
so directives (extra checkpoints, where to stop) travel through a `distributed.Variable`
that the task reads between steps, and events travel back through ``log_event`` →
``Client.subscribe_topic``. The events of one step (its metrics, checkpoint and ``step``)
travel as one message and are polled together, so the coordinator never sees a step's
metrics without the step itself (a run could otherwise end on a trial's last metrics and
report one executed step too few), packed into one ``bytes`` that Dask carries as it is
(`_wire`); a task's last step travels with its end (`_dask_tasks`), so a one-step stage is
one message. The task's result repeats every event, so nothing is
lost if the stream lags: a task whose every ``TaskEnded`` came through the stream before
Dask reported it finished has sent everything (its events travel in order on one stream,
the end last), and its result is not fetched (a round trip to its worker through the
scheduler for events already here); any other task's result is, as before. A fused group of tasks (`launch_group`) is one Dask task running
`dagtune.fusion.FusedPathRunner` (`run_group`): its events carry each member's own key and
each member reads its own directive, so the coordinator sees K tasks on one slot. What a
task runs on its worker is in `_dask_tasks`. The checkpoint store reaches the workers once,
as a worker plugin, and a task names it (`_worker_store`): storage credentials are not part
of any task.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Any

from distributed import Client, Future, KilledWorker, Variable
from distributed.client import FutureCancelledError

from dagtune.events import TaskEnded, TaskEvent, TaskFailed
from dagtune.execution._dask_tasks import run_group, run_path
from dagtune.execution._interface import Executor
from dagtune.execution._wire import unpack
from dagtune.execution._worker_store import register, unregister
from dagtune.tasks import Directive, PathTask

__all__ = ["DaskExecutor"]

log = logging.getLogger(__name__)

CANCEL_SECONDS = 30.0  # how long a step-timed-out task's cancel may take to reach the scheduler
SUBMIT_BATCH_SECONDS = 0.0  # how long the client may hold a submission to batch it (Dask's own: 10 ms)


class DaskExecutor(Executor):
    """Runs path tasks as futures of `client`, `resources` per task (e.g. ``{"GPU": 1}``),
    with checkpoints in `store` (given to the workers once, as a plugin named after `topic`,
    and withdrawn on `close` unless `withdraw` is False: a cluster that closes with the study
    takes it with its workers, and withdrawing it waits for every worker, a hung one too)."""

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
        # each launched task's key -> whether its `TaskEnded` came through the stream (until its future is done)
        self._streamed: dict[str, bool] = {}
        self._streamed_lock = threading.Lock()  # the event loop's thread sets, Dask's callback thread pops
        self.results_fetched = 0  # results gathered: the tasks whose end the stream had not delivered
        self._directives: dict[str, dict] = {}
        self._directives_lock = threading.Lock()
        self._variable = Variable(f"{topic}-directives", client=client)
        self._variable.set({})
        self._slots_cache: tuple[float, int] | None = None
        self._batching: tuple[Any, float] | None = None  # the client's stream we made prompt, its interval
        self._closed = False
        self._replacing: set[str] = set()  # workers being restarted (`abandon`)
        client.subscribe_topic(topic, self._on_event)

    def _on_event(self, event: tuple[float, bytes]) -> None:
        batch = unpack(event[1])
        ended = [e.task for e in batch if isinstance(e, TaskEnded)]
        if ended:
            with self._streamed_lock:
                for key in ended:
                    if key in self._streamed:  # not a task already done (its result fetched)
                        self._streamed[key] = True
        self._events.put(batch)

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

    def _submit_promptly(self) -> None:
        """Let the next submission leave at once. Dask's client batches what it sends the
        scheduler: a message waits until 10 ms have passed since the stream's previous write
        (its ``scheduler_comm``, a `distributed.batched.BatchedSend`, made anew on every
        reconnection, hence checked at every launch). A just-in-time submitter sends a task each
        time a slot frees, so nearly every stage waited for it: from the launch until the
        scheduler received the task, 7.8 ms median of the 15 ms between two stages on one
        worker (embedded TLS cluster; perf/RESULTS.md section 5, `perf/dispatch_gaps.py`).
        Messages that come while a write is under way still travel together in the next one.
        `close` gives the stream its interval back."""
        comm = getattr(self.client, "scheduler_comm", None)
        interval = getattr(comm, "interval", None)
        if interval is None or interval <= SUBMIT_BATCH_SECONDS:
            return
        if self._batching is None or self._batching[0] is not comm:
            self._batching = (comm, interval)
        comm.interval = SUBMIT_BATCH_SECONDS

    def launch(self, task: PathTask, priority: float = 0.0, prefer: str | None = None) -> None:
        self._submit_promptly()
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
        self._follow(task.key, [task.key], future)

    def launch_group(self, tasks: list[PathTask], priority: float = 0.0, prefer: str | None = None) -> None:
        key = f"{tasks[0].key}-fused{len(tasks)}"
        self._members[key] = [task.key for task in tasks]
        self._submit_promptly()
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
        self._follow(key, self._members[key], future)

    def _follow(self, key: str, keys: list[str], future: Future) -> None:
        """Keep `future` (Dask key `key`, running the tasks `keys`) until it is done."""
        with self._streamed_lock:
            self._streamed.update(dict.fromkeys(keys, False))
        self._futures[key] = future
        future.add_done_callback(self._on_done)

    def _on_done(self, future: Future) -> None:
        key = future.key
        self._futures.pop(key, None)
        keys = self._members.pop(key, None) or [key]
        with self._streamed_lock:
            streamed = [self._streamed.pop(k, False) for k in keys]
        if self._closed:  # cancelled by `close`: nobody reads events or directives any more
            return
        try:
            if future.status == "finished" and all(streamed):
                return  # every event came through the stream (the module docstring)
            self.results_fetched += 1
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
            target=self._replace, args=(worker, group), name="dagtune-replace-worker", daemon=True
        ).start()

    def _replace(self, worker: str, key: str) -> None:
        """Restart `worker` once the scheduler has dropped task `key`: the cancel travels in
        the client's batched stream and the restart by a call of its own, and a worker that
        leaves while the scheduler still runs the task there has the task rescheduled, hung
        step and all, onto another worker that then looks idle to Dask."""
        try:
            self._await_dropped(key)
            outcome = self.client.restart_workers([worker], timeout=60, raise_for_error=False)
            if outcome.get(worker) != "OK":
                log.warning(
                    "dagtune: restarting worker %s after a step timeout: %s", worker, outcome.get(worker)
                )
        except Exception as error:
            # a study that closed meanwhile took its cluster (or its client) with it: nothing to say
            (log.debug if self._closed else log.warning)(
                "dagtune: worker %s could not be restarted after a step timeout (%s: %s); it stays busy until "
                "the step returns",
                worker,
                type(error).__name__,
                error,
            )
        finally:
            self._replacing.discard(worker)

    def _await_dropped(self, key: str, timeout: float = CANCEL_SECONDS) -> None:
        """Until no worker processes `key` by the scheduler's account (at most `timeout`
        seconds, then the restart goes ahead with a warning)."""
        deadline = time.monotonic() + timeout
        while any(key in keys for keys in self.client.processing().values()):
            if time.monotonic() > deadline:
                log.warning("dagtune: the scheduler still runs %s %g s after its cancel", key, timeout)
                return
            time.sleep(0.05)

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
        if self._batching is not None:  # a caller's client batches as it did before the study
            comm, interval = self._batching
            comm.interval = interval


def _lost(key: str, error: str, killed: bool = False) -> TaskFailed:
    """The `TaskFailed` of a task whose result never came (the stage is planned again;
    `killed`: it took down the workers that ran it)."""
    return TaskFailed(key, "", "", 0, time.time(), error, lost=True, killed=killed)
