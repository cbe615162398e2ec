"""The coordinator: one loop from trials to stages to events and back.

Data flows one way. Trials become requests in the search plan; the stage tree is rebuilt
from the plan whenever something changed; the scheduling policy picks paths of ready stages
for the free slots and the executor runs them; the events they report (metrics,
checkpoints, progress, ends, errors) update the plan, which resolves requests and reports
results to the trials' listener. Running tasks are never re-issued: the tree builder asks
them (`InFlight`) for the points they will still pass, which also tells each task which
extra checkpoints it should save on its way and where it may stop.

Durability hooks: every trial change (submit, extend, end) is handed to `recorders` as a
plain record, which is how a study journals its trials, and `restore` rebuilds trials from
those records, checked and folded by `dagtune.records`, when a study resumes. A checkpoint that fails verification when a task loads
it (``corrupt`` event) is dropped from the plan and deleted, and the work it held is planned
again from an earlier point; it is not a trainer failure. `absorb` takes plan events written
by other coordinators (studies of the same model running at the same time).

The coordinator is not thread-safe by itself; `dagtune.study.Study` serializes access.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from dagtune.config import Config, check_config_finite, config_first_difference, config_to_json
from dagtune.executor import Executor
from dagtune.plan import SearchPlan, Stage, StageTree, build_stage_tree, unique_steps
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
from dagtune.scheduling import CostModel, Pausable, SchedulingPolicy, critical_path_priorities
from dagtune.tasks import Directive, PathTask, Segment, TrainerSpec

__all__ = ["Coordinator", "TrialListener"]

log = logging.getLogger("dagtune")


class TrialListener(Protocol):
    def on_result(self, trial: Trial, step: int, metrics: dict[str, float]) -> None: ...

    def on_complete(self, trial: Trial) -> None: ...

    def on_end(self, trial: Trial) -> None:
        """The trial stopped, failed or diverged."""

    def on_idle(self, free: int) -> None:
        """`free` worker slots have nothing to run (optional): time to ask for more work."""


@dataclass
class _Running:
    task: PathTask
    priority: float
    worker: str | None = None
    started: float | None = None
    progress: int = 0
    claimed: set[int] = field(default_factory=set)
    directive: Directive = field(default_factory=Directive)
    pause_at: int | None = None


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
        checkpoint_every: int | None = None,
        max_retries: int = 1,
        gpus_per_task: float = 1.0,
        cost: CostModel | None = None,
        topic: str = "",
        name: str = "dagtune",
    ):
        self.plan = plan
        self.executor = executor
        self.trainer = trainer
        self.policy = policy
        self.share = share
        self.eval_every = eval_every
        self.check_evaluate = check_evaluate
        self.checkpoint_every = checkpoint_every
        self.max_retries = max_retries
        self.gpus_per_task = gpus_per_task
        self.cost = cost or CostModel()
        self.topic = topic
        self.name = name
        self.listeners: list[TrialListener] = []
        self.recorders: list[Callable[[dict], None]] = []
        self.incidents: list[str] = []
        self.store: Any = None  # the checkpoint store, to delete corrupt checkpoints
        self.trials: dict[int, Trial] = {}
        self._next_id = 0
        self.running: dict[str, _Running] = {}
        self._on_node: dict[str, list[str]] = {}  # node -> running task keys covering it
        self._watchers: dict[str, set[int]] = {}  # node -> pending trials passing through it
        self._live: dict[str, tuple[str, int] | None] = {}  # worker -> point it holds in memory
        # worker -> the task launched to continue the trainer a task still running there will
        # leave live: once that task ends, its point is taken, not free for a second task
        self._promised: dict[str, str] = {}
        self._failures: dict[tuple[str, int], int] = {}
        self._paused: dict[str, set[int]] = {}  # node -> completed trials ending on it
        self._prospects: list[Config] = []  # configs an algorithm may submit later
        self._prospect_branches: dict[tuple[str, int], set[int]] = {}
        self._seen: set[tuple[str, str, str, int]] = set()
        self._launched = 0
        self._dirty = True
        self.executed_steps = 0
        self.gpu_seconds = 0.0
        self.loads = {"memory": 0, "storage": 0}
        self.events_seen = 0
        self.demand = 0  # ready stages left without a slot at the last scheduling round
        self._slots_seen = 0

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

    def restore(self, states: Iterable[TrialState]) -> list[Trial]:
        """Rebuild trials from what an earlier session's records say (`dagtune.records`):
        finished trials come back with their status and metrics, pending ones are requested
        again and resume from the latest committed checkpoint the plan knows."""
        restored = []
        for state in sorted(states, key=lambda s: s.id):
            trial = Trial(state.id, state.config, state.steps, state.tag, submitted_at=self.executor.now())
            if not self.share:
                trial.salt = state.salt or f"{self.name}/{trial.id}"
            self.trials[trial.id] = trial
            self._next_id = max(self._next_id, trial.id + 1)
            restored.append(trial)
            if state.status == PENDING:
                self._request(trial)
                continue
            trial.node = self.plan.locate(trial.config, trial.steps, create=True, salt=trial.salt)
            trial.segments = self.plan.segments(trial.node, trial.steps)
            known = self.plan.known_metrics(trial.node, trial.steps)
            trial.curve = [(step, metrics) for step, metrics in known if step <= state.reached]
            trial.reported, trial.metrics = state.reached, state.metrics
            trial.status, trial.error = state.status, state.error
            trial.finished_at = trial.submitted_at
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
        self._paused.get(trial.node, set()).discard(trial.id)
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

    def expect(self, configs: Iterable[Config]) -> None:
        """Configs an algorithm may submit later (`Algorithm.prospects`): a stage passing the
        step where one of them would branch off its path saves a checkpoint there, so the later
        trial trains only its own steps instead of recomputing a shared prefix."""
        self._prospects = list(configs) if self.share else []
        self._prospect_branches.clear()

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

    def _finish(self, trial: Trial, status: str, error: str | None = None) -> None:
        trial.status, trial.error = status, error
        trial.finished_at = self.executor.now()
        self._record(
            {
                "r": "end",
                "trial": trial.id,
                "status": status,
                "steps": trial.reached,
                "metrics": trial.metrics,
                "error": error,
            }
        )
        if status == COMPLETED:
            self._paused.setdefault(trial.node, set()).add(trial.id)
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
            self.cost.observe(event["node"], event["seconds"])
            if running is not None:
                running.progress = max(running.progress, event["step"])
        elif kind == "metrics":
            if self.plan.record_metrics(event["node"], event["step"], event["metrics"]):
                self._metrics_known(event["node"], event["step"], event["metrics"])
        elif kind == "checkpoint":
            info = CheckpointInfo(event.get("nbytes", 0), event.get("sha256", ""))
            if self.plan.record_checkpoint(event["node"], event["step"], info):
                self._dirty = True
        elif kind == "start" and running is not None:
            running.worker, running.started = event.get("worker"), event.get("time")
            running.progress = event["step"]
            self._live[running.worker] = None
            self._release_promise(event["task"])
        elif kind == "load":
            self.loads[event["origin"]] += 1
        elif kind == "declined":
            self._dirty = True
        elif kind == "corrupt":
            self._on_corrupt(event)
            if running is not None:
                self._retire(event["task"], running, {**event, "lost": True})
        elif kind in ("end", "error") and running is not None:
            self._retire(event["task"], running, event)

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

    def _release_promise(self, key: str) -> None:
        self._promised = {worker: k for worker, k in self._promised.items() if k != key}

    def _retire(self, key: str, running: _Running, event: dict) -> None:
        del self.running[key]
        self._release_promise(key)
        for segment in running.task.segments:
            keys = self._on_node.get(segment.node)
            if keys is not None and key in keys:
                keys.remove(key)
        if running.started is not None and event.get("time") is not None:
            self.gpu_seconds += max(0.0, event["time"] - running.started) * self.gpus_per_task
        self._dirty = True
        if event["kind"] == "end":
            if running.worker is not None:
                left = (event["node"], event["step"]) if event["node"] else None
                self._live[running.worker] = None if running.worker in self._promised else left
            return
        if running.worker is not None:
            self._live[running.worker] = None
        if event.get("lost") and not event.get("killed"):
            return  # the worker went away: the stage is simply planned again
        if event.get("killed"):  # Dask gave up after the task took down several workers
            first = running.task.segments[0]
            event = {
                **event,
                "node": first.node,
                "step": running.task.start + 1,
                "traceback": f"{event.get('error')}\nThe Dask workers running this stage died; the "
                "trainer may exhaust the worker's memory or crash in native code.",
            }
        point = (event["node"], event["step"])
        self._failures[point] = failures = self._failures.get(point, 0) + 1
        if failures > self.max_retries:
            for trial_id in sorted(self._watchers.get(event["node"], ())):
                trial = self.trials[trial_id]
                if trial.status == PENDING and _covers(trial, *point):
                    self._forget_request(trial)
                    self._finish(trial, FAILED, event.get("traceback") or event.get("error"))

    # ------------------------------------------------------------------ scheduling

    def claim(self, node: str, step: int) -> str | None:
        """`InFlight`: a running task that still passes point ``(node, step)``."""
        for key in self._on_node.get(node, ()):
            running = self.running[key]
            if running.progress < step and any(
                s.node == node and s.start < step <= s.end for s in running.task.segments
            ):
                running.claimed.add(step)
                return key
        return None

    def latest_before(self, node: str, step: int) -> tuple[int, str] | None:
        """`InFlight`: the latest point on `node` before `step` a running task will reach."""
        best: tuple[int, str] | None = None
        for key in self._on_node.get(node, ()):
            running = self.running[key]
            for segment in running.task.segments:
                later = best is None or segment.end > best[0]
                if segment.node == node and running.progress < segment.end < step and later:
                    best = (segment.end, key)
        if best is not None:
            self.running[best[1]].claimed.add(best[0])
        return best

    def schedule(self) -> None:
        """Rebuild the stage tree if anything changed, redirect running tasks, fill free
        slots; if slots stay free, tell the listeners (an algorithm may then add work)."""
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
        """One rebuild and launch; returns how many slots are still free."""
        self._dirty = False
        for running in self.running.values():
            running.claimed = set()
            running.pause_at = None
        tree = build_stage_tree(self.plan, self)
        free = self.executor.slots() - len(self.running)
        paths: list[list[Stage]] = []
        self.demand = 0
        if tree.stages:
            priority = critical_path_priorities(tree, self.cost, self.plan)
            if free > 0:
                paths = self.policy.pick(tree, free, self.cost, self.plan)
            launched = {path[0].index for path in paths}
            waiting = [s for s in tree.ready() if s.index not in launched]
            self.demand = len(waiting)
            if waiting and self.running:
                pausable = self._pausable(tree, priority)
                for key, step in self.policy.preempt(waiting, priority, pausable).items():
                    self.running[key].pause_at = step
        for key, running in self.running.items():
            self._redirect(key, running)
        for path in paths:
            self._launch(path, priority[path[0].index])
        return self.executor.slots() - len(self.running)

    def _pausable(self, tree: StageTree, priority: list[float]) -> list[Pausable]:
        """Running tasks with a stage boundary still ahead, and the longest chain each would
        leave behind by pausing there: the rest of its path, then what hangs below the points
        it delivers (stages sourced from it)."""
        below: dict[str, list[tuple[int, float]]] = {}
        for stage in tree.stages:
            if stage.source == "running" and stage.source_task is not None and stage.source_point:
                below.setdefault(stage.source_task, []).append((stage.source_point[1], priority[stage.index]))
        found = []
        for key, running in self.running.items():
            task = running.task
            step = min((s.end for s in task.segments if running.progress < s.end < task.end), default=None)
            if step is None:
                continue
            own = self._seconds(task, step, task.end)
            hanging = [self._seconds(task, step, at) + p for at, p in below.get(key, ()) if at > step]
            found.append(Pausable(key, step, max([own, *hanging])))
        return found

    def _seconds(self, task: PathTask, start: int, end: int) -> float:
        """Estimated seconds of training `task`'s steps ``[start, end)``."""
        return sum(
            max(0, min(s.end, end) - max(s.start, start)) * self.cost.step_seconds(s.node, self.plan)
            for s in task.segments
        )

    def _redirect(self, key: str, running: _Running) -> None:
        task = running.task
        stop_at = max(running.claimed) if running.claimed else running.progress
        directive = Directive(
            frozenset(running.claimed - task.checkpoints),
            None if stop_at >= task.end else stop_at,
            running.pause_at,
        )
        if directive != running.directive:
            running.directive = directive
            self.executor.direct(key, directive)

    def _launch(self, path: list[Stage], priority: float) -> None:
        first = path[0]
        segments = tuple(Segment(s.node, self.plan.nodes[s.node].config, s.start, s.end) for s in path)
        checkpoints = {s.end for s in path}
        for segment in segments:
            checkpoints.update(self._branches_of_paused(segment))
            checkpoints.update(self._branches_of_prospects(segment))
        if self.checkpoint_every:
            every = self.checkpoint_every
            checkpoints.update(range((first.start // every + 1) * every, path[-1].end, every))
        source = first.source_point if first.source == "checkpoint" else None
        self._launched += 1
        key = f"dagtune-{self.name}-{first.node[:8]}-{first.start}-{path[-1].end}-{self._launched}"
        task = PathTask(
            key=key,
            trainer=self.trainer,
            segments=segments,
            source=source,
            checkpoints=frozenset(checkpoints),
            eval_every=self.eval_every,
            topic=self.topic,
            check_evaluate=self.check_evaluate,
        )
        prefer = next((w for w, point in self._live.items() if point is not None and point == source), None)
        if prefer is None and source is not None:  # a task about to end there holds it next
            prefer = next(
                (
                    r.worker
                    for r in self.running.values()
                    if r.worker is not None
                    and r.task.end == source[1]
                    and r.task.node_at(r.task.end) == source[0]
                ),
                None,
            )
        if prefer is not None:
            self._live[prefer] = None  # that worker is busy now; no second task may count on it
            self._promised[prefer] = key
        # its stages are in the tree: it is needed up to its end until the next rebuild says otherwise
        self.running[key] = _Running(task, priority, progress=first.start, claimed={s.end for s in path})
        for segment in segments:
            self._on_node.setdefault(segment.node, []).append(key)
        self.executor.launch(task, priority, prefer)

    def _branches_of_paused(self, segment: Segment) -> set[int]:
        """Steps inside `segment` where a completed trial on its node would branch off if it
        were extended (ASHA pauses trials at a rung and promotes them later): checkpointing
        there on the way costs a save now instead of retraining the prefix later."""
        steps = set()
        for trial_id in self._paused.get(segment.node, ()):
            trial = self.trials[trial_id]
            if trial.status != COMPLETED or trial.steps > segment.start:
                continue
            branch = config_first_difference(segment.config, trial.config, trial.steps, segment.end)
            if segment.start < branch < segment.end:
                steps.add(branch)
        return steps

    def _branches_of_prospects(self, segment: Segment) -> set[int]:
        """Steps inside `segment` where an expected config would branch off its path (a node's
        config agrees with its whole path, so one comparison from step 0 finds the branch)."""
        if not self._prospects:
            return set()
        key = (segment.node, segment.end)
        found = self._prospect_branches.get(key)
        if found is None:
            node = self.plan.nodes[segment.node]
            found = set()
            for config in self._prospects:
                branch = config_first_difference(node.config, config, 0, segment.end)
                if node.start < branch < segment.end:
                    found.add(branch)
            self._prospect_branches[key] = found
        return {step for step in found if step > segment.start}

    # ------------------------------------------------------------------ state

    def replan(self) -> None:
        """The plan changed outside the coordinator (e.g. checkpoints were collected):
        rebuild the stage tree at the next `schedule`."""
        self._dirty = True

    def protected_points(self) -> set[tuple[str, int]]:
        """Checkpoints that running or queued stages need: every point a running task starts
        or may resume from, and the latest checkpoint before each waiting request."""
        points: set[tuple[str, int]] = set()
        for running in self.running.values():
            task = running.task
            if task.source is not None:
                points.add(task.source)
            for step in task.checkpoints | running.directive.checkpoints:
                if task.start < step <= task.end:
                    points.add((task.node_at(step), step))
        for node, step in self.plan.active:
            latest = self.plan.latest_checkpoint(node, step)
            if latest is not None:
                points.add(latest)
        return points

    def latest_of_completed(self) -> set[tuple[str, int]]:
        """The latest checkpoint of each completed trial (where an extension resumes)."""
        points = set()
        for trial in self.trials.values():
            if trial.status == COMPLETED and trial.node:
                latest = self.plan.latest_checkpoint(trial.node, trial.steps)
                if latest is not None:
                    points.add(latest)
        return points

    @property
    def idle(self) -> bool:
        """Nothing is waiting and nothing runs."""
        return not self.plan.active and not self.running

    def unneeded(self) -> list[str]:
        """Running tasks no pending trial needs any more (the stage tree claims none of their
        points): each ends at its next step boundary (its path is done, or it was told to
        stop), but its last events are still to come, with any steps a late stop let it train."""
        return [key for key, running in self.running.items() if not running.claimed]

    def report(self, trials: list[Trial] | None = None, since: dict | None = None) -> dict:
        """The figures of `trials` (default: every trial) and of the work done since the
        report `since` was taken (default: since this coordinator started). `Study.run`
        reports its own trials since it started; this is where each figure is defined:

        ``trials``
            how many trials.
        ``trial_steps``
            the sum over the trials of the steps each *reached*: its `steps` if completed,
            else the last step it received metrics for (stopped, diverged, failed, or
            pending still). What a trial-based system trains for the same results.
        ``unique_steps``
            the distinct points among the steps the trials reached: step ``s`` of two trials
            counts once when every hyper-parameter has the same value in both at every step
            up to ``s`` (`dagtune.plan.unique_steps`, on configs even without sharing). The
            least any system must train for these results from scratch.
        ``executed_steps``
            the steps trained since `since` (calls of ``Trainer.train``, counted from the
            ``step`` events), whatever they were for: the points the trials reached that
            were not trained before; steps trained again (a lost worker's stage rerun from
            its last checkpoint, a corrupt checkpoint's work, a retried failure, a point
            whose checkpoint was asked for after its stage had passed it); and steps a stage
            trained after its trials were stopped or diverged, before the stop reached it (a
            worker sees a stop at its next step boundary): those are executed, never unique.
            `Study.run` returns only after every stage no pending trial needs has ended, so
            a run counts them all. Points trained before `since` (by an earlier run or
            session, or another study of the same model) are not trained again. So a run with
            sharing executes: unique − the reached points trained before `since` + the
            steps trained again + the steps trained past a stop; on fresh storage, a run
            with nothing stopped, diverged, failed, lost or corrupt executes exactly its
            unique steps unless a branch was asked for after its stage had passed it.
        ``merge_rate``
            trial_steps / unique_steps (1.0 without steps).
        ``reuse``
            trial_steps / executed_steps: how many times fewer steps were trained than a
            trial-based system trains (infinite when every result was known already, 1.0
            without steps).
        ``gpu_seconds``
            the seconds the stages held their workers since `since` (each from its
            ``start`` event, when a worker took it, to its ``end``: loading, training,
            evaluating and saving, not queueing; a stage still running up to now), times the
            GPUs each stage asks for (``resources["GPU"]``, else 1).
        ``makespan_seconds``
            from the first of the trials' submissions to the end of the last of them (to
            now while one is pending), on the executor's clock (virtual in simulation).
        """
        trials = list(self.trials.values()) if trials is None else trials
        reached = [(t.config, t.reached) for t in trials if t.reached > 0]
        trial_steps = sum(s for _, s in reached)
        unique = unique_steps(reached) if reached else 0
        executed = self.executed_steps - (since or {}).get("executed_steps", 0)
        now = self.executor.now()
        in_flight = sum(
            max(0.0, now - r.started) * self.gpus_per_task
            for r in self.running.values()
            if r.started is not None
        )
        gpu = self.gpu_seconds + in_flight - (since or {}).get("gpu_seconds", 0.0)
        start = min((t.submitted_at for t in trials), default=self.executor.now())
        ends = [t.finished_at for t in trials if t.finished_at is not None]
        end = max(ends) if ends and all(t.done for t in trials) else self.executor.now()
        return {
            "trials": len(trials),
            "trial_steps": trial_steps,
            "unique_steps": unique,
            "executed_steps": executed,
            "merge_rate": trial_steps / unique if unique else 1.0,
            "reuse": trial_steps / executed if executed else (math.inf if trial_steps else 1.0),
            "gpu_seconds": gpu,
            "makespan_seconds": max(0.0, end - start),
        }


def _jsonable(value: Any) -> Any:
    """`value` if it survives JSON (a trial tag to record), else its repr."""
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)
    return value


def _covers(trial: Trial, node: str, step: int) -> bool:
    return any(n == node and start < step <= end for n, start, end in trial.segments)
