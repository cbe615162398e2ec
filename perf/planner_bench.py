"""Planner scale for `python -m perf`: 10,000 and 100,000 trials in one plan (perf/planner.py)."""

from __future__ import annotations

from typing import Any

from perf.planner import benchmark as planner_benchmark


def benchmark(mode: str = "quick") -> dict[str, Any]:
    sizes = {"smoke": (1_000,), "quick": (10_000, 100_000), "full": (10_000, 100_000)}[mode]
    return {"rows": [planner_benchmark(n, trace=(mode == "full" or n <= 10_000)) for n in sizes]}


def markdown(result: dict[str, Any]) -> str:
    from perf.table import table

    return table(
        result["rows"],
        [
            ("trials", "trials"),
            ("nodes", "plan nodes"),
            ("stages", "stages"),
            ("merge_rate", "merge rate"),
            ("insert_mean_ms", "insert mean (ms)"),
            ("insert_p50_ms", "p50"),
            ("insert_p99_ms", "p99"),
            ("build_s", "tree build (s)"),
            ("rebuild_s", "re-plan (s)"),
            ("plan_heap_mib", "plan heap (MiB)"),
            ("peak_rss_mib", "process peak RSS (MiB)"),
        ],
    ) + (
        "\n\nTargets: < 1 ms per insert and < 2 s per full tree build at 100,000 trials. The "
        "slowest single inserts are the ones a full garbage collection lands in (reported by "
        "`python perf/planner.py`). Peak RSS includes the torch import (about 230 MiB)."
    )
