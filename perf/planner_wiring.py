"""The coordinator re-planning incrementally, against re-planning from scratch (simulated).

`PlannedCoordinator` is the wiring of `dagtune.planner.IncrementalPlanner` into the
coordinator, as a subclass until the coordinator takes it itself: launches, progress and ends
of tasks go to the planner; a scheduling round picks from the planner's ready queue instead
of rebuilding the stage tree, takes the priorities it keeps, and directs each running task
with the points the tree relies on it for (`wanted_of`). Everything else is the coordinator's.

Two workloads run with each coordinator on the simulated executor:

- the scale case of issue 15: a GridSearch of N distinct 2-step trials (constant learning
  rate x momentum) on 4 virtual workers, timing the whole study (coordinator CPU time: the
  simulator's training is virtual);
- the paper's ResNet56 studies (perf/paper.py) with critical-path scheduling on 40 GPUs:
  executed and unique steps and the makespan must not get worse.

    python perf/planner_wiring.py [--sizes 400,900,1600] [--planned-sizes 3600,10000]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import dagtune as dt
import dagtune.study
from dagtune.algos import GridSearch
from dagtune.coordinator import Coordinator
from dagtune.planner import IncrementalPlanner
from dagtune.scheduling import Pausable
from dagtune.sim import SimulatedExecutor, SyntheticTrainer

#: relative change of a step-cost estimate that re-prices the stages priced with it
TOLERANCE = 0.05


class PlannedCoordinator(Coordinator):
    """The coordinator with an incremental planner (see the module docstring)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.planner = IncrementalPlanner(self.plan, self.cost, self.policy, tolerance=TOLERANCE)

    def handle(self, event: dict) -> None:
        super().handle(event)
        running = self.running.get(event["task"])
        if running is not None and event["kind"] in ("start", "step"):
            self.planner.task_progressed(event["task"], running.progress)

    def _retire(self, key, running, event) -> None:
        super()._retire(key, running, event)
        self.planner.task_ended(key)

    def _launch(self, path, priority) -> None:
        super()._launch(path, priority)
        key = next(reversed(self.running))
        self.planner.task_launched(key, [(s.node, s.start, s.end) for s in path], path[0].start)

    def _schedule_once(self) -> int:
        self._dirty = False
        planner = self.planner
        for running in self.running.values():
            running.pause_at = None
        free = self.executor.slots() - len(self.running)
        picked = planner.pick(free) if free > 0 else []
        priorities = [planner.priorities[path[0].index] for path in picked]
        first = {path[0].index for path in picked}
        paths = [[stage.snapshot() for stage in path] for path in picked]  # launching changes them
        self.demand = planner.ready_count() - len(paths)
        if self.demand > 0 and self.running:
            waiting = (s for s in planner.ready() if s.index not in first)
            for key, step in self.policy.preempt_ordered(
                waiting, planner.priorities, self._pausable_now()
            ).items():
                self.running[key].pause_at = step
        for key, running in self.running.items():
            running.claimed = {step for _, step in planner.wanted_of(key)}
            self._redirect(key, running)
        for path, priority in zip(paths, priorities):
            self._launch(path, priority)
        return self.executor.slots() - len(self.running)

    def _pausable_now(self) -> list[Pausable]:
        """`Coordinator._pausable` from the planner's stages sourced from each task."""
        found = []
        for key, running in self.running.items():
            task = running.task
            step = min((s.end for s in task.segments if running.progress < s.end < task.end), default=None)
            if step is None:
                continue
            own = self._seconds(task, step, task.end)
            hanging = [
                self._seconds(task, step, s.source_point[1]) + self.planner.priorities[s.index]
                for s in self.planner.sourced_from(key)
                if s.source_point[1] > step
            ]
            found.append(Pausable(key, step, max([own, *hanging])))
        return found


def grid(n: int) -> list[dict]:
    side = round(n**0.5)
    return [{"lr": 1e-4 * (i + 1), "momentum": j / side} for i in range(side) for j in range(n // side)]


def run_grid(n: int, planned: bool) -> dict:
    configs = grid(n)
    coordinator = PlannedCoordinator if planned else Coordinator
    with mock.patch.object(dagtune.study, "Coordinator", coordinator):
        began, cpu = time.perf_counter(), time.process_time()
        with dt.Study(SyntheticTrainer, name="scale", executor=SimulatedExecutor(4)) as study:
            result = study.run(GridSearch(configs, metric="val_loss", mode="min", steps=2))
        report = result.report
    return {
        "trials": len(configs),
        "coordinator": "incremental" if planned else "rebuild",
        "seconds": round(time.perf_counter() - began, 2),
        "cpu_seconds": round(time.process_time() - cpu, 2),
        "ms_per_trial": round((time.process_time() - cpu) / len(configs) * 1e3, 2),
        "executed": report["executed_steps"],
        "unique": report["unique_steps"],
        "makespan": round(report["makespan_seconds"], 1),
    }


def run_paper(planned: bool) -> list[dict]:
    from perf import paper

    rows = []
    coordinator = PlannedCoordinator if planned else Coordinator
    for study in paper.STUDIES:
        configs = list(study.space())
        with mock.patch.object(dagtune.study, "Coordinator", coordinator):
            found = paper.run_study(study, configs, True, "critical_path", paper.WORKERS)
        rows.append(
            {
                "study": study.name,
                "coordinator": "incremental" if planned else "rebuild",
                "executed": found["executed_steps"],
                "unique": found["unique_steps"],
                "makespan_hours": round(found["makespan_hours"], 3),
                "over_precedence_bound": round(found["makespan_over_precedence_bound"], 4),
                "simulated_in_seconds": round(found["simulated_in_seconds"], 1),
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="400,900,1600")
    parser.add_argument("--planned-sizes", default="3600,10000")
    parser.add_argument("--paper", action="store_true", help="also the paper's ResNet56 studies")
    args = parser.parse_args()
    for n in [int(x) for x in args.sizes.split(",") if x]:
        for planned in (False, True):
            print(run_grid(n, planned), flush=True)
    for n in [int(x) for x in args.planned_sizes.split(",") if x]:
        print(run_grid(n, True), flush=True)
    if args.paper:
        for planned in (False, True):
            for row in run_paper(planned):
                print(row, flush=True)


if __name__ == "__main__":
    main()
