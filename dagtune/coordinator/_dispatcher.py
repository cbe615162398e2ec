"""`Dispatcher`: the executor's side of the coordinator. It plans rounds (from the
incremental planner or a rebuilt stage tree), pauses and redirects running tasks, builds
path tasks and launches them (alone or fused), takes the executor's events, retires ended
tasks, counts failures for retries and knows which checkpoints running tasks need.

It knows no algorithm and no `Trial`: what it learns that concerns trials it returns from
`handle` as values (`dagtune.coordinator._outcomes`) for the trial ledger to apply; what it
needs from the trials is the plan's requests and `branch_points` (steps of a segment where
a later trial would branch off).
"""

from __future__ import annotations

import functools
import logging
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

from dagtune.coordinator._fusion import Fusion, upcoming_stages
from dagtune.coordinator._memory import WorkerMemory
from dagtune.coordinator._outcomes import MetricsKnown, Outcome, PointFailed
from dagtune.coordinator._repeats import Repeats
from dagtune.coordinator._running import Running, RunningTasks, Slot
from dagtune.events import (
    CheckpointCorrupt,
    CheckpointDeclined,
    CheckpointSaved,
    FusionChecked,
    MetricsReported,
    StateLoaded,
    StepDone,
    TaskEnded,
    TaskEvent,
    TaskFailed,
    TaskStarted,
    TrainerWarned,
)
from dagtune.execution import Executor
from dagtune.notices import Notices
from dagtune.plan import SearchPlan, Stage, build_stage_tree
from dagtune.planner import IncrementalPlanner
from dagtune.records import CheckpointInfo, MetricsPoint
from dagtune.scheduling import CostModel, SchedulingPolicy, critical_path_priorities
from dagtune.tasks import Directive, PathTask, Segment, TrainerSpec

__all__ = ["PLANNERS", "REPRICE_TOLERANCE", "Dispatcher"]

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

Launches = list[tuple[list[Stage], float]]

#: events an executor may deliver twice that must count once (streamed, then in the result)
_ONCE = (TaskStarted, StateLoaded, StepDone, CheckpointCorrupt)


class Dispatcher:
    """Rounds, pauses, redirects, tasks, launches, events and retries (see the module
    docstring). The task settings (`eval_every` to `step_timeout`) are `Coordinator`'s."""

    def __init__(
        self,
        plan: SearchPlan,
        executor: Executor,
        trainer: TrainerSpec,
        policy: SchedulingPolicy,
        branch_points: Callable[[Segment], Iterable[int]],
        *,
        eval_every: int = 1,
        check_evaluate: int = 0,
        check_resume: int = 0,
        torch_threads: int | None = None,
        checkpoint_every: int | None = None,
        checkpoint_interval: float | None = None,
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
        self.branch_points = branch_points
        self.eval_every = eval_every
        self.check_evaluate = check_evaluate
        self.check_resume = check_resume
        self.torch_threads = torch_threads
        self.checkpoint_every = checkpoint_every
        self.checkpoint_interval = checkpoint_interval  # seconds; None: no unplanned checkpoints
        self.max_retries = max_retries
        self.step_timeout = step_timeout
        self.gpus_per_task = gpus_per_task
        self.cost = cost or CostModel()
        self.topic = topic
        self.name = name
        self.incidents: list[str] = []
        self.notices = Notices()  # warnings about the trainer its workers sent, each shown once
        self.store: Any = None  # the checkpoint store, to delete corrupt checkpoints
        self.running = RunningTasks()  # what they will deliver is the stage tree's InFlight
        self.memory = WorkerMemory()
        self._failures: dict[tuple[str, int], int] = {}
        # nodes whose task's worker died: whatever trains them again does without the resume check
        self._unchecked: set[str] = set()
        self.repeats = Repeats(f"dagtune-{name}-")  # the events handled (its keys: `_task`)
        self.launched = 0
        self._started_count = 0  # tasks started (a fused group's members each count)
        self.dirty = True
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

    # ------------------------------------------------------------------ events

    def handle(self, event: TaskEvent) -> list[Outcome]:
        """Take one of the executor's events (matched by its type); returns what it means
        for trials."""
        running = self.running.get(event.task)
        self.events_seen += 1
        if isinstance(event, _ONCE) and not self.repeats.first(event):
            return []  # handled once though delivered twice
        match event:
            case StepDone():
                self.executed_steps += 1
                if self.fusion.holding:  # a group waits for this task's point
                    self.dirty = True
                self.cost.observe(event.node, event.seconds)
                if running is not None:
                    running.progress = max(running.progress, event.step)
                    self._progressed(event.task, running)
            case MetricsReported():
                node, step = event.node, event.step
                if self.plan.record_metrics(node, step, event.metrics):  # trials share the plan's point
                    point = self.plan.point_at(node, step)
                    return [MetricsKnown(node, step, point or MetricsPoint.of(step, event.metrics))]
            case CheckpointSaved():
                if self.plan.record_checkpoint(
                    event.node, event.step, CheckpointInfo(event.nbytes, event.sha256)
                ):
                    self.dirty = True
            case TaskStarted() if running is not None:
                running.worker, running.started = event.worker, event.time
                running.progress = event.step
                self._progressed(event.task, running)
                self.memory.hold(running.worker, None)
                self.memory.release(event.task)
            case StateLoaded():
                self.loads[event.origin] += 1
            case CheckpointDeclined():
                self.dirty = True
            case TrainerWarned():
                self.notices.show(event)
            case CheckpointCorrupt():
                self._on_corrupt(event)
                if running is not None:
                    self._retire(event.task, running, event.time)
                    self.repeats.ended(event.task)
            case TaskEnded() if running is not None:
                self._retire(event.task, running, event.time)
                self.repeats.ended(event.task)
                self._ended(running, event)
            case TaskFailed() if running is not None:
                self._retire(event.task, running, event.time)
                return self._failed(event.task, running, event)
            case TaskFailed(cause="timeout") if event.worker is not None:
                # a run of a task already ended here (Dask ran it again elsewhere) hangs: that
                # worker's thread is as lost as the first one's
                self.executor.abandon(event.task, event.worker)
            case FusionChecked():  # a fused task checked the trainer (`dagtune.coordinator._fusion`)
                self.fusion.verdict(event)
                self.dirty = True
        return []

    def _on_corrupt(self, event: CheckpointCorrupt) -> None:
        """A checkpoint failed verification on load: report it, drop it from the plan and
        delete it (write-once storage would otherwise keep the bad copy), so its work is
        planned again from an earlier point."""
        node, step = event.node, event.step
        message = f"corrupt checkpoint at ({node}, {step}) dropped and recomputed: {event.error}"
        self.incidents.append(message)
        log.warning("dagtune: %s", message)
        if node in self.plan.nodes:
            self.plan.drop_checkpoint(node, step)
        if self.store is not None:
            self.store.delete(self.trainer.identity, node, step)
        self.dirty = True

    def _progressed(self, key: str, running: Running) -> None:
        if self.planner is not None:
            self.planner.task_progressed(key, running.progress)
            if not running.claimed:
                self._redirect_due.add(key)

    def _retire(self, key: str, running: Running, until: float | None) -> None:
        """Task `key` ended, failed, was lost or found its checkpoint corrupt: free its slot,
        count its GPU time up to `until`; what its worker holds live is not reusable (an
        `_ended` task's may be)."""
        self.running.end(key)
        if self.planner is not None:
            self.planner.task_ended(key)
        self.memory.release(key)
        if running.started is not None and until is not None:
            self.gpu_seconds += running.slot.charge(running.started, until) * self.gpus_per_task
        self.dirty = True
        if running.worker is not None:
            self.memory.hold(running.worker, None)

    def _ended(self, running: Running, event: TaskEnded) -> None:
        """What the ended task's worker keeps live: the trainer at its end point, unless a
        fused task ran there (it leaves none) or a launched task counts on that worker."""
        if running.worker is not None:
            left = (event.node, event.step) if event.node else None
            kept = not running.slot.fused and not self.memory.promised(running.worker)
            self.memory.hold(running.worker, left if kept else None)

    def _failed(self, key: str, running: Running, event: TaskFailed) -> list[Outcome]:
        """Count a failure (a lost task's is not one, unless it took down its workers); a
        point failed past the retries, or failed by a check of the trainer's code (`retry`
        False, outside a fused group), is returned."""
        if event.lost:  # its worker died or went away
            # the resume check's second trainer may be what took the worker down (memory):
            # whatever trains these stages again does without it
            self._unchecked.update(segment.node for segment in running.task.segments)
        if event.cause == "timeout":  # its step hangs: the task still runs there
            self.executor.abandon(key, running.worker)
        if event.lost and not event.killed:
            return []  # the worker went away: the stage is simply planned again
        point, error, cause = (event.node, event.step), event.traceback or event.error, event.cause
        if event.killed:  # Dask gave up after the task took down several workers
            point, cause = (running.task.segments[0].node, running.task.start + 1), "workers"
            error = (
                f"{event.error}\nThe Dask workers running this stage died; the trainer may exhaust "
                "the worker's memory or crash in native code."
            )
        self._failures[point] = failures = self._failures.get(point, 0) + 1
        if running.slot.fused:  # whose failure it was is unknown: the retry runs it alone
            self.fusion.isolate(point)
        elif not event.retry:  # a failed check of the trainer's code: it would fail again
            return [PointFailed(point[0], point[1], error, cause)]
        if failures > self.max_retries:
            return [PointFailed(point[0], point[1], error, cause)]
        return []

    # ------------------------------------------------------------------ rounds

    def round(self) -> int:
        """If anything changed (or workers joined), plan a round, redirect running tasks and
        fill free slots; returns how many slots are still free (0: no round was due)."""
        slots = self.executor.slots()
        if slots > self._slots_seen:  # workers joined: fill them now, not at the next event
            self.dirty = True
        self._slots_seen = slots
        if not self.dirty:
            return 0
        self.dirty = False
        free = slots - self.running.slots_used()
        wanted = self.fusion.paths_wanted(free) if free > 0 else 0
        if self.planner is None:
            launches, pauses = self._round_rebuilt(wanted)
            due = set(self.running)
        else:
            launches, pauses = self._round_incremental(wanted)
            due, self._redirect_due = self._redirect_due, set()
        self._pause(pauses, due)
        for key in sorted((k for k in due if k in self.running), key=lambda k: self.running[k].number):
            self._redirect(key, self.running[key])
        self._launch(launches, free)
        return self.executor.slots() - self.running.slots_used()

    def _pause(self, pauses: dict[str, int], due: set[str]) -> None:
        """Ask the running tasks `pauses` names to pause (task -> step), the others to go on;
        the tasks whose pause changed are due a redirect."""
        for key in self._paused - pauses.keys():
            running = self.running.get(key)
            if running is not None:
                running.pause_at = None
                due.add(key)
        for key, step in pauses.items():
            self.running[key].pause_at = step
            due.add(key)
        self._paused = set(pauses)

    def _round_rebuilt(self, wanted: int) -> tuple[Launches, dict[str, int]]:
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

    def _round_incremental(self, wanted: int) -> tuple[Launches, dict[str, int]]:
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

    def _redirect(self, key: str, running: Running) -> None:
        task = running.task
        stop_at = max(running.claimed) if running.claimed else running.progress
        directive = Directive(
            frozenset(running.claimed - task.checkpoints),
            None if stop_at >= task.end else stop_at,
            running.pause_at,
        )
        if directive != running.directive:
            self.running.direct(key, directive)  # the points it needs may change
            self.executor.direct(key, directive)

    # ------------------------------------------------------------------ launching

    def _launch(self, launches: Launches, free: int) -> None:
        """Launch the round's paths: alone, or in fused groups of at most `free`."""
        if not self.fusion.on:
            for path, priority in launches:
                self._launch_task(self._task(path), priority)
            return
        groups = self._fuse(launches, free)
        self.demand += len(launches) - sum(len(group) for group in groups)
        for group in groups:
            if self.fusion.on:
                self._launch_group(group)
            else:  # measuring F found the trainer cannot fuse
                self._launch_task(*group[0])

    def _fuse(self, launches: Launches, free: int) -> list[list[tuple[PathTask, float]]]:
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

    def _task(self, path: list[Stage]) -> PathTask:
        """The task that trains `path` (a new key each time)."""
        first = path[0]
        segments = tuple(Segment(s.node, self.plan.nodes[s.node].config, s.start, s.end) for s in path)
        checkpoints = {s.end for s in path}
        for segment in segments:
            checkpoints.update(self.branch_points(segment))
        if self.checkpoint_every:
            every = self.checkpoint_every
            checkpoints.update(range((first.start // every + 1) * every, path[-1].end, every))
        source = first.source_point if first.source == "checkpoint" else None
        self.launched += 1
        # ends with the launch number, by which `Repeats` remembers the tasks that ended
        key = f"dagtune-{self.name}-{first.node[:8]}-{first.start}-{path[-1].end}-{self.launched}"
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
            checkpoint_interval=self.checkpoint_interval,
        )

    def _launch_task(self, task: PathTask, priority: float) -> None:
        source = task.source
        ending = () if source is None else (r.worker for r in self.running.ending_at(source))
        prefer = self.memory.prefer(task.key, source, ending)
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

    def work(self, since: dict) -> dict:
        """The work done since the report `since` was taken: steps executed, GPU-seconds (a
        stage still running counts up to now) and fused tasks launched (by their size; None
        when fusion was not asked for)."""
        now = self.executor.now()
        in_flight = self.running.busy_seconds(now) * self.gpus_per_task
        return {
            "executed_steps": self.executed_steps - since.get("executed_steps", 0),
            "gpu_seconds": self.gpu_seconds + in_flight - since.get("gpu_seconds", 0.0),
            "now": now,
            "group_sizes": self.fusion.sizes - Counter(since.get("group_sizes", {}))
            if self.fusion.asked
            else None,
        }
