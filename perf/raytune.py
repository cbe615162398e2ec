"""Real training against Ray Tune: the digits grid (and ASHA) on 2 workers of this machine.

The same trainer code (`examples/digits.py`'s `DigitsTrainer`) and the same trials run
(a) as independent Ray Tune trials with Ray's own per-epoch checkpointing, (b) through
dagtune with ``reuse=False`` (trial-based, same machinery), (c) through dagtune. Each system
gets 2 single-threaded workers; all three run in the same process one after the other, so
the ratios compare like with like on a noisy machine. Cluster start-up (``ray.init``, the
Dask LocalCluster) is timed separately from the study itself.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))

import dagtune as dt  # noqa: E402
from dagtune.algos import GridSearch  # noqa: E402
from dagtune.config import config_dumps, config_from_json, config_values  # noqa: E402
from dagtune.sequences import same_value  # noqa: E402
from dagtune.trainer import build_trainer, capture_rng, isolated_rng, restore_rng  # noqa: E402

WORKERS = 2


def _ray_trainable(params: dict[str, Any]) -> None:
    """One Ray Tune trial: the same step protocol as dagtune's runner, checkpointing every
    epoch the way Ray Tune users do (so ASHA/PBT could pause and resume it)."""
    import torch
    from digits import DigitsTrainer
    from ray import tune

    config = config_from_json(json.loads(params["config"]))
    trainer = build_trainer(DigitsTrainer, {}, params["seed"])
    start = 0
    checkpoint = tune.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as directory:
            state = torch.load(Path(directory) / "state.pt", weights_only=True)
        trainer.load_state_dict(state["trainer"])
        restore_rng(state["rng"])
        start = state["step"]
    values = None
    for step in range(start, params["epochs"]):
        now = config_values(config, step)
        if values is None:
            trainer.setup(dict(now))
        else:
            changes = {k: v for k, v in now.items() if not same_value(v, values[k])}
            if changes:
                trainer.setup(changes)
        values = now
        trainer.train()
        with isolated_rng():
            metrics = trainer.evaluate()
        with tempfile.TemporaryDirectory() as directory:
            state = {"trainer": trainer.state_dict(), "rng": capture_rng(), "step": step + 1}
            torch.save(state, Path(directory) / "state.pt")
            tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(directory))


def run_ray(configs: list[dict], epochs: int, asha: dict | None = None, seed: int = 0) -> dict[str, Any]:
    """Ray Tune on `WORKERS` CPUs: wall time, executed epochs and best accuracy."""
    import ray
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler, FIFOScheduler

    began = time.perf_counter()
    ray.init(
        num_cpus=WORKERS,
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
        _node_ip_address="127.0.0.1",
    )
    startup = time.perf_counter() - began
    try:
        scheduler = (
            ASHAScheduler(max_t=epochs, grace_period=asha["min_steps"], reduction_factor=asha["eta"])
            if asha
            else FIFOScheduler()
        )
        with tempfile.TemporaryDirectory() as storage:
            tuner = tune.Tuner(
                tune.with_resources(_ray_trainable, {"cpu": 1}),
                param_space={
                    "config": tune.grid_search([config_dumps(c) for c in configs]),
                    "epochs": epochs,
                    "seed": seed,
                },
                tune_config=tune.TuneConfig(metric="val_acc", mode="max", scheduler=scheduler),
                run_config=tune.RunConfig(
                    storage_path=storage,
                    verbose=0,
                    checkpoint_config=tune.CheckpointConfig(num_to_keep=1),
                ),
            )
            began = time.perf_counter()
            results = tuner.fit()
            wall = time.perf_counter() - began
        executed = sum(int(r.metrics.get("training_iteration", 0)) for r in results)
        finished = [r.metrics for r in results if r.metrics.get("training_iteration") == epochs]
        best = max((m["val_acc"] for m in finished), default=float("nan"))
    finally:
        ray.shutdown()
    return {
        "system": "Ray Tune",
        "wall_seconds": wall,
        "startup_seconds": startup,
        "executed_steps": executed,
        "best_val_acc": best,
    }


def run_dagtune(
    configs: list[dict], epochs: int, reuse: bool, asha: dict | None = None, seed: int = 0
) -> dict[str, Any]:
    """dagtune on a LocalCluster of `WORKERS` single-threaded worker processes."""
    from digits import DigitsTrainer

    began = time.perf_counter()
    with tempfile.TemporaryDirectory() as storage:
        study = dt.Study(DigitsTrainer, name="perf", storage=storage, workers=WORKERS, seed=seed, reuse=reuse)
        with study:
            startup = time.perf_counter() - began
            if asha:
                algorithm = dt.algos.ASHA(
                    configs,
                    metric="val_acc",
                    mode="max",
                    min_steps=asha["min_steps"],
                    max_steps=epochs,
                    eta=asha["eta"],
                )
            else:
                algorithm = GridSearch(configs, metric="val_acc", mode="max", steps=epochs)
            began = time.perf_counter()
            result = study.run(algorithm)
            wall = time.perf_counter() - began
    report = result.report
    return {
        "system": "dagtune" if reuse else "dagtune reuse=False",
        "wall_seconds": wall,
        "startup_seconds": startup,
        "executed_steps": report["executed_steps"],
        "unique_steps": report["unique_steps"],
        "trial_steps": report["trial_steps"],
        "best_val_acc": result.best.metrics["val_acc"] if result.best else float("nan"),
    }


def _ray_installed() -> bool:
    try:
        import ray.tune  # noqa: F401
    except ImportError:
        return False
    return True


def benchmark(mode: str = "quick") -> dict[str, Any]:
    """Grid and ASHA, each on the three systems; returns rows and the headline ratios."""
    from digits import search_space

    os.environ.setdefault("TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S", "0")
    epochs = {"smoke": 3, "quick": 20, "full": 30}[mode]
    configs = list(search_space())[: 4 if mode == "smoke" else None]
    merge = dt.merge_rate((c, epochs) for c in configs)
    with_ray = mode != "smoke" and _ray_installed()  # smoke runs check dagtune's side only
    grid = [run_dagtune(configs, epochs, reuse=False), run_dagtune(configs, epochs, reuse=True)]
    asha_settings = {"min_steps": max(epochs // 8, 1), "eta": 3}
    asha = [run_dagtune(configs, epochs, reuse=True, asha=asha_settings)]
    if with_ray:
        grid.insert(0, run_ray(configs, epochs))
        asha.insert(0, run_ray(configs, epochs, asha_settings))
    else:
        skipped = {"system": "Ray Tune (skipped: smoke run or `pip install -e '.[perf]'` missing)"}
        grid.insert(0, skipped)
        asha.insert(0, dict(skipped))
    ratio = grid[0]["wall_seconds"] / grid[2]["wall_seconds"] if with_ray else float("nan")
    return {
        "epochs": epochs,
        "trials": len(configs),
        "merge_rate": merge,
        "grid": grid,
        "asha": asha,
        "asha_settings": asha_settings,
        "headline_ratio": ratio,
        "ratio_of_merge_rate": ratio / merge,
    }


if __name__ == "__main__":
    print(json.dumps(benchmark("full" if "--full" in sys.argv else "quick"), indent=2))


def markdown(result: dict[str, Any]) -> str:
    from perf.table import table

    columns = [
        ("system", "system"),
        ("wall_seconds", "study wall time (s)"),
        ("startup_seconds", "cluster start (s)"),
        ("executed_steps", "executed epochs"),
        ("best_val_acc", "best val_acc"),
    ]
    return "\n\n".join(
        [
            f"{result['trials']} trials x {result['epochs']} epochs of the digits grid "
            f"(`examples/digits.py`), merge rate {result['merge_rate']:.2f}; 2 workers each.",
            "Grid search:",
            table(result["grid"], columns),
            f"**Ray Tune / dagtune wall time: {result['headline_ratio']:.2f}x** "
            f"({100 * result['ratio_of_merge_rate']:.0f}% of the merge rate). Within dagtune, trial-based "
            f"(reuse=False) / shared: {result['grid'][1]['wall_seconds'] / result['grid'][2]['wall_seconds']:.2f}x; "
            "the rest is Ray Tune's own per-trial and per-checkpoint overhead on the same epochs.",
            f"ASHA (min {result['asha_settings']['min_steps']} epochs, eta {result['asha_settings']['eta']}; "
            "Ray Tune's ASHAScheduler stops trials, dagtune's ASHA pauses and promotes them):",
            table(result["asha"], columns),
        ]
    )
