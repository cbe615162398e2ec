"""Hyper-parameter transfer across width (Hydro §4.1), measured on real data on this machine.

Two real models on real data, each trained over a grid of learning rate x one more
hyper-parameter at widths base/8, base/4, base/2 and base, under muP (`dagtune.mup`) and under
the standard parametrization (SP: PyTorch's defaults, one learning rate for every parameter):

* **digits CNN** (`examples/scaled_digits.py`): scikit-learn's 8x8 digits, two convolutions
  of `width` and 2 `width` channels and a readout, SGD; lr x momentum; metric: validation
  cross-entropy after the last epoch.
* **byte-level Transformer LM** (`examples/stdlib_lm.py`): the Python standard library's own
  source files (the top-level ``*.py`` files in name order, every tenth held out for
  validation; 1 MB of training text), a 2-layer pre-norm decoder of model width `width` with 4
  heads (the head width scales with the model), AdamW; lr x schedule (constant, or cosine
  decay over the run); metric: validation bits per byte after the last step.

Every run is ``dagtune.run_alone`` (in-process, CPU, one thread) in a pool of two processes.
For every width and value of the second hyper-parameter, the table gives the learning rate
with the best metric (the grid steps are factors of 2) and the best pair; *drift* is the
largest distance, in grid steps, between a width's best learning rate and the full width's.
*Transfer regret* is what the full model loses by training with the configuration that was
best at base/8 instead of its own best. *Noise* is the standard deviation of the metric over
seeds (each seed draws other initial weights and another data order) at the best
configurations, so regrets and differences below it are not significant.

Then the surrogate study end to end (`perf/surrogate_study.py`): the digits grid tuned on
the full-width CNN against a `dt.SurrogateStudy` at S = 4 and 8 plus its target's training,
wall time, epochs and the final model's metric, on one 2-worker Dask cluster.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import statistics
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = str(ROOT / "examples")
if EXAMPLES not in sys.path:
    sys.path.insert(0, EXAMPLES)

from scaled_digits import ScaledDigitsTrainer  # noqa: E402 (from examples/, put on the path above)

from perf import surrogate_study  # noqa: E402

PARAMETRIZATIONS = ("mup", "sp")
SCALES = (8, 4, 2, 1)


@dataclass(frozen=True)
class Experiment:
    """One model's grid: learning rates x values of a second hyper-parameter, at every scale."""

    name: str
    module: str  # in examples/
    trainer: str
    metric: str  # lower is better
    base: int
    steps: int
    step_name: str
    lr_exponents: tuple[int, ...]  # lr = 2 ** k
    second: str  # the second hyper-parameter's name
    second_values: tuple[Any, ...]
    seeds: tuple[int, ...]  # every grid point is trained with each
    trainer_kwargs: dict[str, Any] = field(default_factory=dict)
    scales: tuple[int, ...] = SCALES

    def config(self, lr: float, second: Any) -> dict[str, Any]:
        """The trial's config: the learning rate and the second hyper-parameter."""
        return {"lr": lr, self.second: second}


def experiments(mode: str) -> list[Experiment]:
    """The two grids; quick mode is sized for about 5 minutes on 2 idle cores."""
    full, smoke = mode == "full", mode == "smoke"
    digits = Experiment(
        name="digits CNN",
        module="scaled_digits",
        trainer="ScaledDigitsTrainer",
        metric="val_loss",
        base=16 if smoke else 128 if full else 64,
        steps=1 if smoke else 10 if full else 6,
        step_name="epochs",
        lr_exponents=(-3, -2) if smoke else tuple(range(-8 if full else -7, 0)),
        second="momentum",
        second_values=(0.9,) if smoke else (0.8, 0.9, 0.95) if full else (0.8, 0.95),
        seeds=(0,) if smoke else (0, 1, 2) if full else (0, 1),
        trainer_kwargs={"base": 16 if smoke else 128 if full else 64},
    )
    lm_base = 32 if smoke else 128
    batches = 2 if smoke else 50 if full else 12
    lm = Experiment(
        name="Transformer LM",
        module="stdlib_lm",
        trainer="StdlibLMTrainer",
        metric="val_bpb",
        base=lm_base,
        steps=1 if smoke else 8 if full else 4,
        step_name=f"steps of {batches} batches of 32 windows",
        lr_exponents=(-7, -6) if smoke else tuple(range(-11 if full else -10, -3)),
        second="output_mult",
        second_values=(1.0,) if smoke else (1.0, 4.0),
        seeds=(0, 1) if full else (0,),
        trainer_kwargs={
            "base": lm_base,
            "heads": 2 if smoke else 4,
            "batches_per_step": batches,
            "train_bytes": 100_000 if smoke else 1_000_000,
        },
    )
    return [digits, lm]


# --------------------------------------------------------------------------- running


def _worker_init(paths: list[str]) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    sys.path[:0] = [p for p in paths if p not in sys.path]


def _train(job: dict[str, Any]) -> dict[str, Any]:
    """One run through ``dagtune.run_alone``; its final metric and CPU seconds."""
    import importlib

    import dagtune as dt

    experiment: Experiment = job["experiment"]
    trainer = getattr(importlib.import_module(experiment.module), experiment.trainer)
    kwargs = {**experiment.trainer_kwargs, "scale": job["scale"], "parametrization": job["parametrization"]}
    began = time.process_time()
    metrics = dt.run_alone(
        trainer, experiment.config(2.0 ** job["k"], job["second"]), experiment.steps, kwargs, seed=job["seed"]
    )
    value = metrics[-1][experiment.metric]
    return {
        **{key: job[key] for key in ("parametrization", "scale", "k", "second", "seed")},
        "experiment": experiment.name,
        "metric": value if math.isfinite(value) else math.inf,
        "cpu_seconds": time.process_time() - began,
    }


def _run_all(jobs: list[dict[str, Any]], pool: ProcessPoolExecutor) -> list[dict[str, Any]]:
    jobs = sorted(jobs, key=lambda job: job["scale"])  # widest first: the pool ends evenly
    return list(pool.map(_train, jobs))


# --------------------------------------------------------------------------- analysis

Cell = tuple[str, str, int, Any, int]  # experiment, parametrization, scale, second value, lr exponent


def _cell(run: dict[str, Any]) -> Cell:
    return (run["experiment"], run["parametrization"], run["scale"], run["second"], run["k"])


def grid(runs: Sequence[dict[str, Any]], experiments: Sequence[Experiment]) -> dict[Cell, float]:
    """The mean metric of every grid point over its experiment's grid seeds (inf if any diverged)."""
    seeds = {e.name: e.seeds for e in experiments}
    values: dict[Cell, list[float]] = {}
    for run in runs:
        if run["seed"] in seeds[run["experiment"]]:
            values.setdefault(_cell(run), []).append(run["metric"])
    return {
        cell: math.inf if any(math.isinf(v) for v in metrics) else statistics.fmean(metrics)
        for cell, metrics in values.items()
    }


def best_lr(cells: dict[Cell, float], e: Experiment, parametrization: str, scale: int, second: Any) -> int:
    """The exponent k of the best learning rate 2**k (the smaller one on a tie)."""
    return min(e.lr_exponents, key=lambda k: (cells[(e.name, parametrization, scale, second, k)], k))


def best_pair(cells: dict[Cell, float], e: Experiment, parametrization: str, scale: int) -> tuple[Any, int]:
    """The best (second value, lr exponent) at a scale."""
    pairs = [(second, k) for second in e.second_values for k in e.lr_exponents]
    return min(pairs, key=lambda pair: cells[(e.name, parametrization, scale, *pair)])


def summarize(e: Experiment, parametrization: str, cells: dict[Cell, float], runs: list[dict]) -> dict:
    """One summary row: best lr per width and second value, drift, transfer regret, noise."""
    lines, drift = [], 0
    for second in e.second_values:
        ks = [best_lr(cells, e, parametrization, scale, second) for scale in e.scales]
        drift = max(drift, *(abs(k - ks[-1]) for k in ks))  # e.scales ends with the full width
        lines.append(f"{e.second} {second}: " + " ".join(_lr(k) for k in ks))
    pairs = {scale: best_pair(cells, e, parametrization, scale) for scale in e.scales}
    surrogate = max(e.scales)
    full_best = cells[(e.name, parametrization, 1, *pairs[1])]
    transferred = cells[(e.name, parametrization, 1, *pairs[surrogate])]
    spreads, counts = [], []
    for scale in (1, surrogate):
        values = [
            run["metric"] for run in runs if _cell(run) == (e.name, parametrization, scale, *pairs[scale])
        ]
        counts.append(len(values))
        if len(values) > 1 and all(math.isfinite(v) for v in values):
            spreads.append(statistics.stdev(values))
    return {
        "model": e.name,
        "parametrization": parametrization,
        "best_lrs": "<br>".join(lines),
        "best_pairs": " ".join(f"({p[0]}, {_lr(p[1])})" for p in (pairs[s] for s in e.scales)),
        "drift": drift,
        "full_best": full_best,
        "full_at_surrogate_best": transferred,
        "regret": transferred - full_best,
        "noise": max(spreads) if spreads else math.nan,
        "noise_seeds": min(counts),
    }


def _lr(k: int) -> str:
    return f"2^{k}"


# --------------------------------------------------------------------------- the benchmark

NOISE_SEEDS = (0, 1, 2)


def _job(e: Experiment, parametrization: str, scale: int, second: Any, k: int, seed: int) -> dict[str, Any]:
    return {
        "experiment": e,
        "parametrization": parametrization,
        "scale": scale,
        "second": second,
        "k": k,
        "seed": seed,
    }


def benchmark(mode: str = "quick") -> dict[str, Any]:
    chosen = experiments(mode)
    began = time.perf_counter()
    pool = ProcessPoolExecutor(
        2,
        mp_context=multiprocessing.get_context("spawn"),
        initializer=_worker_init,
        initargs=([EXAMPLES, str(ROOT)],),
    )
    with pool:
        runs = _run_all(
            [
                _job(e, p, s, v, k, seed)
                for e in chosen
                for p in PARAMETRIZATIONS
                for s in e.scales
                for v in e.second_values
                for k in e.lr_exponents
                for seed in e.seeds
            ],
            pool,
        )
        if mode != "smoke":  # more seeds at the full width's and the surrogate's best, for the noise
            cells = grid(runs, chosen)
            runs += _run_all(
                [
                    _job(e, p, s, *best_pair(cells, e, p, s), seed)
                    for e in chosen
                    for p in PARAMETRIZATIONS
                    for s in (1, max(e.scales))
                    for seed in NOISE_SEEDS
                    if seed not in e.seeds
                ],
                pool,
            )
    end_to_end = surrogate_study.run(mode, ScaledDigitsTrainer)  # the pool is closed: both cores are free
    cells = grid(runs, chosen)
    tables = {}
    for e in chosen:
        rows = []
        for p in PARAMETRIZATIONS:
            for v in e.second_values:
                for s in e.scales:
                    best = best_lr(cells, e, p, s, v)
                    row = {"parametrization": p, e.second: v, "width": e.base // s}
                    for k in e.lr_exponents:
                        value = cells[(e.name, p, s, v, k)]
                        row[_lr(k)] = f"**{value:.3f}**" if k == best else f"{value:.3f}"
                    rows.append(row)
        tables[e.name] = rows
    from stdlib_lm import corpus_digest

    lm = next(e for e in chosen if e.module == "stdlib_lm")
    return {
        "command": "python -m perf --only surrogate"
        + {"quick": "", "full": " --full", "smoke": " --smoke"}[mode],
        "experiments": [
            {
                "name": e.name,
                "metric": e.metric,
                "widths": [e.base // s for s in e.scales],
                "steps": e.steps,
                "step_name": e.step_name,
                "second": e.second,
                "second_values": list(e.second_values),
                "lrs": [_lr(k) for k in e.lr_exponents],
                "seeds": len(e.seeds),
                "trainer_kwargs": e.trainer_kwargs,
            }
            for e in chosen
        ],
        "summary": [summarize(e, p, cells, runs) for e in chosen for p in PARAMETRIZATIONS],
        "tables": tables,
        "runs": [{key: value for key, value in run.items()} for run in runs],
        "corpus": {
            "python": sys.version.split()[0],
            "sha256_12": corpus_digest(lm.trainer_kwargs["train_bytes"]),
        },
        "end_to_end": end_to_end,
        "cpu_seconds": sum(run["cpu_seconds"] for run in runs),
        "wall_seconds": time.perf_counter() - began,
    }


def markdown(result: dict[str, Any]) -> str:
    from perf.table import table

    described = [
        f"{e['name']}: widths {', '.join(map(str, e['widths']))}, {e['steps']} {e['step_name']}, "
        f"lr {e['lrs'][0]} to {e['lrs'][-1]}, {e['second']} {', '.join(map(str, e['second_values']))}, "
        f"{e['seeds']} seed(s) per grid point, metric {e['metric']} (lower is better)"
        for e in result["experiments"]
    ]
    parts = [
        "Grids: "
        + "; ".join(described)
        + f". The LM's corpus: Python {result['corpus']['python']}'s standard library "
        f"(sha256 {result['corpus']['sha256_12']}).",
        table(
            result["summary"],
            [
                ("model", "model"),
                ("parametrization", "parametrization"),
                ("best_lrs", "best lr at width base/8, /4, /2, base"),
                ("best_pairs", "best pair at width base/8, /4, /2, base"),
                ("drift", "drift (grid steps)"),
                ("full_best", "full width: best metric"),
                ("full_at_surrogate_best", "full width at base/8's best pair"),
                ("regret", "transfer regret"),
                ("noise", "noise (std over seeds)"),
                ("noise_seeds", "seeds"),
            ],
        ),
    ]
    for e in result["experiments"]:
        columns = [("parametrization", "parametrization"), (e["second"], e["second"]), ("width", "width")]
        columns += [(lr, f"lr {lr}") for lr in e["lrs"]]
        parts.append(
            f"**{e['name']}**: {e['metric']} after {e['steps']} {e['step_name']}, mean over seeds (best lr per row in bold)"
        )
        parts.append(table(result["tables"][e["name"]], columns))
    parts += surrogate_study.markdown(result["end_to_end"])
    parts.append(
        f"From `{result['command']}`: {len(result['runs'])} transfer runs, {result['cpu_seconds']:.0f} CPU-seconds "
        f"in {result['wall_seconds']:.0f} s of wall time on 2 processes (the wall time grows with whatever "
        "else the machine runs; the CPU-seconds do not)."
    )
    return "\n\n".join(parts)


if __name__ == "__main__":
    import json

    print(json.dumps(benchmark(sys.argv[1] if len(sys.argv) > 1 else "quick"), indent=1, default=str))
