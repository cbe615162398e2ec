"""Planner benchmark: 100,000 random ResNet56-like trials in one search plan.

Adds the trials one by one (each at a random SHA rung: 15, 30, 60 or 120 epochs) and builds
the stage tree, reporting the time per insert (mean, p50, p99, max, and the full garbage
collections that land in inserts: the outliers), the tree build time, and a re-plan as the
coordinator does it every scheduling round: rebuild the tree, compute the critical-path
priorities, pick paths for 40 free workers. Memory is measured in this process, which only
builds the plan (run it as a subprocess, as `python -m perf` does, so nothing else pollutes
it): the resident-set growth from sampling the trials to the plan (after a full collection)
and to the tree, and with `--tracemalloc` the Python heap of the plan and the tree's peak in
a second, slower pass. Targets on the development machine: < 1 ms per insert and < 2 s per
full tree build at 100,000 trials.

With `--incremental` it measures the incremental planner instead (`IncrementalPlanner`): the
same plan with a planner following it, then a stream of what a coordinator does (steps of
the running tasks with their cost measurements, stage ends with checkpoints and metrics that
complete trials, tasks ending and the freed slots filled, new trials, stopped trials), each
operation timed with the planner's update and, when a coordinator would re-plan, a pick for
its free slots; against one re-plan from scratch on the same plan (tree, priorities once, pick),
as the coordinator does today at every such operation.

    python perf/planner.py [--trials N] [--seed S] [--tracemalloc] [--profile] [--json]
    python perf/planner.py --incremental [--trials N] [--operations K] [--json]

`--profile` prints the top functions of a cProfile of the inserts and the build (or of the
incremental operations).
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import json
import pstats
import random
import resource
import statistics
import sys
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dagtune.plan import SearchPlan, build_stage_tree
from dagtune.planner import IncrementalPlanner
from dagtune.records import CheckpointInfo
from dagtune.scheduling import CostModel, CriticalPath, critical_path_priorities
from perf.spaces import resnet56_random

SLOTS = 40  # free workers a re-plan picks paths for

RUNGS = (15, 30, 60, 120)


def make_trials(n: int, seed: int) -> list[tuple[dict, int]]:
    rng = random.Random(seed)
    return [(config, rng.choice(RUNGS)) for config in resnet56_random(n, seed)]


class GCPauses:
    """Collects the duration of every garbage collection of a generation while active, and
    counts the collections of any generation (`collections`)."""

    def __init__(self, generation: int = 2):
        self.generation, self.pauses, self._start = generation, [], 0.0
        self.collections = 0  # of any generation
        self.full = 0  # of `generation`

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._start = time.perf_counter()
            return
        self.collections += 1
        if info["generation"] == self.generation:
            self.full += 1
            self.pauses.append(time.perf_counter() - self._start)

    def __enter__(self) -> GCPauses:
        gc.callbacks.append(self)
        return self

    def __exit__(self, *exc) -> None:
        gc.callbacks.remove(self)


def insert_all(trials, watch: GCPauses | None = None) -> tuple[SearchPlan, list[int], list[int]]:
    """The plan, each insert's nanoseconds, and each insert's garbage collections (0: none,
    1: a young generation only, 2: a full collection)."""
    plan = SearchPlan()
    times, collected = [], []
    clock = time.perf_counter_ns
    for waiter, (config, steps) in enumerate(trials):
        before = (watch.collections, watch.full) if watch else (0, 0)
        start = clock()
        plan.add_request(config, steps, waiter)
        times.append(clock() - start)
        if watch is not None:
            collected.append(2 if watch.full > before[1] else 1 if watch.collections > before[0] else 0)
    return plan, times, collected


def rss_mib() -> float:
    """This process's resident set now (not its peak), after a full collection."""
    gc.collect()
    with open("/proc/self/statm") as statm:
        pages = int(statm.read().split()[1])
    return pages * resource.getpagesize() / 2**20


def replan(plan: SearchPlan) -> dict[str, float]:
    """One scheduling round of the coordinator on `plan`: tree, priorities, picked paths."""
    cost = CostModel()
    began = time.perf_counter()
    tree = build_stage_tree(plan)
    built = time.perf_counter()
    critical_path_priorities(tree, cost, plan)
    prioritized = time.perf_counter()
    CriticalPath().pick(tree, SLOTS, cost, plan)  # computes the priorities again, as dagtune does
    picked = time.perf_counter()
    return {
        "replan_tree_s": built - began,
        "replan_priorities_s": prioritized - built,
        "replan_pick_s": picked - prioritized,
        "replan_s": picked - began,
    }


def percentile(sorted_values: list[int], q: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def benchmark(n: int, seed: int = 0, trace: bool = False, profile: bool = False) -> dict:
    baseline = rss_mib()
    started = time.perf_counter()
    trials = make_trials(n, seed)
    sampling = time.perf_counter() - started
    sampled = rss_mib()

    gc.collect()
    with GCPauses() as full_collections:
        plan, times, collected = insert_all(trials, full_collections)
    planned = rss_mib()
    started = time.perf_counter()
    tree = build_stage_tree(plan)
    build = time.perf_counter() - started
    with_tree = rss_mib()
    rounds = [replan(plan) for _ in range(3)]
    best = {key: min(r[key] for r in rounds) for key in rounds[0]}

    ordered = sorted(times)
    trial_steps = sum(steps for _, steps in trials)
    pauses = sorted(full_collections.pauses, reverse=True)
    median = percentile(ordered, 0.50)
    slow = [i for i, t in enumerate(times) if t > 10 * median]
    result = {
        "trials": n,
        "nodes": len(plan.nodes),
        "stages": len(tree),
        "trial_steps": trial_steps,
        "unique_steps": tree.total_steps,  # a fresh plan: the tree trains exactly the unique steps
        "merge_rate": round(trial_steps / tree.total_steps, 3),
        "sampling_s": round(sampling, 2),
        "insert_total_s": round(sum(times) / 1e9, 2),
        "insert_mean_ms": round(statistics.fmean(times) / 1e6, 4),
        "insert_p50_ms": round(percentile(ordered, 0.50) / 1e6, 4),
        "insert_p99_ms": round(percentile(ordered, 0.99) / 1e6, 4),
        "insert_max_ms": round(ordered[-1] / 1e6, 2),
        "inserts_over_10x_median": len(slow),
        "slow_with_full_gc": sum(1 for i in slow if collected[i] == 2),
        "slow_with_young_gc": sum(1 for i in slow if collected[i] == 1),
        "slow_max_without_gc_ms": round(
            max((times[i] for i in slow if not collected[i]), default=0) / 1e6, 2
        ),
        # the slowest inserts are the ones a full (generation 2) garbage collection lands in
        "inserts_gc_gen2": len(pauses),
        "inserts_gc_gen2_max_ms": round(pauses[0] * 1e3, 1) if pauses else 0.0,
        "inserts_gc_gen2_total_ms": round(sum(pauses) * 1e3, 1),
        "build_s": round(build, 3),
        **{key: round(value, 3) for key, value in best.items()},
        "rss_before_mib": round(baseline, 1),
        "rss_trials_mib": round(sampled - baseline, 1),
        "rss_plan_mib": round(planned - sampled, 1),
        "rss_tree_mib": round(with_tree - planned, 1),
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }
    if trace:  # a second pass: tracemalloc slows Python down several times
        del plan, tree
        gc.collect()
        tracemalloc.start()
        plan, _, _ = insert_all(trials)
        after_inserts = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        tree = build_stage_tree(plan)
        result["plan_heap_mib"] = round(after_inserts / 2**20, 1)
        result["build_heap_peak_mib"] = round((tracemalloc.get_traced_memory()[1] - after_inserts) / 2**20, 1)
        tracemalloc.stop()
    if profile:
        profiler = cProfile.Profile()
        profiler.enable()
        plan, _, _ = insert_all(trials)
        build_stage_tree(plan)
        profiler.disable()
        pstats.Stats(profiler, stream=sys.stderr).sort_stats("cumulative").print_stats(25)
    return result


# ---------------------------------------------------------------------------- incremental

#: relative change of a step-cost estimate that re-prices the stages using it
TOLERANCE = 0.05


def _step_seconds(node: str) -> float:
    """A node's simulated seconds per step: 0.5 to 1.4, fixed per node (as batch sizes make it)."""
    return 0.5 + int(node[:4], 16) % 10 / 10


class _Workload:
    """A coordinator's stream of operations on a plan, driving an `IncrementalPlanner`:
    `SLOTS` running paths advance step by step; each operation is timed with the planner's
    update and, where a coordinator re-plans, a pick for the free slots."""

    def __init__(self, plan: SearchPlan, planner: IncrementalPlanner, cost: CostModel, extra, seed: int):
        self.plan, self.planner, self.cost = plan, planner, cost
        self.extra = iter(extra)  # trials to submit later
        self.rng = random.Random(seed)
        self.running: dict[str, list] = {}  # key -> [segments, progress]
        self.launched = 0
        self.waiter = 10**9
        self.times: dict[str, list[int]] = {}

    def fill(self) -> None:
        for path in self.planner.pick(SLOTS - len(self.running)):
            key = f"task-{self.launched}"
            self.launched += 1
            segments = [(s.node, s.start, s.end) for s in path]
            self.running[key] = [segments, path[0].start]
            self.planner.task_launched(key, segments, path[0].start)

    def _timed(self, name: str, operation) -> None:
        began = time.perf_counter_ns()
        operation()
        self.planner.settle()
        self.times.setdefault(name, []).append(time.perf_counter_ns() - began)

    def _replan(self) -> None:
        self.planner.pick(SLOTS - len(self.running))

    def step(self) -> None:
        if self.rng.random() < 0.05:
            self._timed("submit a trial", self._submit)
            return
        if self.rng.random() < 0.03 and self.plan.active:
            point = next(iter(self.plan.active))  # the oldest request (choosing costs no O(n) list)
            self._timed("stop a trial", lambda: self._stop(point))
            return
        if not self.running:
            self.fill()
            return
        key = self.rng.choice(list(self.running))
        segments, progress = self.running[key]
        progress += 1
        node = next(n for n, s, e in segments if s < progress <= e)
        self.running[key][1] = progress

        def advance() -> None:
            self.cost.observe(node, _step_seconds(node))
            self.planner.task_progressed(key, progress)

        self._timed("step (cost measured)", advance)
        if any(progress == e for _, _, e in segments):
            self._timed(
                "stage end (checkpoint, metrics, trials complete)", lambda: self._stage_end(node, progress)
            )
        if progress == segments[-1][2]:
            self._timed("task end, freed slot filled", lambda: self._end(key))

    def _submit(self) -> None:
        config, steps = next(self.extra)
        self.waiter += 1
        self.plan.add_request(config, steps, self.waiter)
        self._replan()

    def _stop(self, point: tuple[str, int]) -> None:
        node, steps = point
        for waiter in list(self.plan.active[(node, steps)]):
            self.plan.remove_request(node, steps, waiter)
        self._replan()

    def _stage_end(self, node: str, step: int) -> None:
        self.plan.record_checkpoint(node, step, CheckpointInfo(1, ""))
        self.plan.record_metrics(node, step, {"val_acc": 0.5})
        for waiter in list(self.plan.active.get((node, step), ())):
            self.plan.remove_request(node, step, waiter)
        self._replan()

    def _end(self, key: str) -> None:
        del self.running[key]
        self.planner.task_ended(key)
        self.fill()


def rebuild_round(plan: SearchPlan, planner: IncrementalPlanner, cost: CostModel) -> float:
    """Seconds of one re-plan from scratch: tree (with the running tasks), priorities once, pick."""
    began = time.perf_counter()
    tree = build_stage_tree(plan, planner.live.tasks)
    priority = critical_path_priorities(tree, cost, plan)
    CriticalPath().pick(tree, SLOTS, cost, plan, priority)
    return time.perf_counter() - began


def incremental_benchmark(n: int, seed: int = 0, operations: int = 3000, profile: bool = False) -> dict:
    trials = make_trials(n + operations, seed)
    plan, _, _ = insert_all(trials[:n])
    cost = CostModel()
    gc.collect()
    before = rss_mib()
    began = time.perf_counter()
    planner = IncrementalPlanner(plan, cost, CriticalPath(), tolerance=TOLERANCE)
    planner.settle()
    first_settle = time.perf_counter() - began
    planner_rss = rss_mib() - before
    stages = len(planner)
    workload = _Workload(plan, planner, cost, trials[n:], seed)
    workload.fill()
    rounds_before = [rebuild_round(plan, planner, cost) for _ in range(3)]
    profiler = cProfile.Profile() if profile else None
    if profiler is not None:
        profiler.enable()
    gc.collect()
    for _ in range(operations):
        workload.step()
    if profiler is not None:
        profiler.disable()
        pstats.Stats(profiler, stream=sys.stderr).sort_stats("cumulative").print_stats(25)
    rounds_after = [rebuild_round(plan, planner, cost) for _ in range(3)]
    rebuild = min(min(rounds_before), min(rounds_after))
    rows = []
    for name, times in workload.times.items():
        ordered = sorted(times)
        mean = statistics.fmean(times) / 1e9
        rows.append(
            {
                "operation": name,
                "count": len(times),
                "mean_ms": round(mean * 1e3, 4),
                "p99_ms": round(percentile(ordered, 0.99) / 1e6, 3),
                "max_ms": round(ordered[-1] / 1e6, 2),
                "rebuild_over_mean": round(rebuild / mean, 1),
            }
        )
    return {
        "trials": n,
        "stages": stages,
        "stages_at_end": len(planner),
        "first_settle_s": round(first_settle, 3),
        "planner_rss_mib": round(planner_rss, 1),
        "rebuild_round_s": round(rebuild, 4),
        "rebuilt_nodes": planner.live.rebuilds,
        "estimate_refreshes": planner.pricing.refreshes,
        "nodes_repriced": planner.pricing.repriced,
        "operations": rows,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tracemalloc", action="store_true", help="also measure Python heap use")
    parser.add_argument("--profile", action="store_true", help="cProfile the inserts and the build")
    parser.add_argument("--json", action="store_true", help="print only the result, as one JSON line")
    parser.add_argument("--incremental", action="store_true", help="measure the incremental planner")
    parser.add_argument("--operations", type=int, default=3000, help="incremental: operations to time")
    args = parser.parse_args()
    if args.incremental:
        result = incremental_benchmark(args.trials, args.seed, args.operations, args.profile)
        print(json.dumps(result) if args.json else json.dumps(result, indent=2))
        return
    result = benchmark(args.trials, args.seed, args.tracemalloc, args.profile)
    if args.json:
        print(json.dumps(result))
        return
    print(json.dumps(result, indent=2))
    verdict = {
        "insert < 1 ms (mean)": result["insert_mean_ms"] < 1.0,
        "build < 2 s": result["build_s"] < 2.0,
        "re-plan < 2 s": result["replan_s"] < 2.0,
    }
    print("  ".join(f"{k}: {'yes' if v else 'NO'}" for k, v in verdict.items()))


if __name__ == "__main__":
    main()
