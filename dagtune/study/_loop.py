"""`StudyLoop`: a study's one event loop, and the waits on it.

Each turn takes the executor's events and hands them to the coordinator (`Coordinator.pump`:
each event's outcomes applied, the results it queued delivered, then a scheduling round),
with the study's periodic work first. On Dask a driver thread turns it (polling outside
the study's lock, turning inside it), so trials progress while the caller does something
else; in simulation the waiting caller turns it (virtual time only moves when asked).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from dagtune.coordinator import Coordinator
from dagtune.execution import Executor
from dagtune.study._workers import NoWorkersError, WorkerWatch

__all__ = ["SUBMIT_QUIET_SECONDS", "StudyLoop"]

#: a burst of `Study.submit` calls (a plain loop) is planned as one: the driver launches work
#: for submitted trials once this long passed without a submission (or at once when a caller
#: starts waiting for a result: it submits nothing more meanwhile). A stage launched for
#: the first trial alone would run past the point where the next ones branch off, and that
#: prefix would be trained again.
SUBMIT_QUIET_SECONDS = 0.05


class StudyLoop:
    """Turns `coordinator` on `executor`'s events under `lock` (see the module docstring).

    `periodic` is the study's periodic work (its argument: do it now, whatever is due);
    `workers` watches for a cluster left without workers (Dask only). `failure` is what
    stopped the loop (a bug or a storage failure), raised to every waiter."""

    def __init__(
        self,
        executor: Executor,
        coordinator: Coordinator,
        lock: threading.RLock,
        periodic: Callable[[bool], None],
        workers: WorkerWatch | None = None,
    ):
        self.executor = executor
        self.coordinator = coordinator
        self.lock = lock
        self.changed = threading.Condition(lock)
        self.periodic = periodic
        self.workers = workers
        self.virtual = executor.virtual
        self.failure: BaseException | None = None
        self.no_workers: NoWorkersError | None = None  # set while the cluster has none too long
        self.submitted_at = -SUBMIT_QUIET_SECONDS  # monotonic time of the latest submit
        self.closed = False
        self._driver: threading.Thread | None = None

    def start(self, name: str) -> None:
        """On Dask, start the driver thread (a simulation is turned by its waiters)."""
        if not self.virtual:
            self._driver = threading.Thread(target=self.drive, name=f"dagtune-{name}", daemon=True)
            self._driver.start()

    def stop(self) -> None:
        """End the driver's loop (it finishes its turn first), then hand the coordinator the
        events that arrived after its last turn (an interrupted run closes at once): the plan
        keeps the checkpoints and metrics they report."""
        self.closed = True
        if self._driver is not None:
            self._driver.join(timeout=5)
        if not self.virtual:  # a simulation's poll would advance its virtual time
            with self.lock:
                self.coordinator.pump(events=self.executor.poll(0), schedule=False)

    def drive(self) -> None:
        """The driver thread: turn until closed, waking every waiter after each turn."""
        while not self.closed:
            burst = self.in_burst()
            events = self.executor.poll(timeout=SUBMIT_QUIET_SECONDS if burst else 0.2)
            with self.lock:
                try:
                    self.turn(events)
                    self.no_workers = self._check_workers()
                except BaseException as error:  # a bug or a storage failure: wake every waiter
                    self.failure = error
                self.changed.notify_all()

    def turn(self, events: list | None = None) -> int:
        """One turn, under the lock: the executor's next events (or `events`, polled already
        outside the lock) handled by the coordinator after the periodic work, then a
        scheduling round unless trials are still being submitted on Dask (the next round
        plans the whole burst); returns how many events."""
        if events is None:
            events = self.executor.poll(0.0)
        self.periodic(False)
        return self.coordinator.pump(events=events, schedule=self.virtual or not self.in_burst())

    def in_burst(self) -> bool:
        """Trials were submitted less than `SUBMIT_QUIET_SECONDS` ago (more may follow)."""
        return time.monotonic() - self.submitted_at < SUBMIT_QUIET_SECONDS

    def submitted(self) -> None:
        """A trial was just submitted (under the lock): the burst goes on; waiters wake."""
        self.submitted_at = time.monotonic()
        self.changed.notify_all()

    def _check_workers(self) -> NoWorkersError | None:
        """On Dask, whether the study has waited too long without any worker (reported live
        meanwhile: `dagtune.study._workers`)."""
        if self.workers is None:
            return None
        slots = self.executor.slots()
        waiting = 0 if slots else sum(len(waiters) for waiters in self.coordinator.plan.active.values())
        return self.workers.check(slots, waiting)

    def call(self, function: Callable[..., Any], *args: Any) -> Any:
        """``function(*args)`` under the lock, then what it queued delivered and a round."""
        with self.lock:
            result = function(*args)
            self.coordinator.schedule()  # delivers what `function` queued, then plans
            self.changed.notify_all()
            return result

    def wait(self, done: Callable[[], bool], timeout: float | None = None) -> None:
        """Until `done()`: turning the loop in simulation, else woken by the driver; raises
        what stopped the loop, a cluster without workers for too long, or a TimeoutError."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self.lock:
            if not self.virtual and not done() and self.in_burst():
                # a caller that waits submits nothing more meanwhile: its burst is over, and
                # its work is planned now rather than after the quiet interval
                self.submitted_at = -SUBMIT_QUIET_SECONDS
                self.coordinator.schedule()
            while not done():
                if self.failure is not None:
                    raise RuntimeError("the dagtune coordinator failed") from self.failure
                if self.no_workers is not None:
                    raise NoWorkersError(str(self.no_workers))
                if self.virtual:
                    if self.turn() == 0 and not self.coordinator.running:
                        if done():
                            return
                        raise RuntimeError("nothing is running and nothing will: the wait can never end")
                    continue
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise TimeoutError(f"still waiting after {timeout} s")
                self.changed.wait(0.5 if remaining is None else min(remaining, 0.5))
