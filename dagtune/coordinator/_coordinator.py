"""`Coordinator`: the trial ledger and the dispatcher joined by values (the package
docstring tells how), and the one loop that drives them (`pump`)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from dagtune.config import Config
from dagtune.coordinator._dispatcher import Dispatcher
from dagtune.coordinator._kept import KeptPoints
from dagtune.coordinator._ledger import TrialLedger
from dagtune.coordinator._outcomes import MetricsKnown, Outcome
from dagtune.coordinator._report import report_figures
from dagtune.events import TaskEvent
from dagtune.execution import Executor
from dagtune.plan import SearchPlan
from dagtune.records import MetricsPoint, Trial, TrialState
from dagtune.scheduling import SchedulingPolicy
from dagtune.tasks import TrainerSpec

__all__ = ["Coordinator"]


class Coordinator:
    """Trials in, stages out, results back: a `TrialLedger` (`ledger`) and a `Dispatcher`
    (`dispatcher`) over one search plan. What the dispatcher learns from the executor's
    events that concerns trials it returns as values that the ledger applies; the requests
    the ledger changes make the dispatcher plan a new round. Keyword arguments are the
    dispatcher's (the task settings, the planner, fusion), except `share` (the ledger's:
    False gives each trial a private path)."""

    def __init__(
        self,
        plan: SearchPlan,
        executor: Executor,
        trainer: TrainerSpec,
        policy: SchedulingPolicy,
        *,
        share: bool = True,
        name: str = "dagtune",
        **settings: Any,
    ):
        self.plan = plan
        self.executor = executor
        self.trainer = trainer
        self.policy = policy
        self.name = name
        self.ledger = TrialLedger(plan, executor.now, share=share, name=name)
        self.dispatcher = Dispatcher(
            plan, executor, trainer, policy, self.ledger.branches.within, name=name, **settings
        )
        # the checkpoints this study needs kept: the running tasks' and the trials'
        self.kept = KeptPoints(self.dispatcher.running.needed, self.ledger.kept)
        # the parts' state, read by the study, storage and the views
        self.trials = self.ledger.trials
        self.interrupted = self.ledger.interrupted
        self.listeners = self.ledger.listeners
        self.recorders = self.ledger.recorders
        self.running = self.dispatcher.running
        self.cost = self.dispatcher.cost
        self.planner = self.dispatcher.planner
        self.fusion = self.dispatcher.fusion
        self.notices = self.dispatcher.notices
        self.incidents = self.dispatcher.incidents
        self.loads = self.dispatcher.loads
        self.topic = self.dispatcher.topic

    # ------------------------------------------------------------------ trials

    def submit(self, config: Config, steps: int, tag: Any = None) -> Trial:
        """Add a trial (`TrialLedger.submit`): its known results are delivered at the next
        `settle`, after the caller's decision is applied."""
        return self.ledger.submit(config, steps, tag)

    def restore(
        self,
        states: Iterable[TrialState],
        retry: Any = None,
        placed: Mapping[int, tuple[int, str, str]] | None = None,
    ) -> list[Trial]:
        """Rebuild trials from an earlier session's records (`TrialLedger.restore`; `placed`:
        where finished trials are known to sit in the plan)."""
        restored = self.ledger.restore(states, retry, placed)
        self.settle()
        return restored

    def extend(self, trial_id: int, steps: int) -> Trial:
        """Train a trial further: it resumes from its checkpoint, never restarts."""
        return self.ledger.extend(trial_id, steps)

    def stop(self, trial_id: int) -> None:
        """Cancel a trial's pending work (stages other trials need keep running)."""
        self.ledger.stop(trial_id)

    def interrupt(self, trial_id: int) -> None:
        """Withdraw a pending trial's requests without ending it: an interrupted run is not an
        algorithm's `stop`. Nothing is recorded, so storage keeps the trial pending (as it does
        when the process is killed), and `resume`, or the study opened again, continues it
        from its latest committed checkpoint."""
        self.ledger.interrupt(trial_id)

    def resume(self, trial_id: int) -> None:
        """Request an interrupted trial again (nothing if it was not interrupted)."""
        self.ledger.resume(trial_id)

    def expect(self, configs: Iterable[Config]) -> None:
        """Configs an algorithm may submit later (`Algorithm.prospects`): a stage passing the
        step where one of them would branch off its path saves a checkpoint there, so the later
        trial trains only its own steps instead of recomputing a shared prefix."""
        self.ledger.branches.expect(configs if self.ledger.share else ())

    def settle(self) -> None:
        """Deliver the results and ends the decisions applied so far queued (what listeners
        decide meanwhile is applied and delivered in the same loop); the requests that changed
        make the next `schedule` plan a round."""
        if self.ledger.settle():
            self.dispatcher.dirty = True

    # ------------------------------------------------------------------ the loop

    def pump(self, timeout: float | None = 0.0, events: list | None = None, schedule: bool = True) -> int:
        """One turn of the loop: the executor's next events (or `events`, polled already),
        each handled and its outcomes applied and delivered, then a scheduling round (unless
        `schedule` is False: more submissions are coming); returns how many events."""
        if events is None:
            events = self.executor.poll(timeout)
        for event in events:
            self.handle(event)
        if schedule:
            self.schedule()
        else:
            self.settle()
        return len(events)

    def handle(self, event: TaskEvent) -> None:
        """Take one of the executor's events: the dispatcher's outcomes, applied by the ledger
        (most events concern no trial: nothing to apply, nothing queued)."""
        outcomes = self.dispatcher.handle(event)
        if outcomes:
            self.apply(outcomes)

    def apply(self, outcomes: list[Outcome]) -> None:
        """Apply what the dispatcher learnt about trials, then deliver what it queued."""
        for outcome in outcomes:
            if isinstance(outcome, MetricsKnown):
                self.ledger.metrics_known(outcome)
            else:
                self.ledger.point_failed(outcome)
        self.settle()

    def absorb(self, events: Iterable[dict]) -> None:
        """React to search plan events another coordinator wrote (already applied to the
        plan): its metrics serve waiting trials, its checkpoints change the stage tree."""
        for event in events:
            if event["e"] == "metrics":
                node, step = event["node"], event["step"]  # trials share the plan's point
                point = self.plan.point_at(node, step) or MetricsPoint.of(step, event["metrics"])
                self.ledger.metrics_known(MetricsKnown(node, step, point))
            self.dispatcher.dirty = True
        self.settle()

    def schedule(self) -> None:
        """If anything changed, plan a round (`Dispatcher.round`); if slots stay free, tell
        the listeners (an algorithm may then add work, planned in the next round)."""
        for _ in range(8):  # each round only runs if the listeners added work
            self.settle()
            free = self.dispatcher.round()
            if free <= 0:
                return
            for listener in list(self.listeners):
                on_idle = getattr(listener, "on_idle", None)
                if on_idle is not None:
                    on_idle(free)
        self.settle()

    # ------------------------------------------------------------------ state

    def replan(self) -> None:
        """The plan changed outside the coordinator (e.g. checkpoints were collected):
        rebuild the stage tree at the next `schedule`."""
        self.dispatcher.dirty = True

    def protected_points(self) -> set[tuple[str, int]]:
        """Checkpoints that running or queued stages need: every point a running task starts
        or may resume from, and the latest checkpoint before each waiting request and before
        each interrupted trial's point (where it resumes). Kept as things happen
        (`dagtune.coordinator._kept`): this copies the set."""
        return self.kept.protected()

    def latest_of_completed(self) -> set[tuple[str, int]]:
        """The latest checkpoint of each completed trial (where an extension resumes), kept
        as things happen: this copies the set."""
        return self.kept.of_completed()

    def unneeded(self) -> list[str]:
        """Running tasks no pending trial needs any more (the stage tree claims none of their
        points): each ends at its next step boundary (its path is done, or it was told to
        stop), but its last events are still to come, with any steps a late stop let it train."""
        return self.running.unneeded()

    def report(self, trials: list[Trial] | None = None, since: dict | None = None) -> dict:
        """The figures (`dagtune.coordinator.report_figures`, where each is defined) of
        `trials` (default: every trial) and of the work done since the report `since` was
        taken (default: since this coordinator started); `Study.run` reports its own trials
        since it started. The GPU-seconds count a stage still running up to now."""
        trials = list(self.trials.values()) if trials is None else trials
        return report_figures(trials, **self.dispatcher.work(since or {}))

    @property
    def executed_steps(self) -> int:
        """Steps trained by this coordinator's tasks (each once, however many trials)."""
        return self.dispatcher.executed_steps

    @property
    def gpu_seconds(self) -> float:
        """GPU-seconds of the tasks that ended (`report` adds the running ones)."""
        return self.dispatcher.gpu_seconds

    @property
    def events_seen(self) -> int:
        return self.dispatcher.events_seen

    @property
    def demand(self) -> int:
        """Ready stages left without a slot at the last scheduling round."""
        return self.dispatcher.demand

    @property
    def store(self) -> Any:
        """The checkpoint store, where a corrupt checkpoint is deleted (None: none)."""
        return self.dispatcher.store

    @store.setter
    def store(self, store: Any) -> None:
        self.dispatcher.store = store
