"""`Coordinator`: trials in, stages out, results back (the package docstring tells how), and
`TrialListener`, what it tells about trials."""

from __future__ import annotations

import functools
import json
import logging
import math
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from dagtune.config import Config, check_config_finite, config_to_json
from dagtune.coordinator._branches import LaterBranches
from dagtune.coordinator._fusion import Fusion, upcoming_stages
from dagtune.coordinator._kept import KeptPoints
from dagtune.coordinator._report import report_figures
from dagtune.coordinator._running import Running, RunningTasks, Slot
from dagtune.executor import Executor
from dagtune.notices import Notices
from dagtune.plan import SearchPlan, Stage, build_stage_tree
from dagtune.planner import IncrementalPlanner
from dagtune.records import (
    COMPLETED,
    DIVERGED,
    FAILED,
    PENDING,
    STOPPED,
    CheckpointInfo,
    Trial,
    TrialState,
    check_steps,
)
from dagtune.scheduling import CostModel, SchedulingPolicy, critical_path_priorities
from dagtune.tasks import Directive, PathTask, Segment, TrainerSpec

__all__ = ["PLANNERS", "Coordinator", "TrialListener"]

log = logging.getLogger("dagtune")

#: how a coordinator plans each scheduling round: ``"incremental"`` keeps the stage tree, its
#: priorities and the ready queue up to date as things happen (`IncrementalPlanner`), at a
#: cost per event that does not grow with the trials; ``"rebuild"`` rebuilds them from the
#: plan (`build_stage_tree`, `critical_path_priorities`), the reference the other is checked
#: against, and what a policy with its own `pick` needs
PLANNERS = ("incremental", "rebuild")

#: relative change of a step-cost estimate beyond which the incremental planner re-prices
#: the stages priced with it (following every measured step exactly would touch most of the
#: tree at every step event; see `dagtune.planner`)
REPRICE_TOLERANCE = 0.05


class TrialListener(Protocol):
    def on_result(self, trial: Trial, step: int, metrics: dict[str, float]) -> None: ...

    def on_complete(self, trial: Trial) -> None: ...

    def on_end(self, trial: Trial) -> None:
        """The trial stopped, failed or diverged."""

    def on_idle(self, free: int) -> None:
        """`free` worker slots have nothing to run (optional): time to ask for more work."""


class Coordinator:
    """Trials in, stages out, results back (see the module docstring)."""

    def __init__(
        self,
        plan: SearchPlan,
        executor: Executor,
        trainer: TrainerSpec,
        policy: SchedulingPolicy,
        *,
        share: bool = True,
        eval_every: int = 1,
        check_evaluate: int = 0,
        check_resume: int = 0,
        torch_threads: int | None = None,
        checkpoint_every: int | None = None,
        max_retries: int = 1,
        step_timeout: float | None = None,
        gpus_per_task: float = 1.0,
        cost: CostModel | None = None,
        topic: str = "",
        name: str = "dagtune",
        planner: str | None = None,
        fuse: bool | int = False,
        fusion_check: bool = True,
    ):
        self.plan = plan
        self.executor = executor
        self.trainer = trainer
        self.policy = policy
        self.share = share
        self.eval_every = eval_every
        self.check_evaluate = check_evaluate
        self.check_resume = check_resume
        self.torch_threads = torch_threads
        self.checkpoint_every = checkpoint_every
        self.max_retries = max_retries
        self.step_timeout = step_timeout
        self.gpus_per_task = gpus_per_task
        self.cost = cost or CostModel()
        self.topic = topic
        self.name = name
        self.listeners: list[TrialListener] = []
        self.recorders: list[Callable[[dict], None]] = []
        self.incidents: list[str] = []
        self.notices = Notices()  # warnings about the trainer its workers sent, each shown once
        self.store: Any = None  # the checkpoint store, to delete corrupt checkpoints
        self.trials: dict[int, Trial] = {}
        self.interrupted: set[int] = set()  # pending trials whose requests an interrupt withdrew
        self._next_id = 0
        self.running = RunningTasks()  # what they will deliver is the stage tree's InFlight
        self.kept = KeptPoints(plan, self.running.needed)  # checkpoints this study needs kept
        self._watchers: dict[str, set[int]] = {}  # node -> pending trials passing through it
        self._live: dict[str, tuple[str, int] | None] = {}  # worker -> point it holds in memory
        self._holders: dict[tuple[str, int], dict[str, None]] = {}  # point -> workers holding it
        # worker -> the task launched to continue the trainer a task still running there will
        # leave live: once that task ends, its point is taken, not free for a second task
        self._promised: dict[str, str] = {}
        self._promise_of: dict[str, str] = {}  # the same, task -> worker
        self._failures: dict[tuple[str, int], int] = {}
        # nodes whose task's worker died: whatever trains them again does without the resume check
        self._unchecked: set[str] = set()
        self.branches = LaterBranches(plan, self.trials)  # where a task saves for later trials
        self._seen: set[tuple[str, str, str, int]] = set()
        self._launched = 0
        self._started_count = 0  # tasks started (a fused group's members each count)
        self._dirty = True
        self.executed_steps = 0
        self.gpu_seconds = 0.0
        self.loads = {"memory": 0, "storage": 0}
        self.events_seen = 0
        self.demand = 0  # ready stages left without a slot at the last scheduling round
        self._slots_seen = 0
        self.planner = self._incremental_planner(planner)  # None: rebuild every round
        self._paused: set[str] = set()  # running tasks asked to pause
        # with the planner, a round redirects only the tasks whose directive may have changed:
        # their claims changed (or were never planned: launched since), their pause, or the
        # progress of a task nothing claims (it stops where it is)
        self._redirect_due: set[str] = set()
        self._launched_since: set[str] = set()
        # which launches share a fused task, whether the trainer fuses at all
        self.fusion = Fusion(fuse, trainer, executor.slots, check=fusion_check)

    def _incremental_planner(self, planner: str | None) -> IncrementalPlanner | None:
        """The planner `planner` names (None: incremental unless the policy picks by itself,
        which only the rebuilt tree serves); None when the coordinator rebuilds."""
        own_pick = type(self.policy).pick is not SchedulingPolicy.pick
        if planner is None:
            planner = "rebuild" if own_pick else "incremental"
        if planner not in PLANNERS:
            raise ValueError(f"planner must be one of {list(PLANNERS)}, got {planner!r}")
        if planner == "rebuild":
            return None
        if own_pick:
            raise ValueError(
                f'planner="incremental" follows a policy\'s ready_key and path_key, but '
                f'{type(self.policy).__name__} overrides pick: use planner="rebuild"'
            )
        return IncrementalPlanner(self.plan, self.cost, self.policy, tolerance=REPRICE_TOLERANCE)

    # ------------------------------------------------------------------ trials

    def submit(self, config: Config, steps: int, tag: Any = None) -> Trial:
        """Add a trial; known results are delivered at once (no training for those). Steps
        that are not a valid count, or a config without a finite value before them, are a
        ValueError before anything is recorded."""
        check_steps(steps)
        check_config_finite(config, steps)
        trial = Trial(self._next_id, config, steps, tag, submitted_at=self.executor.now())
        self._next_id += 1
        if not self.share:
            trial.salt = f"{self.name}/{trial.id}"
        self.trials[trial.id] = trial
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
        self, states: Iterable[TrialState], retry: Callable[[TrialState], bool] | None = None
    ) -> list[Trial]:
        """Rebuild trials from what an earlier session's records say (`dagtune.records`):
        finished trials come back with their status and metrics, pending ones are requested
        again and resume from the latest committed checkpoint the plan knows, and so are the
        failed ones `retry` says to retry (recorded: a ``retry`` record)."""
        restored = []
        for state in sorted(states, key=lambda s: s.id):
            trial = Trial(state.id, state.config, state.steps, state.tag, submitted_at=self.executor.now())
            if not self.share:
                trial.salt = state.salt or f"{self.name}/{trial.id}"
            self.trials[trial.id] = trial
            self._next_id = max(self._next_id, trial.id + 1)
            restored.append(trial)
            retried = state.status == FAILED and retry is not None and retry(state)
            if retried:
                self._record({"r": "retry", "trial": trial.id})
            if state.status == PENDING or retried:
                self._request(trial)
                continue
            trial.node = self.plan.locate(trial.config, trial.steps, create=True, salt=trial.salt)
            trial.segments = self.plan.segments(trial.node, trial.steps)
            known = self.plan.curve(trial.node, trial.steps)
            trial.curve = [(step, metrics) for step, metrics in known if step <= state.reached]
            trial.reported, trial.metrics = state.reached, state.metrics
            trial.status, trial.error, trial.cause = state.status, state.error, state.cause
            trial.finished_at = trial.submitted_at
            if trial.status == COMPLETED:
                self.kept.completed_at((trial.node, trial.steps))
        return restored

    def _record(self, record: dict) -> None:
        for recorder in self.recorders:
            recorder(record)

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
        trial.steps, trial.status, trial.finished_at = steps, PENDING, None
        self._record({"r": "extend", "trial": trial_id, "steps": steps})
        self._request(trial)
        return trial

    def stop(self, trial_id: int) -> None:
        """Cancel a trial's pending work (stages other trials need keep running)."""
        trial = self.trials[trial_id]
        if trial.status == PENDING:
            self._forget_request(trial)
            self._finish(trial, STOPPED)

    def interrupt(self, trial_id: int) -> None:
        """Withdraw a pending trial's requests without ending it: an interrupted run is not an
        algorithm's `stop`. Nothing is recorded, so storage keeps the trial pending (as it does
        when the process is killed), and `resume`, or the study opened again, continues it
        from its latest committed checkpoint."""
        trial = self.trials[trial_id]
        if trial.status == PENDING and trial_id not in self.interrupted:
            self._forget_request(trial)
            self.interrupted.add(trial_id)
            self.kept.interrupted((trial.node, trial.steps))

    def resume(self, trial_id: int) -> None:
        """Request an interrupted trial again (nothing if it was not interrupted)."""
        if trial_id in self.interrupted:
            self.interrupted.discard(trial_id)
            trial = self.trials[trial_id]
            self.kept.resumed((trial.node, trial.steps))
            self._request(trial)

    def expect(self, configs: Iterable[Config]) -> None:
        """Configs an algorithm may submit later (`Algorithm.prospects`): a stage passing the
        step where one of them would branch off its path saves a checkpoint there, so the later
        trial trains only its own steps instead of recomputing a shared prefix."""
        self.branches.expect(configs if self.share else ())

    def _request(self, trial: Trial) -> None:
        plan = self.plan
        trial.node = plan.locate(trial.config, trial.steps, create=True, salt=trial.salt)
        trial.segments = plan.segments(trial.node, trial.steps)
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
            self._watchers.setdefault(node, set()).add(trial.id)
        self._dirty = True

    def _forget_request(self, trial: Trial) -> None:
        if trial.id in self.interrupted:  # its requests are withdrawn already
            self.interrupted.discard(trial.id)
            self.kept.resumed((trial.node, trial.steps))
            return
        self.plan.remove_request(trial.node, trial.steps, trial.id)
        for node, _, _ in trial.segments:
            watchers = self._watchers.get(node)
            if watchers is not None:
                watchers.discard(trial.id)
        self._dirty = True

    def _deliver(self, trial: Trial, step: int, metrics: dict[str, float]) -> bool:
        """Report one result to the trial's listeners; False if it ended the trial."""
        trial.reported, trial.metrics = step, metrics
        trial.curve.append((step, metrics))
        if not all(math.isfinite(v) for v in metrics.values()):
            if trial.status == PENDING and (trial.node, trial.steps) in self.plan.active:
                self._forget_request(trial)
            self._finish(trial, DIVERGED)
            return False
        for listener in list(self.listeners):
            listener.on_result(trial, step, metrics)
        return trial.status == PENDING

    def _finish(self, trial: Trial, status: str, error: str | None = None, cause: str | None = None) -> None:
        """End `trial` with `status` (a failed one with its `error` and `cause`, one of
        `dagtune.records.CAUSES`)."""
        trial.status, trial.error, trial.cause = status, error, cause
        trial.finished_at = self.executor.now()
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
            self.kept.completed_at((trial.node, trial.steps))
            self.branches.pause(trial)
        for listener in list(self.listeners):
            if status == COMPLETED:
                listener.on_complete(trial)
            else:
                listener.on_end(trial)

    # ------------------------------------------------------------------ events

    def pump(self, timeout: float | None = 0.0) -> int:
        """Handle the executor's next events and launch what became ready; returns how many
        events were handled."""
        events = self.executor.poll(timeout)
        for event in events:
            self.handle(event)
        self.schedule()
        return len(events)

    def handle(self, event: dict) -> None:
        running = self.running.get(event["task"])
        kind = event["kind"]
        self.events_seen += 1
        if kind in ("start", "load", "step", "corrupt"):  # handled once though delivered twice
            key = (event["task"], event.get("attempt", ""), kind, event["step"])
            if key in self._seen:
                return
            self._seen.add(key)
        if kind == "step":
            self.executed_steps += 1
            if self.fusion.holding:  # a group waits for this task's point
                self._dirty = True
            self.cost.observe(event["node"], event["seconds"])
            if running is not None:
                running.progress = max(running.progress, event["step"])
                self._progressed(event["task"], running)
        elif kind == "metrics":
            node, step = event["node"], event["step"]
            if self.plan.record_metrics(node, step, event["metrics"]):  # trials share the plan's copy
                self._metrics_known(node, step, self.plan.metrics_at(node, step) or event["metrics"])
        elif kind == "checkpoint":
            info = CheckpointInfo(event.get("nbytes", 0), event.get("sha256", ""))
            if self.plan.record_checkpoint(event["node"], event["step"], info):
                self._dirty = True
        elif kind == "start" and running is not None:
            running.worker, running.started = event.get("worker"), event.get("time")
            running.progress = event["step"]
            self._progressed(event["task"], running)
            self._hold(running.worker, None)
            self._release_promise(event["task"])
        elif kind == "load":
            self.loads[event["origin"]] += 1
        elif kind == "declined":
            self._dirty = True
        elif kind == "warning":
            self.notices.show(event)
        elif kind == "corrupt":
            self._on_corrupt(event)
            if running is not None:
                self._retire(event["task"], running, {**event, "lost": True})
        elif kind in ("end", "error") and running is not None:
            self._retire(event["task"], running, event)
        elif kind == "fusion":  # a fused task checked the trainer (`dagtune.coordinator._fusion`)
            self.fusion.verdict(event)
            self._dirty = True

    def absorb(self, events: Iterable[dict]) -> None:
        """React to search plan events another coordinator wrote (already applied to the
        plan): its metrics serve waiting trials, its checkpoints change the stage tree."""
        for event in events:
            if event["e"] == "metrics":
                self._metrics_known(event["node"], event["step"], event["metrics"])
            self._dirty = True

    def _on_corrupt(self, event: dict) -> None:
        """A checkpoint failed verification on load: report it, drop it from the plan and
        delete it (write-once storage would otherwise keep the bad copy), so its work is
        planned again from an earlier point."""
        node, step = event["node"], event["step"]
        message = f"corrupt checkpoint at ({node}, {step}) dropped and recomputed: {event.get('error')}"
        self.incidents.append(message)
        log.warning("dagtune: %s", message)
        if node in self.plan.nodes:
            self.plan.drop_checkpoint(node, step)
        if self.store is not None:
            self.store.delete(self.trainer.identity, node, step)
        self._dirty = True

    def _metrics_known(self, node: str, step: int, metrics: dict[str, float]) -> None:
        """Metrics at point ``(node, step)`` became known: deliver them to the trials passing
        there and complete the trials that waited for exactly that point."""
        for trial_id in sorted(self._watchers.get(node, ())):
            trial = self.trials[trial_id]
            if trial.status == PENDING and step > trial.reported and _covers(trial, node, step):
                self._deliver(trial, step, metrics)
        waiting = self.plan.active.get((node, step))
        for trial_id in sorted(waiting or ()):
            trial = self.trials[trial_id]
            self._forget_request(trial)
            if trial.status == PENDING:
                self._finish(trial, COMPLETED)

    def _progressed(self, key: str, running: Running) -> None:
        if self.planner is not None:
            self.planner.task_progressed(key, running.progress)
            if not running.claimed:
                self._redirect_due.add(key)

    def _hold(self, worker: str, point: tuple[str, int] | None) -> None:
        """`worker` holds the trainer at `point` in memory now (None: nothing to reuse)."""
        old = self._live.get(worker)
        if old is not None:
            holders = self._holders[old]
            del holders[worker]
            if not holders:
                del self._holders[old]
        self._live[worker] = point
        if point is not None:
            self._holders.setdefault(point, {})[worker] = None

    def _release_promise(self, key: str) -> None:
        worker = self._promise_of.pop(key, None)
        if worker is not None:
            del self._promised[worker]

    def _retire(self, key: str, running: Running, event: dict) -> None:
        self.running.end(key)
        if self.planner is not None:
            self.planner.task_ended(key)
        self._release_promise(key)
        if running.started is not None and event.get("time") is not None:
            self.gpu_seconds += running.slot.charge(running.started, event["time"]) * self.gpus_per_task
        self._dirty = True
        if event["kind"] == "end":
            if running.worker is not None:
                left = (event["node"], event["step"]) if event["node"] else None
                # a fused task leaves no live trainer behind
                kept = not running.slot.fused and running.worker not in self._promised
                self._hold(running.worker, left if kept else None)
            return
        if running.worker is not None:
            self._hold(running.worker, None)
        if event["kind"] == "error" and event.get("lost"):  # its worker died or went away
            # the resume check's second trainer may be what took the worker down (memory):
            # whatever trains these stages again does without it
            self._unchecked.update(segment.node for segment in running.task.segments)
        if event.get("cause") == "timeout":  # its step hangs: the task still runs there
            self.executor.abandon(key, running.worker)
        if event.get("lost") and not event.get("killed"):
            return  # the worker went away: the stage is simply planned again
        if event.get("killed"):  # Dask gave up after the task took down several workers
            first = running.task.segments[0]
            event = {
                **event,
                "node": first.node,
                "step": running.task.start + 1,
                "cause": "workers",
                "traceback": f"{event.get('error')}\nThe Dask workers running this stage died; the "
                "trainer may exhaust the worker's memory or crash in native code.",
            }
        point = (event["node"], event["step"])
        self._failures[point] = failures = self._failures.get(point, 0) + 1
        if running.slot.fused:  # whose failure it was is unknown: the retry runs it alone
            self.fusion.isolate(point)
        if failures > self.max_retries:
            for trial_id in sorted(self._watchers.get(event["node"], ())):
                trial = self.trials[trial_id]
                if trial.status == PENDING and _covers(trial, *point):
                    self._forget_request(trial)
                    error = event.get("traceback") or event.get("error")
                    self._finish(trial, FAILED, error, event.get("cause", "trainer"))

    # ------------------------------------------------------------------ scheduling

    def schedule(self) -> None:
        """If anything changed, plan a round (from the planner's state, or a rebuilt stage
        tree), redirect running tasks, fill free slots; if slots stay free, tell the
        listeners (an algorithm may then add work)."""
        slots = self.executor.slots()
        if slots > self._slots_seen:  # workers joined: fill them now, not at the next event
            self._dirty = True
        self._slots_seen = slots
        for _ in range(8):  # each round only runs if the listeners added work
            if not self._dirty:
                return
            free = self._schedule_once()
            if free <= 0:
                return
            for listener in list(self.listeners):
                on_idle = getattr(listener, "on_idle", None)
                if on_idle is not None:
                    on_idle(free)

    def _schedule_once(self) -> int:
        """One round of planning and launching; returns how many slots are still free."""
        self._dirty = False
        free = self.executor.slots() - self.running.slots_used()
        wanted = self.fusion.paths_wanted(free) if free > 0 else 0
        if self.planner is None:
            launches, pauses = self._round_rebuilt(wanted)
            due = set(self.running)
        else:
            launches, pauses = self._round_incremental(wanted)
            due, self._redirect_due = self._redirect_due, set()
        for key in self._paused - pauses.keys():
            running = self.running.get(key)
            if running is not None:
                running.pause_at = None
                due.add(key)
        for key, step in pauses.items():
            self.running[key].pause_at = step
            due.add(key)
        self._paused = set(pauses)
        for key in sorted((k for k in due if k in self.running), key=lambda k: self.running[k].number):
            self._redirect(key, self.running[key])
        if self.fusion.on:
            groups = self._fuse(launches, free)
            self.demand += len(launches) - sum(len(group) for group in groups)
            for group in groups:
                if self.fusion.on:
                    self._launch_group(group)
                else:  # measuring F found the trainer cannot fuse
                    self._launch_task(*group[0])
        else:
            for path, priority in launches:
                self._launch(path, priority)
        return self.executor.slots() - self.running.slots_used()

    def _round_rebuilt(self, wanted: int) -> tuple[list[tuple[list[Stage], float]], dict[str, int]]:
        """Rebuild the stage tree and its priorities: up to `wanted` paths to launch with their
        priorities, and the running tasks to pause (task -> step). Sets what each running
        task is claimed for and the demand."""
        for running in self.running.values():
            running.claimed = set()
        tree = build_stage_tree(self.plan, self.running)
        self.demand = 0
        if not tree.stages:
            return [], {}
        priority = critical_path_priorities(tree, self.cost, self.plan)
        paths = self.policy.pick(tree, wanted, self.cost, self.plan) if wanted > 0 else []
        launched = {path[0].index for path in paths}
        waiting = [s for s in tree.ready() if s.index not in launched]
        self.demand = len(waiting)
        pauses: dict[str, int] = {}
        if waiting and self.running:
            below: dict[str, list[tuple[int, float]]] = {}
            for stage in tree.stages:
                if stage.source == "running" and stage.source_task is not None and stage.source_point:
                    below.setdefault(stage.source_task, []).append(
                        (stage.source_point[1], priority[stage.index])
                    )
            pausable = self.running.pausable(lambda key: below.get(key, ()), self.cost, self.plan)
            pauses = self.policy.preempt(waiting, priority, pausable)
        return [(path, priority[path[0].index]) for path in paths], pauses

    def _round_incremental(self, wanted: int) -> tuple[list[tuple[list[Stage], float]], dict[str, int]]:
        """`_round_rebuilt` from the incremental planner's state: the same decisions (with
        priorities from estimates within `REPRICE_TOLERANCE` of the cost model's). Only the
        tasks whose claims changed are looked at."""
        planner = self.planner
        picked = planner.pick(wanted) if wanted > 0 else []
        launched = {path[0].index for path in picked}
        # snapshots: launching changes the live stages
        launches = [([s.snapshot() for s in path], path[0].priority) for path in picked]
        self.demand = planner.ready_count() - len(picked)
        pauses: dict[str, int] = {}
        if self.demand > 0 and self.running:

            def below(key: str) -> list[tuple[int, float]]:
                return [(s.source_point[1], s.priority) for s in planner.sourced_from(key)]

            pausable = self.running.pausable(below, self.cost, self.plan)
            waiting = (s for s in planner.ready() if s.index not in launched)
            pauses = self.policy.preempt_ordered(waiting, planner.priorities, pausable)
        changed = planner.wanted_changed() | self._launched_since
        self._launched_since = set()
        for key in changed:
            running = self.running.get(key)
            if running is not None:
                running.claimed = {step for _, step in planner.wanted_of(key)}
                self._redirect_due.add(key)
        return launches, pauses

    def _fuse(
        self, launches: list[tuple[list[Stage], float]], free: int
    ) -> list[list[tuple[PathTask, float]]]:
        """The round's paths (best first) as tasks with their priorities, in at most `free`
        fused groups (`dagtune.coordinator._fusion`); the paths left out stay ready."""
        tasks = [self._task(path) for path, _ in launches]
        groups = self.fusion.groups(tasks, free)
        soon = functools.cache(lambda: upcoming_stages(self.planner, self.running, self.cost, self.plan))
        now = self.executor.now()
        step_seconds = lambda node: self.cost.step_seconds(node, self.plan)  # noqa: E731
        groups = [g for g in groups if not self.fusion.hold([tasks[i] for i in g], soon, now, step_seconds)]
        return [[(tasks[i], launches[i][1]) for i in group] for group in groups]

    def _launch_group(self, group: list[tuple[PathTask, float]]) -> None:
        """Run `group`'s tasks as one fused task on one slot; each is running on its own key
        (a fused task leaves no live trainer, so none prefers a worker)."""
        slot = Slot(fused=True)
        tasks = self.fusion.prepare([task for task, _ in group])  # with the fusion check, if due
        for task, (_, priority) in zip(tasks, group):
            self._started(task, Running(task, priority, progress=task.start, slot=slot))
        self.executor.launch_group(tasks, max(priority for _, priority in group))

    def _redirect(self, key: str, running: Running) -> None:
        task = running.task
        stop_at = max(running.claimed) if running.claimed else running.progress
        directive = Directive(
            frozenset(running.claimed - task.checkpoints),
            None if stop_at >= task.end else stop_at,
            running.pause_at,
        )
        if directive != running.directive:
            self.running.direct(key, directive)
            self.executor.direct(key, directive)

    def _task(self, path: list[Stage]) -> PathTask:
        """The task that trains `path` (a new key each time)."""
        first = path[0]
        segments = tuple(Segment(s.node, self.plan.nodes[s.node].config, s.start, s.end) for s in path)
        checkpoints = {s.end for s in path}
        for segment in segments:
            checkpoints.update(self.branches.within(segment))
        if self.checkpoint_every:
            every = self.checkpoint_every
            checkpoints.update(range((first.start // every + 1) * every, path[-1].end, every))
        source = first.source_point if first.source == "checkpoint" else None
        self._launched += 1
        key = f"dagtune-{self.name}-{first.node[:8]}-{first.start}-{path[-1].end}-{self._launched}"
        return PathTask(
            key=key,
            trainer=self.trainer,
            segments=segments,
            source=source,
            checkpoints=frozenset(checkpoints),
            eval_every=self.eval_every,
            topic=self.topic,
            check_evaluate=self.check_evaluate,
            check_resume=0 if any(s.node in self._unchecked for s in segments) else self.check_resume,
            torch_threads=self.torch_threads,
            step_timeout=self.step_timeout,
        )

    def _launch(self, path: list[Stage], priority: float) -> None:
        self._launch_task(self._task(path), priority)

    def _launch_task(self, task: PathTask, priority: float) -> None:
        key, source = task.key, task.source
        prefer = next(iter(self._holders.get(source, ())), None) if source is not None else None
        if prefer is None and source is not None:  # a task about to end there holds it next
            prefer = next((r.worker for r in self.running.ending_at(source) if r.worker is not None), None)
        if prefer is not None:
            self._hold(prefer, None)  # that worker is busy now; no second task may count on it
            earlier = self._promised.get(prefer)
            if earlier is not None:
                del self._promise_of[earlier]
            self._promised[prefer] = key
            self._promise_of[key] = prefer
        self._started(task, Running(task, priority, progress=task.start))
        self.executor.launch(task, priority, prefer)

    def _started(self, task: PathTask, running: Running) -> None:
        """Count `task` as running: its stages are in the tree, so it is needed up to its end
        until the next planning round says otherwise."""
        running.claimed = {s.end for s in task.segments}
        self._started_count += 1
        running.number = self._started_count  # redirects go in this order
        self.running.start(task.key, running)
        if self.planner is not None:
            self.planner.task_launched(
                task.key, [(s.node, s.start, s.end) for s in task.segments], task.start
            )
            self._launched_since.add(task.key)

    # ------------------------------------------------------------------ state

    def replan(self) -> None:
        """The plan changed outside the coordinator (e.g. checkpoints were collected):
        rebuild the stage tree at the next `schedule`."""
        self._dirty = True

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

    @property
    def idle(self) -> bool:
        """Nothing is waiting and nothing runs."""
        return not self.plan.active and not self.running

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
        since = since or {}
        now = self.executor.now()
        in_flight = self.running.busy_seconds(now) * self.gpus_per_task
        return report_figures(
            trials,
            executed_steps=self.executed_steps - since.get("executed_steps", 0),
            gpu_seconds=self.gpu_seconds + in_flight - since.get("gpu_seconds", 0.0),
            now=now,
            group_sizes=self.fusion.sizes - Counter(since.get("group_sizes", {}))
            if self.fusion.asked
            else None,
        )


def _jsonable(value: Any) -> Any:
    """`value` if it survives JSON (a trial tag to record), else its repr."""
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)
    return value


def _covers(trial: Trial, node: str, step: int) -> bool:
    return any(n == node and start < step <= end for n, start, end in trial.segments)
