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
    trainer_kwargs: dict[str, Any] = field(default_factory=dict)
    scales: tuple[int, ...] = SCALES

    def config(self, lr: float, second: Any) -> dict[str, Any]:
        """The trial's config: lr (with its schedule) and the second hyper-parameter."""
        if self.second == "schedule":
            from dagtune import Constant, Cosine

            return {"lr": Constant(lr) if second == "constant" else Cosine(lr, self.steps)}
        return {"lr": lr, self.second: second}


def experiments(mode: str) -> list[Experiment]:
    """The two grids; quick mode is sized for about 5 minutes on 2 idle cores."""
    full, smoke = mode == "full", mode == "smoke"
    digits = Experiment(
        name="digits CNN",
        module="scaled_digits",
        trainer="ScaledDigitsTrainer",
        metric="val_loss",
        base=16 if smoke else 64,
        steps=1 if smoke else 10 if full else 6,
        step_name="epochs",
        lr_exponents=(-3, -2) if smoke else tuple(range(-8 if full else -7, 0)),
        second="momentum",
        second_values=(0.9,) if smoke else (0.8, 0.9, 0.95) if full else (0.8, 0.95),
        trainer_kwargs={"base": 16 if smoke else 64},
    )
    lm_base = 32 if smoke else 128
    lm = Experiment(
        name="Transformer LM",
        module="stdlib_lm",
        trainer="StdlibLMTrainer",
        metric="val_bpb",
        base=lm_base,
        steps=1 if smoke else 8 if full else 4,
        step_name="steps",
        lr_exponents=(-7, -6) if smoke else tuple(range(-11 if full else -10, -3)),
        second="schedule",
        second_values=("constant",) if smoke else ("constant", "cosine"),
        trainer_kwargs={
            "base": lm_base,
            "heads": 2 if smoke else 4,
            "batches_per_step": 2 if smoke else 50 if full else 12,
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


def _mean_metric(runs: Sequence[dict[str, Any]]) -> float:
    values = [run["metric"] for run in runs]
    return math.inf if any(math.isinf(v) for v in values) else statistics.fmean(values)


def grid(runs: Sequence[dict[str, Any]], seeds: Sequence[int]) -> dict[tuple, float]:
    """``(experiment, parametrization, scale, second, k) -> mean metric over `seeds```."""
    cells: dict[tuple, list[dict[str, Any]]] = {}
    for run in runs:
        if run["seed"] in seeds:
            key = (run["experiment"], run["parametrization"], run["scale"], run["second"], run["k"])
            cells.setdefault(key, []).append(run)
    return {key: _mean_metric(cell) for key, cell in cells.items()}


def best_lr(
    cells: dict[tuple, float], experiment: Experiment, parametrization: str, scale: int, second: Any
) -> int:
    """The exponent k of the best learning rate 2**k (the smaller one on a tie)."""
    return min(
        experiment.lr_exponents,
        key=lambda k: (cells[(experiment.name, parametrization, scale, second, k)], k),
    )


def best_pair(
    cells: dict[tuple, float], experiment: Experiment, parametrization: str, scale: int
) -> tuple[Any, int]:
    """The best (second value, lr exponent) at a scale."""
    pairs = [(second, k) for second in experiment.second_values for k in experiment.lr_exponents]
    return min(pairs, key=lambda pair: cells[(experiment.name, parametrization, scale, *pair)])


def summarize(
    experiment: Experiment, parametrization: str, cells: dict[tuple, float], runs: list[dict]
) -> dict:
    """One summary row: best lr per width and second value, drift, transfer regret, noise."""
    row: dict[str, Any] = {"model": experiment.name, "parametrization": parametrization}
    drift = 0
    for second in experiment.second_values:
        full_k = best_lr(cells, experiment, parametrization, 1, second)
        ks = {
            scale: best_lr(cells, experiment, parametrization, scale, second) for scale in experiment.scales
        }
        drift = max(drift, *(abs(k - full_k) for k in ks.values()))
        row[f"best_lr {second}"] = " / ".join(_lr(ks[s]) for s in experiment.scales)
    pairs = {scale: best_pair(cells, experiment, parametrization, scale) for scale in experiment.scales}
    row["best pair"] = " / ".join(f"{p[0]}, {_lr(p[1])}" for p in (pairs[s] for s in experiment.scales))
    row["drift"] = drift
    full_best = cells[(experiment.name, parametrization, 1, *pairs[1])]
    transferred = cells[(experiment.name, parametrization, 1, *pairs[max(experiment.scales)])]
    row["full_best"] = full_best
    row["full_at_surrogate_best"] = transferred
    row["regret"] = transferred - full_best
    spreads = []
    for scale in (1, max(experiment.scales)):
        values = [
            run["metric"]
            for run in runs
            if (run["experiment"], run["parametrization"], run["scale"], run["second"], run["k"])
            == (experiment.name, parametrization, scale, *pairs[scale])
        ]
        if len(values) > 1 and all(math.isfinite(v) for v in values):
            spreads.append(statistics.stdev(values))
    row["noise"] = max(spreads) if spreads else math.nan
    row["noise_seeds"] = min(
        (
            sum(
                1
                for run in runs
                if (run["experiment"], run["parametrization"], run["scale"], run["second"], run["k"])
                == (experiment.name, parametrization, scale, *pairs[scale])
            )
            for scale in (1, max(experiment.scales))
        ),
        default=0,
    )
    return row


def _lr(k: int) -> str:
    return f"2^{k}"


# --------------------------------------------------------------------------- the benchmark


def benchmark(mode: str = "quick") -> dict[str, Any]:
    grid_seeds = (0, 1, 2) if mode == "full" else (0,)
    noise_seeds = (0, 1, 2)
    chosen = experiments(mode)
    context = multiprocessing.get_context("spawn")
    began = time.perf_counter()
    runs: list[dict[str, Any]] = []
    with ProcessPoolExecutor(
        2, mp_context=context, initializer=_worker_init, initargs=([EXAMPLES, str(ROOT)],)
    ) as pool:
        jobs = [
            {"experiment": e, "parametrization": p, "scale": s, "k": k, "second": v, "seed": seed}
            for e in chosen
            for p in PARAMETRIZATIONS
            for s in e.scales
            for v in e.second_values
            for k in e.lr_exponents
            for seed in grid_seeds
        ]
        runs += _run_all(jobs, pool)
        if mode != "smoke":
            cells = grid(runs, grid_seeds)
            extra = []
            for e in chosen:
                for p in PARAMETRIZATIONS:
                    for s in (1, max(e.scales)):
                        second, k = best_pair(cells, e, p, s)
                        extra += [
                            {
                                "experiment": e,
                                "parametrization": p,
                                "scale": s,
                                "k": k,
                                "second": second,
                                "seed": seed,
                            }
                            for seed in noise_seeds
                            if seed not in grid_seeds
                        ]
            runs += _run_all(extra, pool)
    cells = grid(runs, grid_seeds)
    summary = [summarize(e, p, cells, runs) for e in chosen for p in PARAMETRIZATIONS]
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
        "experiments": [
            {
                "name": e.name,
                "metric": e.metric,
                "base": e.base,
                "widths": [e.base // s for s in e.scales],
                "steps": e.steps,
                "step_name": e.step_name,
                "second": e.second,
                "second_values": list(e.second_values),
                "lrs": [_lr(k) for k in e.lr_exponents],
                "trainer_kwargs": e.trainer_kwargs,
            }
            for e in chosen
        ],
        "grid_seeds": list(grid_seeds),
        "summary": summary,
        "tables": tables,
        "runs": [{k: v for k, v in run.items()} for run in runs],
        "corpus": {
            "python": sys.version.split()[0],
            "sha256_12": corpus_digest(lm.trainer_kwargs["train_bytes"]),
        },
        "cpu_seconds": sum(run["cpu_seconds"] for run in runs),
        "wall_seconds": time.perf_counter() - began,
    }


def markdown(result: dict[str, Any]) -> str:
    from perf.table import table

    parts = []
    described = []
    for e in result["experiments"]:
        described.append(
            f"{e['name']}: widths {', '.join(map(str, e['widths']))}, {e['steps']} {e['step_name']}, "
            f"lr in {e['lrs'][0]}..{e['lrs'][-1]}, {e['second']} in {', '.join(map(str, e['second_values']))}, "
            f"metric {e['metric']} (lower is better)"
        )
    parts.append(
        "Grids: " + "; ".join(described) + f". Grid seeds: {len(result['grid_seeds'])}. "
        f"Corpus: Python {result['corpus']['python']} standard library, sha256 {result['corpus']['sha256_12']}."
    )
    columns = [("model", "model"), ("parametrization", "parametrization")]
    seconds = sorted({key for row in result["summary"] for key in row if key.startswith("best_lr ")})
    columns += [
        (key, f"best lr at width base/8 / /4 / /2 / base ({key.split(' ', 1)[1]})") for key in seconds
    ]
    columns += [
        ("best pair", "best pair (base/8 / /4 / /2 / base)"),
        ("drift", "drift (grid steps)"),
        ("full_best", "full width: best metric"),
        ("full_at_surrogate_best", "full width at base/8's best"),
        ("regret", "transfer regret"),
        ("noise", "noise (std over seeds)"),
        ("noise_seeds", "seeds"),
    ]
    parts.append(table(result["summary"], columns))
    for e in result["experiments"]:
        rows = result["tables"][e["name"]]
        grid_columns = [
            ("parametrization", "parametrization"),
            (e["second"], e["second"]),
            ("width", "width"),
        ]
        grid_columns += [(lr, f"lr {lr}") for lr in e["lrs"]]
        parts.append(
            f"**{e['name']}**: {e['metric']} after {e['steps']} {e['step_name']} (best per row in bold)"
        )
        parts.append(table(rows, grid_columns))
    parts.append(
        f"{len(result['runs'])} runs, {result['cpu_seconds']:.0f} CPU-seconds in "
        f"{result['wall_seconds']:.0f} s on 2 processes."
    )
    return "\n\n".join(parts)


if __name__ == "__main__":
    import json

    print(json.dumps(benchmark(sys.argv[1] if len(sys.argv) > 1 else "quick"), indent=1, default=str))
