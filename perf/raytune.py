"""Real training against Ray Tune: the digits grid (and ASHA) on 2 workers of this machine.

The same trainer code (`examples/digits.py`'s `DigitsTrainer`, which pins torch to one
thread) and the same trials: the digits grid as designed, 36 trials x 30 epochs, all 36
distinct (checked: no two trials have the same hyper-parameter values at every epoch;
fewer epochs would cut decays and ramps off and make trials identical). They run
(a) as independent Ray Tune trials (function trainables, ``reuse_actors=True``, one CPU
each), checkpointing only at the end of a trial like dagtune's trial-based mode, and (in
``--full``) also with a checkpoint every epoch, the way Ray Tune users make trials
pausable; (b) through dagtune with ``reuse=False`` (trial-based, same machinery); (c) through
dagtune. Every system gets 2 single-threaded workers (``OMP_NUM_THREADS=1``; torch threads
are checked in Ray's workers) and evaluates after every epoch; all run in the same process
one after the other, so the ratios compare like with like on a noisy machine. Cluster
start-up (``ray.init``, the Dask LocalCluster) is timed separately from the study itself.

Where the time goes is measured, not guessed: for Ray Tune, timers inside the trainable
(training, evaluation, checkpoint and report) against the workers' wall time; for dagtune,
the events of every stage and timers on the workers (`perf/timeline.py`), and (in ``--full``)
a cProfile of the coordinator thread in a separate, untimed run. That account found the one
large difference between the systems: Dask's nanny starts workers with
``MALLOC_TRIM_THRESHOLD_=65536``, under which an epoch of this trainer took 151-167 ms
against 93 ms in Ray's workers, so dagtune's embedded cluster now starts its workers with
glibc's own thresholds (`dagtune.cluster`); the table reports training time per epoch for
every system, so a difference in training speed shows at once.
"""

from __future__ import annotations

import contextlib
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
from perf.smoke import shared_client  # noqa: E402

WORKERS = 2
EPOCHS = 30  # the grid is designed for 30 epochs (examples/digits.py)
SKIPPED = "skipped: ray not installed (pip install -e '.[perf]')"


def _ray_trainable(params: dict[str, Any], trainer_cls: type, kwargs: dict[str, Any]) -> None:
    """One Ray Tune trial of `trainer_cls` built with `kwargs`: the same step protocol as dagtune's
    runner (setup with the values that changed, one train() per epoch, evaluate() in an
    isolated RNG), checkpointing at the trial's end or after every epoch. Reports cumulative
    timers of its own work."""
    import torch
    from ray import tune

    clock = time.perf_counter
    timers = {"t_build": 0.0, "t_train": 0.0, "t_eval": 0.0, "t_checkpoint": 0.0, "t_report": 0.0}
    began = clock()
    config = config_from_json(json.loads(params["config"]))
    trainer = build_trainer(trainer_cls, kwargs, params["seed"])
    start = 0
    checkpoint = tune.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as directory:
            state = torch.load(Path(directory) / "state.pt", weights_only=True)
        trainer.load_state_dict(state["trainer"])
        restore_rng(state["rng"])
        start = state["step"]
    timers["t_build"] = clock() - began
    threads = {"torch_threads": float(torch.get_num_threads())}
    values = None
    epochs, every_epoch = params["epochs"], params["checkpoint"] == "epoch"
    for step in range(start, epochs):
        now = config_values(config, step)
        if values is None:
            trainer.setup(dict(now))
        else:
            changes = {k: v for k, v in now.items() if not same_value(v, values[k])}
            if changes:
                trainer.setup(changes)
        values = now
        began = clock()
        trainer.train()
        timers["t_train"] += clock() - began
        began = clock()
        with isolated_rng():
            metrics = trainer.evaluate()
        timers["t_eval"] += clock() - began
        if every_epoch or step + 1 == epochs:
            with tempfile.TemporaryDirectory() as directory:
                began = clock()
                state = {"trainer": trainer.state_dict(), "rng": capture_rng(), "step": step + 1}
                torch.save(state, Path(directory) / "state.pt")
                timers["t_checkpoint"] += clock() - began
                began = clock()
                tune.report(
                    {**metrics, **threads, **timers},
                    checkpoint=tune.Checkpoint.from_directory(directory),
                )
                timers["t_report"] += clock() - began
        else:
            began = clock()
            tune.report({**metrics, **threads, **timers})
            timers["t_report"] += clock() - began


def run_ray(
    configs: list[dict],
    epochs: int,
    asha: dict | None = None,
    checkpoint: str = "end",
    seed: int = 0,
    trainer: type | None = None,
    kwargs: dict[str, Any] | None = None,
    metric: str = "val_acc",
    mode: str = "max",
) -> dict[str, Any]:
    """Ray Tune on `WORKERS` CPUs: wall time, steps, the best `metric` (``best_<metric>``), each
    trial's last `metric` (``finals``, by the config's repr) and where the time went. `trainer` (built with `kwargs`) defaults to
    `examples/digits.py`'s `DigitsTrainer`."""
    import ray
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler, FIFOScheduler

    if trainer is None:
        from digits import DigitsTrainer

        trainer = DigitsTrainer
    os.environ.setdefault("TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S", "0")
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    began = time.perf_counter()
    ray.init(
        num_cpus=WORKERS,
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
        _node_ip_address="127.0.0.1",
        runtime_env={"env_vars": {"OMP_NUM_THREADS": "1"}},
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
                tune.with_resources(
                    tune.with_parameters(_ray_trainable, trainer_cls=trainer, kwargs=kwargs or {}), {"cpu": 1}
                ),
                param_space={
                    "config": tune.grid_search([config_dumps(c) for c in configs]),
                    "epochs": epochs,
                    "seed": seed,
                    "checkpoint": checkpoint,
                },
                tune_config=tune.TuneConfig(metric=metric, mode=mode, scheduler=scheduler, reuse_actors=True),
                run_config=tune.RunConfig(
                    storage_path=storage,
                    verbose=0,
                    checkpoint_config=tune.CheckpointConfig(num_to_keep=1),
                ),
            )
            began = time.perf_counter()
            results = tuner.fit()
            wall = time.perf_counter() - began
        trained = []
        for r in results:
            iterations = int(r.metrics.get("training_iteration", 0))
            if iterations:
                trained.append((config_from_json(json.loads(r.config["config"])), iterations, r.metrics))
        finished = [m for _, s, m in trained if s == epochs]
        best = (max if mode == "max" else min)((m[metric] for m in finished), default=float("nan"))
        threads = sorted({int(m["torch_threads"]) for _, _, m in trained})
        timers = {
            k: sum(m.get(k, 0.0) for _, _, m in trained)
            for k in ("t_build", "t_train", "t_eval", "t_checkpoint", "t_report")
        }
        in_trials = sum(m.get("time_total_s", 0.0) for _, _, m in trained)
    finally:
        ray.shutdown()
    trial_steps = sum(s for _, s, _ in trained)
    unique = dt.unique_steps((c, s) for c, s, _ in trained)
    label = "Ray Tune" + (", checkpoint every epoch" if checkpoint == "epoch" else "")
    account = [
        ("training (Trainer.train)", timers["t_train"]),
        ("evaluation (Trainer.evaluate)", timers["t_eval"]),
        ("checkpoint (state_dict, torch.save)", timers["t_checkpoint"]),
        ("tune.report (results, checkpoint upload)", timers["t_report"]),
        ("building trainers", timers["t_build"]),
        ("rest of a running trial", max(0.0, in_trials - sum(timers.values()))),
        ("outside trials (actor start and reuse, scheduling, results)", max(0.0, WORKERS * wall - in_trials)),
    ]
    return {
        "system": label,
        "wall_seconds": wall,
        "startup_seconds": startup,
        "trials": len(trained),
        "trial_steps": trial_steps,
        "unique_steps": unique,
        "executed_steps": trial_steps,  # every trial trains on its own
        "redundant_steps": trial_steps - unique,
        f"best_{metric}": best,
        "torch_threads": threads,
        "train_ms_per_epoch": 1000 * timers["t_train"] / trial_steps if trial_steps else float("nan"),
        "account": _rows(account, WORKERS * wall),
        "finals": {repr(c): m[metric] for c, _, m in trained},  # each trial's last `metric`
    }


def _rows(pairs: list[tuple[str, float]], total: float) -> list[dict[str, Any]]:
    return [{"activity": name, "seconds": s, "share": s / total if total else 0.0} for name, s in pairs]


def run_dagtune(
    configs: list[dict],
    epochs: int,
    reuse: bool,
    asha: dict | None = None,
    seed: int = 0,
    profile: bool = False,
    client: Any = None,
) -> dict[str, Any]:
    """dagtune on a LocalCluster of `WORKERS` single-threaded worker processes: its own
    embedded cluster, or `client`'s (smoke mode: one cluster for all its studies)."""
    from digits import DigitsTrainer

    from perf.timeline import TimedStudy, account

    began = time.perf_counter()
    with tempfile.TemporaryDirectory() as storage:
        study = TimedStudy(
            DigitsTrainer,
            name="perf",
            storage=storage,
            workers=None if client is not None else WORKERS,
            client=client,
            seed=seed,
            reuse=reuse,
            profile=profile,
        )
        with study:
            startup = time.perf_counter() - began
            omp = sorted(set(study.client.run(lambda: os.environ.get("OMP_NUM_THREADS", "unset")).values()))
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
            wall_began = time.time()
            began = time.perf_counter()
            result = study.run(algorithm)
            wall = time.perf_counter() - began
            report = result.report  # counted once every stage of the run has ended
            spent = account(study, wall, wall_began, WORKERS)
        top = study.profile_top() if profile else []
    name = "dagtune" if reuse else "dagtune reuse=False"
    return {
        "system": name + (" (profiled)" if profile else ""),
        "wall_seconds": wall,
        "startup_seconds": startup,
        "trials": report["trials"],
        "trial_steps": report["trial_steps"],
        "unique_steps": report["unique_steps"],
        "executed_steps": report["executed_steps"],
        "redundant_steps": report["executed_steps"] - report["unique_steps"],
        "best_val_acc": result.best.metrics["val_acc"] if result.best else float("nan"),
        "omp_num_threads": omp,
        "train_ms_per_epoch": 1000 * spent["train_seconds_per_step"],
        "account": spent.pop("rows"),
        "details": spent,
        "profile": top,
    }


def ray_installed() -> bool:
    try:
        import ray.tune  # noqa: F401
    except ImportError:
        return False
    return True


def distinct(configs: list[dict], epochs: int) -> list[dict]:
    """`configs` with no two equal at every one of `epochs` steps (the first of each kind)."""
    seen, kept = set(), []
    for config in configs:
        signature = tuple(
            tuple(sorted((k, json.dumps(v)) for k, v in config_values(config, t).items()))
            for t in range(epochs)
        )
        if signature not in seen:
            seen.add(signature)
            kept.append(config)
    return kept


def benchmark(mode: str = "quick", ray: bool | None = None) -> dict[str, Any]:
    """Grid and ASHA on Ray Tune and dagtune; returns rows, headline ratios and accounts.

    Smoke runs train 4 distinct trials for 2 epochs (Ray Tune included when it is installed,
    `ray=False` leaves it out), and ASHA only with reuse."""
    from digits import search_space

    epochs = 2 if mode == "smoke" else EPOCHS
    configs = list(search_space())
    if mode == "smoke":
        configs = distinct(configs, epochs)[:4]
    if len(distinct(configs, epochs)) != len(configs):
        raise AssertionError(f"the benchmark's trials are not distinct at {epochs} epochs")
    merge = dt.merge_rate((c, epochs) for c in configs)
    with_ray = ray_installed() if ray is None else ray and ray_installed()
    asha_settings = {"min_steps": max(epochs // 8, 1), "eta": 3}

    with contextlib.ExitStack() as stack:
        # smoke runs check the benchmark runs: its dagtune studies share one cluster, whose
        # start (workers importing torch) would otherwise be most of each one's time
        client = stack.enter_context(shared_client(WORKERS)) if mode == "smoke" else None
        grid = []
        if with_ray:
            grid.append(run_ray(configs, epochs, checkpoint="end"))
            if mode == "full":
                grid.append(run_ray(configs, epochs, checkpoint="epoch"))
        grid.append(run_dagtune(configs, epochs, reuse=False, client=client))
        grid.append(run_dagtune(configs, epochs, reuse=True, client=client))
        asha = []
        if with_ray:
            asha.append(run_ray(configs, epochs, asha=asha_settings, checkpoint="end"))
        if mode != "smoke":  # smoke runs check the benchmark runs: reuse=False is the grid's path too
            asha.append(run_dagtune(configs, epochs, reuse=False, asha=asha_settings))
        asha.append(run_dagtune(configs, epochs, reuse=True, asha=asha_settings, client=client))
    profiled = run_dagtune(configs, epochs, reuse=True, profile=True) if mode == "full" else None

    by = {row["system"]: row for row in grid}
    ours, alone = by["dagtune"], by["dagtune reuse=False"]
    result = {
        "epochs": epochs,
        "trials": len(configs),
        "trial_steps": len(configs) * epochs,
        "unique_steps": dt.unique_steps((c, epochs) for c in configs),
        "merge_rate": merge,
        "ray": ray_label(with_ray),
        "grid": grid,
        "asha": asha,
        "asha_settings": asha_settings,
        "like_for_like_ratio": alone["wall_seconds"] / ours["wall_seconds"],
        "profiled": profiled,
    }
    result["like_for_like_of_merge_rate"] = result["like_for_like_ratio"] / merge
    if with_ray:
        result["headline_ratio"] = by["Ray Tune"]["wall_seconds"] / ours["wall_seconds"]
        result["ratio_of_merge_rate"] = result["headline_ratio"] / merge
    return result


def ray_label(with_ray: bool) -> str:
    """The Ray version the Ray Tune rows ran with, or why they did not run."""
    from importlib import metadata

    return "ray " + metadata.version("ray") if with_ray else SKIPPED


if __name__ == "__main__":
    print(json.dumps(benchmark("full" if "--full" in sys.argv else "quick"), indent=1, default=str))


def markdown(result: dict[str, Any]) -> str:
    from perf.table import table

    columns = [
        ("system", "system"),
        ("wall_seconds", "study wall time (s)"),
        ("startup_seconds", "cluster start (s)"),
        ("trials", "trials"),
        ("trial_steps", "trial epochs"),
        ("unique_steps", "unique epochs"),
        ("executed_steps", "executed epochs"),
        ("redundant_steps", "executed - unique"),
        ("best_val_acc", "best val_acc"),
        ("train_ms_per_epoch", "training ms per epoch"),
    ]
    merge = result["merge_rate"]
    parts = [
        f"{result['trials']} distinct trials x {result['epochs']} epochs of the digits grid "
        f"(`examples/digits.py`): {result['trial_steps']:,} trial epochs, {result['unique_steps']:,} "
        f"unique, merge rate {merge:.2f}; 2 workers each.",
    ]
    if "headline_ratio" not in result:
        parts.append(f"**Ray Tune {result['ray']}.** Only dagtune's rows ran.")
    parts += ["Grid search:", table(result["grid"], columns)]
    like = result["like_for_like_ratio"]
    verdict = []
    if "headline_ratio" in result:
        ratio = result["headline_ratio"]
        verdict.append(
            f"**Ray Tune / dagtune wall time: {ratio:.2f}x**, {100 * result['ratio_of_merge_rate']:.0f}% of "
            f"the merge rate ({'meets' if ratio >= 0.8 * merge else 'misses'} the 80% target)."
        )
    verdict.append(
        f"Like for like, dagtune reuse=False / dagtune: **{like:.2f}x**, "
        f"{100 * result['like_for_like_of_merge_rate']:.0f}% of the merge rate "
        f"({'meets' if like >= 0.8 * merge else 'misses'} the 80% target)."
    )
    parts.append(" ".join(verdict))
    redundant = [
        f"{kind} {r['redundant_steps']}"
        for kind, rows in (("grid", result["grid"]), ("ASHA", result["asha"]))
        for r in rows
        if r["system"] == "dagtune" and r["redundant_steps"]
    ]
    parts.append(
        "With reuse=False every trial trains its own prefix (executed = trial steps). dagtune's "
        + (
            "executed - unique is not zero: " + "; ".join(redundant) + "."
            if redundant
            else "executed epochs equal the unique epochs in both searches."
        )
    )
    a = result["asha_settings"]
    parts += [
        f"ASHA (min {a['min_steps']} epochs, eta {a['eta']}, max {result['epochs']}). Ray Tune's "
        "ASHAScheduler *stops* trials at a rung and its decisions depend on the order results arrive; "
        "dagtune's ASHA *pauses* trials at a rung and promotes them later, resuming from the rung's "
        "checkpoint. The two explore different sets of trial steps, so compare wall time per trial "
        "step, and the reuse=False row (dagtune's own ASHA, no sharing) for the sharing alone:",
        table(result["asha"], columns),
    ]
    if "headline_ratio" not in result:
        parts.append(f"Ray Tune rows: {result['ray']}.")
    parts.append(_accounts(result))
    return "\n\n".join(parts)


def _accounts(result: dict[str, Any]) -> str:
    """Where the worker-seconds of each grid run went."""
    from perf.table import table
    from perf.timeline import account_table

    rows = [r for r in result["grid"] if r.get("account")]
    text = [
        "Where the time goes (grid search; worker-seconds = 2 workers x study wall time, by activity):",
        account_table([(r["system"], r["account"], r["wall_seconds"]) for r in rows], WORKERS),
    ]
    for row in rows:
        details = row.get("details")
        if details:
            text.append(
                f"{row['system']}: {details['stages']} stages, {details['checkpoints']} checkpoints saved, "
                f"{details['loads']['storage']} loads from storage and {details['loads']['memory']} continued in "
                f"memory; gap between a worker's stages (building or loading the next trainer included) "
                f"mean {details['mean_gap_ms']:.0f} ms, median {details['median_gap_ms']:.0f} ms; "
                f"{1000 * details['train_seconds_per_step']:.0f} ms of training per epoch; coordinator busy "
                + ", ".join(f"{k} {v:.1f} s" for k, v in details["coordinator_seconds"].items())
                + "."
            )
    profiled = result.get("profiled")
    if profiled and profiled.get("profile"):
        text.append(
            f"cProfile of the coordinator thread in a separate run of the shared grid "
            f"(wall {profiled['wall_seconds']:.1f} s under the profiler), functions by own time:"
        )
        text.append(
            table(
                profiled["profile"][:10],
                [
                    ("function", "function"),
                    ("calls", "calls"),
                    ("own_s", "own s"),
                    ("cumulative_s", "cumulative s"),
                ],
            )
        )
    return "\n\n".join(text)
