"""Trial fusion at the study level: one grid of tiny-model schedules as a fused study and as
an unfused one, side by side on one LocalCluster of 2 single-threaded worker processes.

The grid (learning-rate schedules x momentum ramps x weight decays of a 30-64-2 MLP, one
epoch of 128 batches per step) shares prefixes, so both studies train each unique step once;
the fused one (``Study(fuse=16)``) trains the stages that start together as fused tasks of up
to 16 trials on one worker slot each. The studies alternate (unfused, fused, unfused, fused in
quick mode), each with its own storage so neither reuses the other's results; the cluster
start-up and a warm-up study of each kind (imports, first calls on the workers) are not timed. Reported per study: wall time of `Study.run`, trial-steps per second
(the trials' steps over the wall time), executed and unique steps, the number of fused tasks
and their mean size, and the largest difference of a trial's final metrics between the two.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from typing import Any

import dagtune as dt
from dagtune.algos import GridSearch

WORKERS = 2
FUSE = 16


def space(mode: str) -> dt.Grid:
    """32 trials (4 in smoke mode) whose schedules branch at steps 3 and 5."""
    if mode == "smoke":
        return dt.Grid({"lr": [0.1, 0.05], "momentum": [0.9, 0.5], "batch_size": [32]})
    return dt.Grid(
        {
            "lr": [dt.Constant(0.1), dt.MultiStep(0.1, [5], 0.1), dt.Constant(0.05), dt.Constant(0.02)],
            "momentum": [0.9, 0.5, 0.0, dt.Steps([0.5, 0.9], [3])],
            "weight_decay": [0.0, 1e-4],
            "batch_size": [32],
        }
    )


def run_study(client: Any, trainer: type, kwargs: dict, fuse: bool | int, steps: int, mode: str) -> dict:
    """One study of the grid on `client`'s cluster; its figures."""
    with (
        tempfile.TemporaryDirectory() as storage,
        dt.Study(trainer, kwargs, name="perf-fusion", storage=storage, client=client, fuse=fuse) as study,
    ):
        sizes: list[int] = []
        launch_group = study.executor.launch_group

        def record(tasks: list, priority: float = 0.0, prefer: str | None = None) -> None:
            sizes.append(len(tasks))
            launch_group(tasks, priority, prefer)

        study.executor.launch_group = record
        began = time.perf_counter()
        result = study.run(GridSearch(space(mode), metric="val_loss", mode="min", steps=steps))
        wall = time.perf_counter() - began
        finals = {repr(t.config): t.metrics for t in study.coordinator.trials.values()}
    report = result.report
    return {
        "study": f"fused (fuse={fuse})" if fuse else "unfused",
        "wall_seconds": wall,
        "trials": report["trials"],
        "trial_steps": report["trial_steps"],
        "unique_steps": report["unique_steps"],
        "executed_steps": report["executed_steps"],
        "trial_steps_per_second": report["trial_steps"] / wall,
        "fused_tasks": len(sizes),
        "mean_members": statistics.fmean(sizes) if sizes else 0.0,
        "finals": finals,
    }


def compare(trainer: type, kwargs: dict, mode: str) -> dict[str, Any]:
    """The unfused and the fused study, alternating (`mode`: smoke, quick or full)."""
    from distributed import Client

    from dagtune.cluster import embedded_cluster  # loads distributed

    steps = 2 if mode == "smoke" else 10
    rounds = {"smoke": 1, "quick": 2, "full": 3}[mode]
    runs: dict[str, list[dict]] = {"unfused": [], "fused": []}
    with embedded_cluster(WORKERS, None, False) as cluster, Client(cluster) as client:
        for fuse in (False, FUSE):  # warm-up, not timed: imports and first calls on the workers
            run_study(client, trainer, kwargs, fuse, 1, "smoke")
        for _ in range(rounds):
            runs["unfused"].append(run_study(client, trainer, kwargs, False, steps, mode))
            runs["fused"].append(run_study(client, trainer, kwargs, FUSE, steps, mode))
            print(
                f"[perf] fusion study: unfused {runs['unfused'][-1]['wall_seconds']:.1f} s, "
                f"fused {runs['fused'][-1]['wall_seconds']:.1f} s",
                flush=True,
            )
    best = {kind: min(found, key=lambda r: r["wall_seconds"]) for kind, found in runs.items()}
    unfused, fused = best["unfused"], best["fused"]
    difference = max(
        abs(fused["finals"][config][name] - value)
        for config, metrics in unfused["finals"].items()
        for name, value in metrics.items()
    )
    rows = [{k: v for k, v in run.items() if k != "finals"} for run in (unfused, fused)]
    return {
        "steps": steps,
        "rounds": rounds,
        "rows": rows,
        "speedup": unfused["wall_seconds"] / fused["wall_seconds"],
        "all_walls": {kind: [r["wall_seconds"] for r in found] for kind, found in runs.items()},
        "max_final_metric_difference": difference,
    }


def markdown(result: dict[str, Any], model: str) -> str:
    from perf.table import table

    walls = result["all_walls"]
    return "\n\n".join(
        [
            f"A study with fusion against the same study without it: a grid of {result['rows'][0]['trials']} "
            f"schedules of the {model}, {result['steps']} steps each, on {WORKERS} single-threaded Dask "
            f"workers (best of {result['rounds']} alternating runs each; all: unfused "
            + ", ".join(f"{w:.1f}" for w in walls["unfused"])
            + " s, fused "
            + ", ".join(f"{w:.1f}" for w in walls["fused"])
            + " s):",
            table(
                [{**row, "mean_members": f"{row['mean_members']:.1f}"} for row in result["rows"]],
                [
                    ("study", "study"),
                    ("wall_seconds", "wall s"),
                    ("trial_steps_per_second", "trial-steps/s"),
                    ("trial_steps", "trial steps"),
                    ("unique_steps", "unique"),
                    ("executed_steps", "executed"),
                    ("fused_tasks", "fused tasks"),
                    ("mean_members", "mean K"),
                ],
            ),
            f"Fused study / unfused study wall time: **{1 / result['speedup']:.2f}** "
            f"({result['speedup']:.2f}x the throughput); largest difference of a trial's final metrics "
            f"between the two: {result['max_final_metric_difference']:.1e}.",
        ]
    )
