"""Planner scale for `python -m perf`: 10,000 and 100,000 trials in one plan (perf/planner.py),
and the incremental planner's cost per operation against a re-plan from scratch at 1,000,
10,000 and 100,000 trials (``perf/planner.py --incremental``).

Each size runs in a fresh subprocess (``python perf/planner.py --json``) that only builds
the plan, so its memory figures are the plan's and the tree's, not those of whatever ran
before in the benchmark process (torch, Ray, Dask clusters).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

PLANNER = Path(__file__).resolve().parent / "planner.py"


def measure(n: int, trace: bool) -> dict[str, Any]:
    command = [sys.executable, str(PLANNER), "--trials", str(n), "--json"] + (
        ["--tracemalloc"] if trace else []
    )
    return _run(command)


def measure_incremental(n: int, operations: int) -> dict[str, Any]:
    return _run(
        [
            sys.executable,
            str(PLANNER),
            "--incremental",
            "--trials",
            str(n),
            "--operations",
            str(operations),
            "--json",
        ]
    )


def _run(command: list[str]) -> dict[str, Any]:
    completed = subprocess.run(command, capture_output=True, text=True, check=True, timeout=1800)
    return json.loads(completed.stdout.strip().splitlines()[-1])


def benchmark(mode: str = "quick") -> dict[str, Any]:
    sizes = {"smoke": (1_000,), "quick": (10_000, 100_000), "full": (10_000, 100_000)}[mode]
    incremental = {"smoke": (1_000,), "quick": (1_000, 10_000, 100_000), "full": (1_000, 10_000, 100_000)}[
        mode
    ]
    operations = {"smoke": 1_000, "quick": 10_000, "full": 30_000}[mode]
    return {
        "rows": [measure(n, trace=mode == "full" or n < 10_000) for n in sizes],
        "incremental": [measure_incremental(n, operations) for n in incremental],
    }


def markdown(result: dict[str, Any]) -> str:
    from perf.table import table

    rows = result["rows"]
    timing = table(
        rows,
        [
            ("trials", "trials"),
            ("nodes", "plan nodes"),
            ("stages", "stages"),
            ("merge_rate", "merge rate"),
            ("insert_mean_ms", "insert mean (ms)"),
            ("insert_p50_ms", "p50"),
            ("insert_p99_ms", "p99"),
            ("insert_max_ms", "max"),
            ("build_s", "tree build (s)"),
            ("replan_tree_s", "re-plan: tree (s)"),
            ("replan_priorities_s", "priorities (s)"),
            ("replan_pick_s", "pick 40 paths (s)"),
            ("replan_s", "re-plan total (s)"),
        ],
    )
    stalls = table(
        rows,
        [
            ("trials", "trials"),
            ("inserts_over_10x_median", "inserts > 10x the median"),
            ("slow_with_full_gc", "of which a full GC ran in"),
            ("slow_with_young_gc", "a young-generation GC"),
            ("slow_max_without_gc_ms", "slowest with no GC (ms)"),
            ("inserts_gc_gen2", "full GCs during the inserts"),
            ("inserts_gc_gen2_max_ms", "longest full GC (ms)"),
            ("inserts_gc_gen2_total_ms", "all full GCs (ms)"),
        ],
    )
    memory = table(
        rows,
        [
            ("trials", "trials"),
            ("rss_before_mib", "process RSS before (MiB)"),
            ("rss_trials_mib", "+ sampled trials (MiB)"),
            ("rss_plan_mib", "+ plan (MiB)"),
            ("rss_tree_mib", "+ stage tree (MiB)"),
            ("plan_heap_mib", "plan heap, tracemalloc (MiB)"),
            ("build_heap_peak_mib", "tree build heap peak (MiB)"),
        ],
    )
    sections = [
        timing,
        "Targets: < 1 ms per insert and < 2 s per full tree build at 100,000 trials. A re-plan is "
        "what the coordinator does every scheduling round: rebuild the stage tree, compute the "
        "critical-path priorities, and pick paths for the free workers (here 40); `CriticalPath.pick` "
        "computes the priorities a second time, as dagtune's coordinator currently does. Best of 3.",
        "Stalls: an insert is an outlier when it takes over 10 times the median. A full (generation-2) "
        "garbage collection walks every object of the plan, so the inserts it lands in stall longest "
        "and its pause grows with the plan; outliers with no collection at all are the operating "
        "system's (other processes on the same 2 cores preempting this one).",
        stalls,
        "Memory, measured in a subprocess that only builds the plan (resident-set growth after a "
        "full collection; the RSS before includes Python, numpy and dagtune's imports). "
        "tracemalloc counts the Python heap exactly but slows the inserts several times, so it "
        "runs in a second pass, at both sizes with --full only (and in smoke runs).",
        memory,
    ]
    if result.get("incremental"):
        sections += incremental_markdown(result["incremental"])
    return "\n\n".join(sections)


def incremental_markdown(rows: list[dict[str, Any]]) -> list[str]:
    from perf.table import table

    summary = table(
        rows,
        [
            ("trials", "trials"),
            ("stages", "stages"),
            ("rebuild_round_s", "re-plan from scratch (s)"),
            ("first_settle_s", "planner's first settle (s)"),
            ("planner_rss_mib", "planner RSS (MiB)"),
            ("rebuilt_nodes", "node rebuilds, all operations"),
            ("estimate_refreshes", "estimate refreshes"),
            ("nodes_repriced", "node re-pricings"),
        ],
    )
    operations = [
        {"trials": row["trials"], **op, "rebuild_ms": row["rebuild_round_s"] * 1e3}
        for row in rows
        for op in row["operations"]
    ]
    per_operation = table(
        operations,
        [
            ("trials", "trials"),
            ("operation", "operation"),
            ("count", "count"),
            ("mean_ms", "mean (ms)"),
            ("p99_ms", "p99 (ms)"),
            ("max_ms", "max (ms)"),
            ("rebuild_ms", "re-plan from scratch (ms)"),
            ("rebuild_over_mean", "re-plan / mean"),
        ],
    )
    return [
        "### Incremental planning: per operation against a re-plan from scratch",
        "The same plans with an `IncrementalPlanner` following them (priorities re-priced when an "
        "estimate moves by more than 5%), then a stream of what a coordinator does with 40 running "
        "paths: a step of a running task (its cost measured), a stage end (checkpoint and metrics "
        "recorded, the trials waiting there complete), a task end (its slot filled from `pick`), a "
        "new trial, a stopped trial. Each operation is timed with the planner's update and, except "
        "steps, a `pick` for the free slots. A re-plan from scratch is what the coordinator does "
        "today after each of them but the steps: the tree with the running tasks, the priorities "
        "once, the pick (best of 6, before and after the stream).",
        summary,
        per_operation,
        "A step's maximum is an estimate refresh: when the mean step cost, which prices every node "
        "that has no measured ancestor, moves by more than 5%, every such stage is re-priced, "
        "O(stages); the refreshes column counts them with the node estimates' own.",
    ]
