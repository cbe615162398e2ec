"""Planner benchmark: 100,000 random ResNet56-like trials in one search plan.

Adds the trials one by one (each at a random SHA rung: 15, 30, 60 or 120 epochs) and builds
the stage tree, reporting the time per insert (mean, p50, p99, max), the tree build time
(first build, and a rebuild of the unchanged plan) and the peak memory. Targets on the
development machine: < 1 ms per insert and < 2 s per full tree build at 100,000 trials.

    python perf/planner.py [--trials N] [--seed S] [--tracemalloc] [--profile]

`--tracemalloc` measures the Python heap peak of the plan and the tree in a second, slower
pass; `--profile` prints the top functions of a cProfile of the inserts and the build.
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
from perf.spaces import resnet56_random

RUNGS = (15, 30, 60, 120)


def make_trials(n: int, seed: int) -> list[tuple[dict, int]]:
    rng = random.Random(seed)
    return [(config, rng.choice(RUNGS)) for config in resnet56_random(n, seed)]


class GCPauses:
    """Collects the duration of every garbage collection of a generation while active."""

    def __init__(self, generation: int = 2):
        self.generation, self.pauses, self._start = generation, [], 0.0

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        elif info["generation"] == self.generation:
            self.pauses.append(time.perf_counter() - self._start)

    def __enter__(self) -> GCPauses:
        gc.callbacks.append(self)
        return self

    def __exit__(self, *exc) -> None:
        gc.callbacks.remove(self)


def insert_all(trials) -> tuple[SearchPlan, list[int]]:
    plan = SearchPlan()
    times = []
    clock = time.perf_counter_ns
    for waiter, (config, steps) in enumerate(trials):
        start = clock()
        plan.add_request(config, steps, waiter)
        times.append(clock() - start)
    return plan, times


def percentile(sorted_values: list[int], q: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def benchmark(n: int, seed: int = 0, trace: bool = False, profile: bool = False) -> dict:
    started = time.perf_counter()
    trials = make_trials(n, seed)
    sampling = time.perf_counter() - started

    gc.collect()
    with GCPauses() as full_collections:
        plan, times = insert_all(trials)
    started = time.perf_counter()
    tree = build_stage_tree(plan)
    build = time.perf_counter() - started
    started = time.perf_counter()
    build_stage_tree(plan)
    rebuild = time.perf_counter() - started

    ordered = sorted(times)
    trial_steps = sum(steps for _, steps in trials)
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
        # the slowest inserts are the ones a full (generation 2) garbage collection lands in
        "inserts_gc_gen2": len(full_collections.pauses),
        "inserts_gc_gen2_max_ms": round(max(full_collections.pauses, default=0.0) * 1e3, 1),
        "build_s": round(build, 3),
        "rebuild_s": round(rebuild, 3),
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }
    if trace:  # a second pass: tracemalloc slows Python down several times
        del plan, tree
        gc.collect()
        tracemalloc.start()
        plan, _ = insert_all(trials)
        after_inserts = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        tree = build_stage_tree(plan)
        result["plan_heap_mib"] = round(after_inserts / 2**20, 1)
        result["build_heap_peak_mib"] = round((tracemalloc.get_traced_memory()[1] - after_inserts) / 2**20, 1)
        tracemalloc.stop()
    if profile:
        profiler = cProfile.Profile()
        profiler.enable()
        plan, _ = insert_all(trials)
        build_stage_tree(plan)
        profiler.disable()
        pstats.Stats(profiler, stream=sys.stderr).sort_stats("cumulative").print_stats(25)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tracemalloc", action="store_true", help="also measure Python heap use")
    parser.add_argument("--profile", action="store_true", help="cProfile the inserts and the build")
    args = parser.parse_args()
    result = benchmark(args.trials, args.seed, args.tracemalloc, args.profile)
    print(json.dumps(result, indent=2))
    verdict = {
        "insert < 1 ms (mean)": result["insert_mean_ms"] < 1.0,
        "build < 2 s": result["build_s"] < 2.0,
    }
    print("  ".join(f"{k}: {'yes' if v else 'NO'}" for k, v in verdict.items()))


if __name__ == "__main__":
    main()
