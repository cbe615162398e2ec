"""Trial fusion at the study level: a grid as a fused study and as an unfused one, side by
side on one LocalCluster of 2 single-threaded worker processes.

Two grids: 32 schedules of a 30-64-2 MLP (learning-rate schedules x momentum ramps x weight
decays, one epoch of 128 batches per step), and `examples/digits.py`'s digits grid (36
trials of its CNN, 30 epochs), whose batch-size ramps are not fusible. Both share prefixes, so both studies of each train each unique step once; the
fused one (``Study(fuse=16)``) trains the stages that start together with equal non-fusible
values as fused tasks of up to 16 trials on one worker slot each. The studies alternate
(unfused, fused, unfused, fused in quick mode), each with its own storage so neither reuses
the other's results; the cluster start-up and a warm-up study of each kind (imports, first
calls on the workers) are not timed. Reported per study: wall time of `Study.run`,
trial-steps per second (the trials' steps over the wall time), executed and unique steps,
the number of fused tasks and their mean size, and the largest difference of a trial's final
metrics between the two.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import dagtune as dt
from dagtune.algos import GridSearch

WORKERS = 2
FUSE = 16


@dataclass
class Case:
    """A grid to run fused and unfused: the trainer, its grid and steps per mode, the metric."""

    name: str
    trainer: type
    kwargs: dict[str, Any]
    space: Callable[[str], list]
    steps: dict[str, int]
    metric: str
    mode: str


def tiny_space(mode: str) -> list:
    """32 trials (4 in smoke mode) whose schedules branch at steps 3 and 5."""
    if mode == "smoke":
        return list(dt.Grid({"lr": [0.1, 0.05], "momentum": [0.9, 0.5], "batch_size": [32]}))
    grid = {
        "lr": [dt.Constant(0.1), dt.MultiStep(0.1, [5], 0.1), dt.Constant(0.05), dt.Constant(0.02)],
        "momentum": [0.9, 0.5, 0.0, dt.Steps([0.5, 0.9], [3])],
        "weight_decay": [0.0, 1e-4],
        "batch_size": [32],
    }
    return list(dt.Grid(grid))


def digits_space(mode: str) -> list:
    """`examples/digits.py`'s grid (its first 4 configs in smoke mode)."""
    from digits import search_space

    configs = list(search_space())
    return configs[:4] if mode == "smoke" else configs


def cases(tiny_trainer: type, tiny_kwargs: dict) -> list[Case]:
    from digits import DigitsTrainer

    return [
        Case(
            "tiny MLP 30-64-2 (4096 samples)",
            tiny_trainer,
            tiny_kwargs,
            tiny_space,
            {"smoke": 2, "quick": 10, "full": 10},
            "val_loss",
            "min",
        ),
        Case(
            "digits CNN grid (examples/digits.py)",
            DigitsTrainer,
            {},
            digits_space,
            {"smoke": 2, "quick": 30, "full": 30},
            "val_acc",
            "max",
        ),
    ]


def run_study(client: Any, case: Case, fuse: bool | int, configs: list, steps: int) -> dict:
    """One study of `configs` on `client`'s cluster; its figures."""
    with (
        tempfile.TemporaryDirectory() as storage,
        dt.Study(
            case.trainer, case.kwargs, name="perf-fusion", storage=storage, client=client, fuse=fuse
        ) as study,
    ):
        sizes: list[int] = []
        launch_group = study.executor.launch_group

        def record(tasks: list, priority: float = 0.0, prefer: str | None = None) -> None:
            sizes.append(len(tasks))
            launch_group(tasks, priority, prefer)

        study.executor.launch_group = record
        began = time.perf_counter()
        result = study.run(GridSearch(configs, metric=case.metric, mode=case.mode, steps=steps))
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


def compare_case(client: Any, case: Case, mode: str) -> dict[str, Any]:
    """The unfused and the fused study of `case`, alternating."""
    configs, steps = case.space(mode), case.steps[mode]
    for fuse in (False, FUSE):  # warm-up, not timed: imports and first calls on the workers
        run_study(client, case, fuse, configs[:2], 1)
    rounds = {"smoke": 1, "quick": 2, "full": 3}[mode]
    runs: dict[str, list[dict]] = {"unfused": [], "fused": []}
    for _ in range(rounds):
        runs["unfused"].append(run_study(client, case, False, configs, steps))
        runs["fused"].append(run_study(client, case, FUSE, configs, steps))
        print(
            f"[perf] fusion study, {case.name}: unfused {runs['unfused'][-1]['wall_seconds']:.1f} s, "
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
    return {
        "case": case.name,
        "steps": steps,
        "rounds": rounds,
        "rows": [{k: v for k, v in run.items() if k != "finals"} for run in (unfused, fused)],
        "speedup": unfused["wall_seconds"] / fused["wall_seconds"],
        "all_walls": {kind: [r["wall_seconds"] for r in found] for kind, found in runs.items()},
        "max_final_metric_difference": difference,
    }


def compare(tiny_trainer: type, tiny_kwargs: dict, mode: str) -> list[dict[str, Any]]:
    """Every case's comparison (`mode`: smoke, quick or full) on one cluster."""
    from distributed import Client

    from dagtune.cluster import embedded_cluster  # loads distributed

    with embedded_cluster(WORKERS, None, False) as cluster, Client(cluster) as client:
        return [compare_case(client, case, mode) for case in cases(tiny_trainer, tiny_kwargs)]


def markdown(results: list[dict[str, Any]]) -> str:
    from perf.table import table

    parts = [
        f"A study with fusion against the same study without it, on {WORKERS} single-threaded Dask "
        "workers (best of the alternating runs of each; every run in parentheses):"
    ]
    for result in results:
        walls = result["all_walls"]
        parts += [
            f"**{result['case']}**, {result['rows'][0]['trials']} trials of {result['steps']} steps "
            f"(unfused {', '.join(f'{w:.1f}' for w in walls['unfused'])} s; fused "
            f"{', '.join(f'{w:.1f}' for w in walls['fused'])} s):",
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
            f"Fused / unfused wall time: **{1 / result['speedup']:.2f}** ({result['speedup']:.2f}x the "
            f"throughput); largest difference of a trial's final metrics between the two: "
            f"{result['max_final_metric_difference']:.1e}.",
        ]
    return "\n\n".join(parts)
