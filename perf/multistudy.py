"""Several studies of one model sharing one search plan (Hippo §6.2), simulated.

1, 2, 4 and 8 studies of 144 trials each over learning-rate and batch-size sequences of
ResNet20 on CIFAR-10 (120 epochs with --full; quick runs train 30 epochs with every
milestone scaled by 1/4, which keeps the sharing structure; 40 s per epoch on a K80 at
batch size 128, 15% less at 256; 40 virtual GPUs). Each study draws its own 24
learning-rate schedules from one pool of 92 (step decays at different epochs and rates,
warm-ups, exponential and cosine decays) and crosses them with 6 batch-size schedules, so
studies overlap partly, as two users tuning the same model do. Two studies that draw the
same schedule have identical trials: a trial-based system trains both (two users would),
so they count in q, but q over the distinct trials is shown too. All the studies' trials go
to **one coordinator** (one simulated dagtune study), which is what concurrent studies of
one model identity amount to through their shared plan (the real system runs one
coordinator per study, sharing the plan through storage); trial-based execution trains
every trial of every study on its own. Reported: the k-wise merge rate q, the GPU-hour and
makespan ratios against trial-based, and each makespan over the lower bounds of
perf/paper.py.
"""

from __future__ import annotations

import random
from typing import Any

import dagtune as dt
from dagtune.algos import GridSearch
from dagtune.config import config_dumps
from dagtune.sim import SimulatedExecutor, SyntheticTrainer
from perf.paper import lower_bound

EPOCHS = 120
WORKERS = 40


def _step_seconds(values: dict) -> float:
    return 40.0 * (0.85 if values.get("batch_size") == 256 else 1.0)


def _scaled(epochs: int):
    """Epoch numbers written for 120 epochs, scaled to `epochs` (quick runs train fewer)."""
    return lambda epoch: max(1, round(epoch * epochs / 120))


def learning_rate_pool(epochs: int = EPOCHS) -> list[dt.Sequence]:
    """92 schedules: four initial rates x (step decays at four epochs by two factors, with and
    without warm-up; warm-up + exponential; warm-up + cosine; cyclic; linear)."""
    at = _scaled(epochs)
    pool = []
    for init in (0.2, 0.1, 0.05, 0.02):
        for first in (40, 60, 80, 100):
            for gamma in (0.1, 0.2):
                pool.append(dt.MultiStep(init, [at(first), at(first + 30)], gamma))
                pool.append(dt.Warmup(at(5), dt.MultiStep(init, [at(first - 5), at(first + 25)], gamma)))
        pool += [dt.Warmup(at(5), dt.Exponential(init, gamma)) for gamma in (0.95, 0.97)]
        pool += [dt.Warmup(at(10), dt.Cosine(init, at(period))) for period in (20, 40)]
        pool += [dt.Cyclic(0.001, init, at(up)) for up in (10, 30)]
        pool.append(dt.Linear(init, 0.0, epochs))
    return pool


def batch_sizes(epochs: int = EPOCHS) -> list:
    at = _scaled(epochs)
    return [
        128,
        256,
        dt.Steps([128, 256], [at(60)]),
        dt.Steps([128, 256], [at(90)]),
        dt.Steps([128, 256, 512], [at(40), at(80)]),
        dt.Steps([256, 128], [at(100)]),
    ]


def study_configs(index: int, epochs: int = EPOCHS) -> list[dict]:
    """Study `index`'s 144 configs: 24 schedules drawn from the pool, x 6 batch sizes."""
    schedules = random.Random(index).sample(learning_rate_pool(epochs), 24)
    return list(dt.Grid({"lr": schedules, "batch_size": batch_sizes(epochs)}))


def run(configs: list[dict], reuse: bool, workers: int, epochs: int) -> dict[str, Any]:
    executor = SimulatedExecutor(
        workers, _step_seconds, save_seconds=1.0, load_seconds=1.0, launch_seconds=5.0
    )
    study = dt.Study(
        SyntheticTrainer,
        name="multistudy",
        executor=executor,
        reuse=reuse,
        scheduler="critical_path" if reuse else "fifo",
    )
    report = study.run(GridSearch(configs, "val_acc", "max", steps=epochs)).report
    bound = lower_bound([(c, epochs) for c in configs], _step_seconds, workers)
    return {
        "over_simple_bound": report["makespan_seconds"] / bound["simple"],
        "over_precedence_bound": report["makespan_seconds"] / bound["precedence"],
        "gpu_hours": report["gpu_seconds"] / 3600,
        "makespan_hours": report["makespan_seconds"] / 3600,
        "executed_steps": report["executed_steps"],
        "unique_steps": report["unique_steps"],
    }


def benchmark(mode: str = "quick") -> dict[str, Any]:
    """Quick runs train 30 epochs (milestones scaled, same sharing structure), full ones 120."""
    counts = (1, 2) if mode == "smoke" else (1, 2, 4, 8)
    workers = 8 if mode == "smoke" else WORKERS
    epochs = {"smoke": 12, "quick": 30, "full": EPOCHS}[mode]
    rows = []
    for k in counts:
        studies = [study_configs(i, epochs) for i in range(k)]
        if mode == "smoke":
            studies = [configs[:12] for configs in studies]
        configs = [config for study in studies for config in study]
        single = [dt.merge_rate((c, epochs) for c in study) for study in studies]
        q = dt.merge_rate((c, epochs) for c in configs)
        distinct = list({config_dumps(c): c for c in configs}.values())
        base = run(configs, reuse=False, workers=workers, epochs=epochs)
        ours = run(configs, reuse=True, workers=workers, epochs=epochs)
        rows.append(
            {
                "studies": k,
                "trials": len(configs),
                "per_study_merge_rates": f"{min(single):.2f}-{max(single):.2f}",
                "q": q,
                "duplicates": len(configs) - len(distinct),
                "q_distinct": dt.merge_rate((c, epochs) for c in distinct),
                "trial_based_gpu_hours": base["gpu_hours"],
                "dagtune_gpu_hours": ours["gpu_hours"],
                "gpu_hours_ratio": base["gpu_hours"] / ours["gpu_hours"],
                "trial_based_makespan_hours": base["makespan_hours"],
                "dagtune_makespan_hours": ours["makespan_hours"],
                "makespan_ratio": base["makespan_hours"] / ours["makespan_hours"],
                "dagtune_over_simple_bound": ours["over_simple_bound"],
                "dagtune_over_bound": ours["over_precedence_bound"],
                "executed_equals_unique": ours["executed_steps"] == ours["unique_steps"],
            }
        )
    return {"epochs": epochs, "workers": workers, "rows": rows}


def markdown(result: dict[str, Any]) -> str:
    from perf.table import table

    return (
        f"Epochs per trial in this run: **{result['epochs']}**; {result['workers']} virtual GPUs.\n\n"
        + table(
            result["rows"],
            [
                ("studies", "studies"),
                ("trials", "trials"),
                ("per_study_merge_rates", "merge rate per study"),
                ("q", "k-wise merge rate q"),
                ("duplicates", "trials duplicated across studies"),
                ("q_distinct", "q of the distinct trials"),
                ("trial_based_gpu_hours", "trial-based GPU-h"),
                ("dagtune_gpu_hours", "dagtune GPU-h"),
                ("gpu_hours_ratio", "GPU-h ratio"),
                ("trial_based_makespan_hours", "trial-based makespan (h)"),
                ("dagtune_makespan_hours", "dagtune makespan (h)"),
                ("makespan_ratio", "makespan ratio"),
                ("dagtune_over_simple_bound", "dagtune / simple bound"),
                ("dagtune_over_bound", "dagtune / precedence bound"),
                ("executed_equals_unique", "executed = unique"),
            ],
        )
    )
