"""`TrialLedger`: the trials, their requests in the search plan, the results delivered to
them and the records of every change. It knows no executor: what the dispatcher learns
from running tasks comes to it as values (`MetricsKnown`, `PointFailed`).

Nothing re-enters. A listener (an algorithm's session) told of a result answers with
decisions that submit, extend or stop trials; those only change the ledger's state and
queue what follows from them (a new request's known results, the end of a trial), and
`settle` delivers the queue, one item at a time, once the caller's decision is applied:
ask, then apply, in one loop.
"""

from __future__ import annotations

import json
import math
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

from dagtune.config import Config, check_config_finite, config_to_json
from dagtune.coordinator._branches import LaterBranches
from dagtune.coordinator._ids import IdsByNode
from dagtune.coordinator._kept import TrialPoints
from dagtune.coordinator._outcomes import MetricsKnown, PointFailed
from dagtune.plan import SearchPlan
from dagtune.records import (
    COMPLETED,
    DIVERGED,
    FAILED,
    PENDING,
    STOPPED,
    MetricsPoint,
    Trial,
    TrialState,
    check_steps,
)

__all__ = ["TrialLedger", "TrialListener"]


class TrialListener(Protocol):
    def on_result(self, trial: Trial, step: int, metrics: dict[str, float]) -> None: ...

    def on_complete(self, trial: Trial) -> None: ...

    def on_end(self, trial: Trial) -> None:
        """The trial stopped, failed or diverged."""

    def on_idle(self, free: int) -> None:
        """`free` worker slots have nothing to run (optional): time to ask for more work."""


#: what `settle` delivers: ("request", trial), ("end", trial, status) or ("replay", trial,
#: listener)
_Queued = tuple


class TrialLedger:
    """The trials of one coordinator and what they are told (see the module docstring).

    `now` is the clock trials are stamped with; `share` False gives each trial a private
    path (named after `name`)."""

    def __init__(
        self, plan: SearchPlan, now: Callable[[], float], *, share: bool = True, name: str = "dagtune"
    ):
        self.plan = plan
        self.now = now
        self.share = share
        self.name = name
        self.listeners: list[TrialListener] = []
        self.recorders: list[Callable[[dict], None]] = []
        #: sets the id of every trial that changes is added to, whatever the change (submitted,
        #: restored, extended, placed, a result, an end, a restored trial adopted): a reader that
        #: keeps copies of trials (a study's kept view) copies again only those, and a study's
        #: results writes compare only those (`dagtune.durable`)
        self.changes: list[set[int]] = []
        self.trials: dict[int, Trial] = {}
        self.interrupted: set[int] = set()  # pending trials whose requests an interrupt withdrew
        self.branches = LaterBranches(plan)  # where a task saves for later trials
        self.kept = TrialPoints(plan)  # the checkpoints its trials need kept, kept as they change
        self.changed = False  # the requests in the plan changed since the last `settle`
        self._next_id = 0
        self._watchers = IdsByNode()  # node -> pending trials passing through it
        self._queue: deque[_Queued] = deque()
        self._queued: set[int] = set()  # trials whose request waits in the queue

    # ------------------------------------------------------------------ decisions

    def watch_changes(self) -> set[int]:
        """A new set of `changes`: the id of every trial that changes from now on is added to
        it, until `unwatch_changes`. Its reader clears it as it reads."""
        ids: set[int] = set()
        self.changes.append(ids)
        return ids

    def unwatch_changes(self, ids: set[int]) -> None:
        """Stop adding to `ids` (found by identity: another reader's set may hold the same ids,
        and two empty sets are equal)."""
        self.changes[:] = [watched for watched in self.changes if watched is not ids]

    def submit(self, config: Config, steps: int, tag: Any = None) -> Trial:
        """Add a trial; its known results are queued (no training for those). Steps that are
        not a valid count, or a config without a finite value before them, are a ValueError
        before anything is recorded."""
        check_steps(steps)
        check_config_finite(config, steps)
        trial = Trial(self._next_id, config, steps, tag, submitted_at=self.now())
        self._next_id += 1
        if not self.share:
            trial.salt = f"{self.name}/{trial.id}"
        self.trials[trial.id] = trial
        self._changed(trial)
        if self.recorders:  # no storage, no record: its config's JSON form is not made
            record = {
                "r": "submit",
                "trial": trial.id,
                "config": config_to_json(config),
                "steps": steps,
                "tag": _jsonable(tag),
            }
            if trial.salt:  # a trial-based trial's private path: found again when it resumes
                record["salt"] = trial.salt
            self._record(record)
        self._request(trial)
        return trial

    def restore(
        self,
        states: Iterable[TrialState],
        retry: Callable[[TrialState], bool] | None = None,
        placed: Mapping[int, tuple[int, str, str]] | None = None,
    ) -> list[Trial]:
        """Rebuild trials from what an earlier session's records say (`dagtune.records`):
        finished trials come back with their status and metrics, pending ones are requested
        again and resume from the latest committed checkpoint the plan knows, and so are the
        failed ones `retry` says to retry (recorded: a ``retry`` record).

        `placed` says where a finished trial sits in the plan, as trial id -> (steps, salt, node),
        where that is known already (`dagtune.resume_state`: what the plan's `locate` gave
        an earlier session, still its answer): such a trial of those steps is not located
        again (a walk of the plan comparing its config with each node's, most of restoring
        a large study)."""
        placed = placed or {}
        restored = []
        for state in sorted(states, key=lambda s: s.id):
            trial = Trial(state.id, state.config, state.steps, state.tag, submitted_at=self.now())
            if not self.share:
                trial.salt = state.salt or f"{self.name}/{trial.id}"
            self.trials[trial.id] = trial
            self._changed(trial)  # its fields set below, in this call
            self._next_id = max(self._next_id, trial.id + 1)
            restored.append(trial)
            retried = state.status == FAILED and retry is not None and retry(state)
            if retried:
                self._record({"r": "retry", "trial": trial.id})
            if state.status == PENDING or retried:
                self._request(trial)
                continue
            steps, salt, node = placed.get(trial.id, (0, "", ""))
            if steps != trial.steps or salt != trial.salt:
                node = self.plan.locate(trial.config, trial.steps, create=True, salt=trial.salt)
            trial.node = node
            trial.segments = self.plan.segments(node, trial.steps)
            known = self.plan.points_along(trial.segments)
            trial.points = [point for point in known if point[0] <= state.reached]
            trial.reported, trial.metrics = state.reached, state.metrics
            trial.status, trial.error, trial.cause = state.status, state.error, state.cause
            trial.finished_at = trial.submitted_at
            if trial.status == COMPLETED:
                self.kept.completed_at((node, trial.steps), trial.segments)
        return restored

    def extend(self, trial_id: int, steps: int) -> Trial:
        """Train a trial further (ASHA promotion, PBT continuation): it resumes from its
        checkpoint, never restarts."""
        trial = self.trials[trial_id]
        check_steps(steps)
        check_config_finite(trial.config, steps)
        if steps <= trial.steps:
            raise ValueError(
                f"extend needs more steps than trial {trial_id} has ({trial.steps}), got {steps}"
            )
        if trial.status == PENDING:
            self._forget_request(trial)
        elif trial.status != COMPLETED:
            raise ValueError(f"trial {trial_id} is {trial.status} and cannot be extended")
        else:
            self.kept.reopened((trial.node, trial.steps))
        self.branches.resume(trial)
        # recorded first: a recorder sees the trial as it was (`dagtune.durable` keeps the
        # metrics a completed trial's records leave it while it trains further)
        self._record({"r": "extend", "trial": trial_id, "steps": steps})
        trial.steps, trial.status, trial.finished_at = steps, PENDING, None
        self._changed(trial)
        self._request(trial)
        return trial

    def stop(self, trial_id: int) -> None:
        """Cancel a trial's pending work (stages other trials need keep running)."""
        trial = self.trials[trial_id]
        if trial.status == PENDING:
            self._forget_request(trial)
            self._finish(trial, STOPPED)

    def interrupt(self, trial_id: int) -> None:
        """Withdraw a pending trial's requests without ending it (see `Coordinator.interrupt`)."""
        trial = self.trials[trial_id]
        if trial.status == PENDING and trial_id not in self.interrupted:
            self._forget_request(trial)
            self.interrupted.add(trial_id)
            if trial.node:  # placed: it resumes from the latest checkpoint before its point
                self.kept.interrupted((trial.node, trial.steps))

    def resume(self, trial_id: int) -> None:
        """Request an interrupted trial again (nothing if it was not interrupted)."""
        if trial_id in self.interrupted:
            self.interrupted.discard(trial_id)
            trial = self.trials[trial_id]
            if trial.node:
                self.kept.resumed((trial.node, trial.steps))
            self._request(trial)

    def replay(self, trial: Trial, listener: TrialListener) -> None:
        """Queue telling `listener` what `trial` (restored from an earlier session) already
        reported, and how it ended (the caller may have tagged it anew: it changed)."""
        self._changed(trial)
        self._queue.append(("replay", trial, listener))

    # ------------------------------------------------------------------ delivery

    def settle(self) -> bool:
        """Deliver what the decisions applied so far queued, in order, until nothing is left
        (what a listener decides meanwhile is queued behind); returns whether the requests in
        the plan changed since the last `settle` (the dispatcher then plans a round)."""
        queue = self._queue
        if queue:
            self._deliver_queue(queue)
        changed, self.changed = self.changed, False
        return changed

    def _deliver_queue(self, queue: deque[_Queued]) -> None:
        while queue:
            item = queue.popleft()
            kind, trial = item[0], item[1]
            if kind == "request":
                if trial.id in self._queued:
                    self._queued.discard(trial.id)
                    self._place(trial)
            elif kind == "end":
                for listener in list(self.listeners):
                    if item[2] == COMPLETED:
                        listener.on_complete(trial)
                    else:
                        listener.on_end(trial)
            else:
                self._replay(trial, item[2])
        if not self._queued:  # a drained set keeps its table (a burst of trials: one per trial)
            self._queued = set()

    def metrics_known(self, known: MetricsKnown) -> None:
        """Deliver metrics that became known to the trials passing there and complete the
        trials that waited for exactly that point."""
        node, step, metrics = known.node, known.step, known.metrics
        for trial_id in sorted(self._watchers.get(node)):
            trial = self.trials[trial_id]
            if trial.status == PENDING and step > trial.reported and _covers(trial, node, step):
                self._deliver(trial, step, metrics)
        waiting = self.plan.active.get((node, step))
        for trial_id in sorted(waiting or ()):
            trial = self.trials[trial_id]
            self._forget_request(trial)
            if trial.status == PENDING:
                self._finish(trial, COMPLETED)

    def point_failed(self, failed: PointFailed) -> None:
        """Fail the pending trials passing the point where training failed for good."""
        for trial_id in sorted(self._watchers.get(failed.node)):
            trial = self.trials[trial_id]
            if trial.status == PENDING and _covers(trial, failed.node, failed.step):
                self._forget_request(trial)
                self._finish(trial, FAILED, failed.error, failed.cause)

    # ------------------------------------------------------------------ inside

    def _changed(self, trial: Trial) -> None:
        for ids in self.changes:
            ids.add(trial.id)

    def _record(self, record: dict) -> None:
        for recorder in self.recorders:
            recorder(record)

    def _request(self, trial: Trial) -> None:
        """Queue placing `trial`'s request (its known results are delivered then)."""
        self._queued.add(trial.id)
        self._queue.append(("request", trial))

    def _place(self, trial: Trial) -> None:
        """Deliver `trial`'s known results; request the rest in the plan."""
        plan = self.plan
        trial.node = plan.locate(trial.config, trial.steps, create=True, salt=trial.salt)
        trial.segments = plan.segments(trial.node, trial.steps)
        self._changed(trial)
        for node, start, end in trial.segments:
            metrics = plan.nodes[node].metrics
            for step in sorted(s for s in metrics if start < s <= end and s > trial.reported):
                if self._deliver(trial, step, metrics[step]) is False:
                    return
        if trial.steps in plan.nodes[trial.node].metrics:
            self._finish(trial, COMPLETED)
            return
        plan.request_at(trial.node, trial.steps, trial.id)
        for node, _, _ in trial.segments:
            self._watchers.add(node, trial.id)
        self.changed = True

    def _forget_request(self, trial: Trial) -> None:
        if trial.id in self.interrupted:  # its requests are withdrawn already
            self.interrupted.discard(trial.id)
            if trial.node:
                self.kept.resumed((trial.node, trial.steps))
            return
        if trial.id in self._queued:  # never placed
            self._queued.discard(trial.id)
            return
        self.plan.remove_request(trial.node, trial.steps, trial.id)
        for node, _, _ in trial.segments:
            self._watchers.discard(node, trial.id)
        self.changed = True

    def _deliver(self, trial: Trial, step: int, point: MetricsPoint) -> bool:
        """Report one result (the plan's point, which the trial keeps) to the trial's
        listeners, as one dict they share; False if it ended the trial."""
        trial.reported, trial.last = step, point
        trial.points.append(point)
        self._changed(trial)
        if not all(math.isfinite(v) for v in point.values()):
            if trial.status == PENDING and (trial.node, trial.steps) in self.plan.active:
                self._forget_request(trial)
            self._finish(trial, DIVERGED)
            return False
        metrics = point.as_dict()
        for listener in list(self.listeners):
            listener.on_result(trial, step, metrics)
        return trial.status == PENDING

    def _finish(self, trial: Trial, status: str, error: str | None = None, cause: str | None = None) -> None:
        """End `trial` with `status` (a failed one with its `error` and `cause`, one of
        `dagtune.records.CAUSES`); its listeners are told when the queue is settled."""
        trial.status, trial.error, trial.cause = status, error, cause
        trial.finished_at = self.now()
        self._changed(trial)
        record = {
            "r": "end",
            "trial": trial.id,
            "status": status,
            "steps": trial.reached,
            "metrics": trial.metrics,
            "error": error,
        }
        if cause is not None:
            record["cause"] = cause
        self._record(record)
        if status == COMPLETED:
            self.kept.completed_at((trial.node, trial.steps), trial.segments)
            self.branches.pause(trial)
        self._queue.append(("end", trial, status))

    def _replay(self, trial: Trial, listener: TrialListener) -> None:
        for step, metrics in trial.curve:
            listener.on_result(trial, step, metrics)
        if trial.status == COMPLETED:
            listener.on_complete(trial)
        elif trial.status != PENDING:
            listener.on_end(trial)


#: the types whose values JSON always takes as they are (exactly these: not subclasses)
_PLAIN = frozenset({str, int, float, bool})


def _jsonable(value: Any) -> Any:
    """`value` if it survives JSON (a trial tag to record), else its repr."""
    if value is None or type(value) in _PLAIN:  # the usual tags: nothing to check
        return value
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)
    return value


def _covers(trial: Trial, node: str, step: int) -> bool:
    return any(n == node and start < step <= end for n, start, end in trial.segments)
