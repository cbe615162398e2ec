"""Trial fusion at the study level: a grid as a fused study, as an unfused one and under Ray
Tune, side by side on 2 single-threaded workers of this machine, in one run.

Two grids: 32 schedules of a 30-64-2 MLP (learning-rate schedules x momentum ramps x weight
decays, one epoch of 128 batches per step), and `examples/digits.py`'s digits grid (36
trials of its CNN, 30 epochs), whose batch-size ramps are not fusible. Both share prefixes,
so both dagtune studies of each train each unique step once; the fused one
(``Study(fuse=16)``) trains the stages that start together with equal non-fusible values as
fused tasks of up to 16 trials on one worker slot each. The digits grid runs fused twice: with
exact kernels (the default) and with grouped convolutions (``fused_kernels="grouped"``). Ray Tune runs the same trials with
the same trainer as independent trials, exactly as in the Ray Tune section (`perf/raytune.py`:
function trainables, ``reuse_actors=True``, one CPU each, a checkpoint at each trial's end,
``ray.init(num_cpus=2)`` after the Dask workers of the same process have gone idle). The
three alternate (unfused, fused, Ray Tune, unfused, ... in quick mode), each with its own
storage so none reuses another's results; the Dask cluster's start-up and a warm-up study of
each dagtune kind (imports, first calls on the workers) are not timed, nor is ``ray.init``,
but Ray Tune's trial actors start (and import torch) inside its timed run, as they do for
every Ray Tune study. Reported per study: wall time (`Study.run`, `Tuner.fit`), trial-steps
per second (the trials' steps over the wall time), executed and unique steps, the number of
fused tasks, their mean size and how many of each size (the report's ``fused_tasks``,
``mean_group_size`` and ``group_sizes``), the largest difference of a trial's final metrics between
the fused and unfused studies (and of the searched metric, Ray Tune against unfused), and
where the worker-seconds went (`perf/timeline.py`; Ray Tune's from timers in its trainable).
"""

from __future__ import annotations

import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dagtune as dt
from dagtune.algos import GridSearch
from dagtune.sim import SimulatedExecutor
from perf import raytune
from perf.smoke import cluster_client
from perf.timeline import TimedStudy, account, account_table

WORKERS = 2
FUSE = 16
STUDY_GOAL = 1.3  # the digits grid fused against unfused


@dataclass
class Case:
    """A grid to run fused and unfused: the trainer, its grid and steps per mode, the metric,
    and the fused variants (a label and the trainer class each: another ``fused_kernels``)."""

    name: str
    trainer: type
    kwargs: dict[str, Any]
    space: Callable[[str], list]
    steps: dict[str, int]
    metric: str
    mode: str
    fused: dict[str, type]


def _grouped_digits() -> type:
    from digits import DigitsTrainer

    class DigitsGrouped(DigitsTrainer):
        """`examples/digits.py`'s trainer fused with grouped convolutions."""

        fused_kernels = "grouped"

    return DigitsGrouped


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
            {"fused": tiny_trainer},
        ),
        Case(
            "digits CNN grid (examples/digits.py)",
            DigitsTrainer,
            {},
            digits_space,
            {"smoke": 2, "quick": 30, "full": 30},
            "val_acc",
            "max",
            {"fused": DigitsTrainer, "fused, grouped": _grouped_digits()},
        ),
    ]


def run_study(
    client: Any, case: Case, fuse: bool | int, configs: list, steps: int, variant: str = ""
) -> dict:
    """One dagtune study of `configs` on `client`'s cluster (fused: the `variant` of
    `case.fused`); its figures and time account."""
    trainer = case.fused[variant] if fuse else case.trainer
    with (
        tempfile.TemporaryDirectory() as storage,
        TimedStudy(
            trainer, case.kwargs, name="perf-fusion", storage=storage, client=client, fuse=fuse
        ) as study,
    ):
        wall_began = time.time()
        cpu_began = worker_cpu(client)
        began = time.perf_counter()
        result = study.run(GridSearch(configs, metric=case.metric, mode=case.mode, steps=steps))
        wall = time.perf_counter() - began
        cpu = worker_cpu(client) - cpu_began
        report = result.report  # counted once every stage of the run has ended
        spent = account(study, wall, wall_began, WORKERS)
        finals = {repr(t.config): t.metrics for t in study.coordinator.trials.values()}
    sizes = report.get("group_sizes", {})
    return {
        "study": f"{variant} (fuse={fuse})" if fuse else "unfused",
        "wall_seconds": wall,
        "cpu_seconds": cpu,
        "trials": report["trials"],
        "trial_steps": report["trial_steps"],
        "unique_steps": report["unique_steps"],
        "executed_steps": report["executed_steps"],
        "trial_steps_per_second": report["trial_steps"] / wall,
        "fused_tasks": report.get("fused_tasks", 0),
        "mean_members": f"{report.get('mean_group_size', 0.0):.1f}",
        "group_sizes": ", ".join(f"{count}x{size}" for size, count in sizes.items()) or "–",
        "train_ms_per_step": 1000 * spent["train_seconds_per_step"],
        "account": spent["rows"],
        "finals": finals,
    }


def worker_cpu(client: Any) -> float:
    """The CPU seconds the cluster's worker processes have used so far (all their threads:
    training, Dask's own work): on a machine shared with other work, what a study cost."""
    return sum(client.run(time.process_time).values())


def run_ray(case: Case, configs: list, steps: int) -> dict:
    """The same trials under Ray Tune (`perf/raytune.py`'s trainable, end-of-trial checkpoints)."""
    ran = raytune.run_ray(
        configs, steps, trainer=case.trainer, kwargs=case.kwargs, metric=case.metric, mode=case.mode
    )
    return {
        "study": ran["system"],
        "wall_seconds": ran["wall_seconds"],
        "trials": ran["trials"],
        "trial_steps": ran["trial_steps"],
        "unique_steps": ran["unique_steps"],
        "executed_steps": ran["executed_steps"],
        "trial_steps_per_second": ran["trial_steps"] / ran["wall_seconds"],
        "fused_tasks": "–",
        "mean_members": "–",
        "group_sizes": "–",
        "train_ms_per_step": ran["train_ms_per_epoch"],
        "account": ran["account"],
        "finals": ran["finals"],
    }


def compare_case(client: Any, case: Case, mode: str, with_ray: bool) -> dict[str, Any]:
    """The unfused study of `case`, its fused variants and (`with_ray`) Ray Tune, alternating."""
    steps = case.steps[mode]
    configs = raytune.distinct(case.space(mode), steps)  # all of them but in smoke mode's 2 steps
    if mode != "smoke":  # warm-up, not timed: imports, first calls (smoke runs time nothing)
        run_study(client, case, False, configs[:2], 1)
        for variant in case.fused:
            run_study(client, case, FUSE, configs[:2], 1, variant)
    rounds = {"smoke": 1, "quick": 2, "full": 3}[mode]
    runs: dict[str, list[dict]] = (
        {"unfused": []} | {v: [] for v in case.fused} | ({"ray": []} if with_ray else {})
    )
    for _ in range(rounds):
        runs["unfused"].append(run_study(client, case, False, configs, steps))
        for variant in case.fused:
            runs[variant].append(run_study(client, case, FUSE, configs, steps, variant))
        if with_ray:
            runs["ray"].append(run_ray(case, configs, steps))
        print(
            f"[perf] fusion study, {case.name}: "
            + ", ".join(f"{kind} {found[-1]['wall_seconds']:.1f} s" for kind, found in runs.items()),
            flush=True,
        )
    best = {kind: min(found, key=lambda r: r["wall_seconds"]) for kind, found in runs.items()}
    unfused = best["unfused"]
    speedups = {v: unfused["wall_seconds"] / best[v]["wall_seconds"] for v in case.fused}
    cpu_speedups = {
        v: _median([r["cpu_seconds"] for r in runs["unfused"]]) / _median([r["cpu_seconds"] for r in runs[v]])
        for v in case.fused
    }
    differences = {
        v: max(
            abs(best[v]["finals"][config][name] - value)
            for config, metrics in unfused["finals"].items()
            for name, value in metrics.items()
        )
        for v in case.fused
    }
    fused = best["fused"]
    result = {
        "case": case.name,
        "steps": steps,
        "rounds": rounds,
        "metric": case.metric,
        "rows": [{k: v for k, v in run.items() if k != "finals"} for run in best.values()],
        "speedup": speedups["fused"],
        "speedups": speedups,
        "cpu_speedups": cpu_speedups,
        "all_cpu": {kind: [r.get("cpu_seconds") for r in found] for kind, found in runs.items()},
        "all_walls": {kind: [r["wall_seconds"] for r in found] for kind, found in runs.items()},
        "max_final_metric_difference": differences["fused"],
        "final_metric_differences": differences,
        "ray": raytune.ray_label(with_ray),
    }
    if with_ray:
        ray = best["ray"]
        result["ray_over_fused"] = ray["wall_seconds"] / fused["wall_seconds"]
        result["ray_over_unfused"] = ray["wall_seconds"] / unfused["wall_seconds"]
        result["ray_metric_difference"] = max(
            abs(ray["finals"][config] - metrics[case.metric]) for config, metrics in unfused["finals"].items()
        )
    return result


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def compare(tiny_trainer: type, tiny_kwargs: dict, mode: str) -> list[dict[str, Any]]:
    """Every case's comparison (`mode`: smoke, quick or full) on one Dask cluster, with Ray
    Tune's runs when Ray is installed."""
    with_ray = raytune.ray_installed()
    with cluster_client(mode, WORKERS) as client:
        return [compare_case(client, case, mode, with_ray) for case in cases(tiny_trainer, tiny_kwargs)]


def markdown(results: list[dict[str, Any]]) -> str:
    from perf.table import table

    with_ray = all("ray_over_fused" in result for result in results)
    parts = [
        "A study with fusion against the same study without it"
        + (" and against Ray Tune" if with_ray else "")
        + f", on {WORKERS} single-threaded workers (best of the alternating runs of each; every run "
        "in parentheses):"
    ]
    if not with_ray:
        parts.append(f"**Ray Tune {results[0].get('ray', raytune.SKIPPED)}.** Only dagtune's rows ran.")
    for result in results:
        walls = result["all_walls"]
        names = {"ray": "Ray Tune"}
        parts += [
            f"**{result['case']}**, {result['rows'][0]['trials']} trials of {result['steps']} steps ("
            + "; ".join(
                f"{names.get(kind, kind)} {', '.join(f'{w:.1f}' for w in found)} s"
                for kind, found in walls.items()
            )
            + "):",
            table(
                result["rows"],
                [
                    ("study", "study"),
                    ("wall_seconds", "wall s"),
                    ("cpu_seconds", "workers' CPU s"),
                    ("trial_steps_per_second", "trial-steps/s"),
                    ("trial_steps", "trial steps"),
                    ("unique_steps", "unique"),
                    ("executed_steps", "executed"),
                    ("fused_tasks", "fused tasks"),
                    ("mean_members", "mean K"),
                    ("group_sizes", "tasks x K"),
                    ("train_ms_per_step", "training ms per step"),
                ],
            ),
            _verdict(result),
        ]
        accounts = [
            (row["study"], row["account"], row["wall_seconds"]) for row in result["rows"] if "account" in row
        ]
        if accounts:
            parts += [
                f"Where the time goes ({WORKERS} workers x wall time, by activity; a fused step's training "
                "time is split among its members):",
                account_table(accounts, WORKERS),
            ]
    return "\n\n".join(parts)


def _verdict(result: dict[str, Any]) -> str:
    """The ratios of one case and whether dagtune's executed steps equal its unique steps."""
    speedups = result.get("speedups", {"fused": result["speedup"]})
    cpu_speedups = result.get("cpu_speedups", {})
    differences = result.get("final_metric_differences", {"fused": result["max_final_metric_difference"]})
    text = " ".join(
        f"{variant.capitalize()} / unfused wall time: **{1 / speedup:.2f}** ({speedup:.2f}x the throughput"
        + (f"; the goal is {STUDY_GOAL}x" if result["case"].startswith("digits") else "")
        + (
            f"; {cpu_speedups[variant]:.2f}x by the workers' CPU time, median of the runs"
            if variant in cpu_speedups
            else ""
        )
        + f"); largest difference of a trial's final metrics to unfused: {differences[variant]:.1e}."
        for variant, speedup in speedups.items()
    )
    if "ray_over_fused" in result:
        text += (
            f" **Ray Tune / fused wall time: {result['ray_over_fused']:.2f}x**, Ray Tune / unfused: "
            f"{result['ray_over_unfused']:.2f}x; largest difference of a trial's final {result['metric']} "
            f"between Ray Tune and unfused: {result['ray_metric_difference']:.1e}."
        )
    extra = [
        r["study"]
        for r in result["rows"]
        if r["study"] != "Ray Tune" and r["executed_steps"] != r["unique_steps"]
    ]
    text += (
        " dagtune's executed steps differ from its unique steps in: " + ", ".join(extra) + "."
        if extra
        else " Every dagtune study executed exactly its unique steps."
    )
    return text


class CostedExecutor(SimulatedExecutor):
    """The simulator with a fused round of K members costing the costliest member's step
    times ``fixed + per_member * K`` (the engine's measured cost in unfused steps: a group of
    one costs ``fixed + per_member``); records the group sizes."""

    def __init__(self, workers: int, fixed: float, per_member: float):
        super().__init__(workers)
        self.fixed, self.per_member = fixed, per_member
        self.sizes: list[int] = []

    def fused_round_seconds(self, costs: list[float]) -> float:
        return max(costs) * (self.fixed + self.per_member * len(costs))

    def launch_group(self, tasks: Any, priority: float = 0.0, prefer: Any = None) -> None:
        self.sizes.append(len(tasks))
        super().launch_group(tasks, priority, prefer)


def simulated_speedup(trainer: type, configs: list, steps: int, fixed: float, per_member: float) -> dict:
    """The grid's makespan in the simulator (each step 1 s, evaluation, checkpoints and dispatch
    free) unfused and fused (``fuse=16``, 2 slots) when a fused round of K members costs
    ``fixed + per_member * K`` unfused steps: what the engine's cost allows this grid's stage
    tree at best, whatever the machine's load."""
    algorithm = GridSearch(configs, metric="val_loss", mode="min", steps=steps)
    plain = SimulatedExecutor(WORKERS)
    dt.Study(trainer, executor=plain).run(algorithm)
    costed = CostedExecutor(WORKERS, fixed, per_member)
    dt.Study(trainer, executor=costed, fuse=FUSE).run(
        GridSearch(configs, metric="val_loss", mode="min", steps=steps)
    )
    return {
        "fixed": fixed,
        "per_member": per_member,
        "unfused_seconds": plain.now(),
        "fused_seconds": costed.now(),
        "speedup": plain.now() / costed.now(),
        "group_sizes": dict(sorted(Counter(costed.sizes).items())),
    }


def main(argv: list[str], tiny_trainer: type, tiny_kwargs: dict) -> None:
    """``python -m perf.fusion study [--mode quick] [--case digits]``: one grid's comparison
    alone (the ``fusion`` benchmark runs both after its engine tables), printed as markdown
    with the load average before and after."""
    import argparse
    import json
    import os

    parser = argparse.ArgumentParser(prog="python -m perf.fusion study", description=main.__doc__)
    parser.add_argument("--mode", choices=("smoke", "quick", "full"), default="quick")
    parser.add_argument("--case", choices=("tiny", "digits"), default="digits")
    parser.add_argument("--json", help="also write the result to this file")
    parser.add_argument(
        "--simulate",
        metavar="FIXED,PER_MEMBER",
        action="append",
        help="instead: the grid's simulated speed-up when a fused round of K costs FIXED + PER_MEMBER * K steps",
    )
    args = parser.parse_args(argv)
    if args.simulate:
        (case,) = [c for c in cases(tiny_trainer, tiny_kwargs) if c.name.startswith(args.case)]
        configs = raytune.distinct(case.space(args.mode), case.steps[args.mode])
        for pair in args.simulate:
            fixed, per_member = map(float, pair.split(","))
            print(simulated_speedup(tiny_trainer, configs, case.steps[args.mode], fixed, per_member))
        return
    chosen = [c for c in cases(tiny_trainer, tiny_kwargs) if c.name.startswith(args.case)]
    load = os.getloadavg()[0]
    with cluster_client(args.mode, WORKERS) as client:
        results = [compare_case(client, case, args.mode, raytune.ray_installed()) for case in chosen]
    print(f"load average (1 minute): {load:.1f} at the start, {os.getloadavg()[0]:.1f} at the end")
    print(markdown(results))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1, default=str))
