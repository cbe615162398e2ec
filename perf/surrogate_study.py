"""A surrogate study end to end against tuning the full model (Hydro Tables 2-3), on this CPU.

The same grid of lr x momentum for the digits CNN (`examples/scaled_digits.py`, muP, SGD) is
tuned three ways on one real 2-worker Dask cluster, one after the other in one run:

* **full width**: a `dt.Study` of the CNN at width `base`, the grid trained to the end; its
  best trial is the model it gives.
* **surrogate S=4 and S=8**: a `dt.SurrogateStudy` (`examples/surrogate.py`): the grid on the
  CNN at width ``base / S``, then the full CNN trained once with the best configuration
  found (eager transfer at half the grid, as Hydro does: the target starts on the first
  worker slot the search leaves idle once half the grid has ended).
* **surrogate S=8, waiting**: the same without eager transfer (the target starts when the
  search has ended), to measure what eager transfer saves.

Each arm has its own empty storage, so nothing is reused from another arm, and the arms run
in turn, twice (two rounds), so that what else the machine runs falls on each. Reported: wall
time from the study's start to its model (the cluster's start and a first small study, whose
one-time costs would fall on the first arm, are excluded), trial
steps (epochs) of the search and of the target, and the validation loss of the model each
gives. Every arm's chosen configuration is then trained at full width with seeds 0, 1, 2
(other initial weights; `dt.run_alone`; seed 0 is the arm's own model, bit for bit): their
mean compares the configurations without the luck of one seed (the full-width search picks
the best of 21 draws, so its own seed-0 loss is biased low), their standard deviation is the
noise a difference must exceed to mean anything.
"""

from __future__ import annotations

import math
import statistics
import tempfile
import time
from typing import Any

import dagtune as dt
from dagtune.algos import GridSearch
from dagtune.config import config_dumps
from perf.smoke import cluster_client

SEEDS = (0, 1, 2)  # every arm's chosen config trained at full width with each: the noise


def sizes(mode: str) -> dict[str, Any]:
    """The grid, the width and the epochs for each mode (quick: a few minutes on 2 cores)."""
    if mode == "smoke":
        return {
            "base": 16,
            "epochs": 1,
            "lr_exponents": (-3, -2),
            "momenta": (0.9,),
            "scales": (4,),
            "rounds": 1,
        }
    return {
        "base": 128 if mode == "full" else 64,
        "epochs": 10 if mode == "full" else 6,
        "lr_exponents": tuple(range(-7, 0)),
        "momenta": (0.8, 0.9, 0.95),
        "scales": (4, 8),
        "rounds": 2,
    }


def _space(size: dict[str, Any]) -> dt.Grid:
    return dt.Grid({"lr": [2.0**k for k in size["lr_exponents"]], "momentum": list(size["momenta"])})


def _shown(config: dict) -> str:
    """``lr 2^-3, momentum 0.9``."""
    lr = float(config["lr"].value)
    return f"lr 2^{round(math.log2(lr))}, momentum {float(config['momentum'].value):g}"


def _full_width(trainer: type, size: dict[str, Any], storage: str, client: Any) -> dict[str, Any]:
    """Arm (a): the grid on the full-width model; its best trial is the model."""
    began = time.perf_counter()
    with dt.Study(trainer, {"base": size["base"]}, name="full", storage=storage, client=client) as study:
        result = study.run(GridSearch(_space(size), "val_loss", "min", steps=size["epochs"]))
    wall = time.perf_counter() - began
    best = result.best
    return {
        "arm": "full width",
        "scale": 1,
        "wall_seconds": wall,
        "search_trial_steps": result.report["trial_steps"],
        "target_steps": 0,
        "config": best.config,
        "metric": best.metrics["val_loss"],
        "val_acc": best.metrics["val_acc"],
        "restarts": 0,
    }


def _surrogate(
    trainer: type, size: dict[str, Any], scale: int, storage: str, client: Any, eager: float | None = 0.5
) -> dict[str, Any]:
    """Arm (b): the grid on the surrogate at `scale`, then the target with its best (eagerly,
    or once the search has ended with `eager` None)."""
    began = time.perf_counter()
    with dt.SurrogateStudy(
        trainer,
        {"base": size["base"]},
        dt.Surrogate(scale=scale, eager=eager),
        name=f"s{scale}",
        storage=storage,
        client=client,
    ) as study:
        transferred = study.run(GridSearch(_space(size), "val_loss", "min", steps=size["epochs"]))
    wall = time.perf_counter() - began
    return {
        "arm": f"surrogate S={scale} + target" + ("" if eager is not None else ", waiting"),
        "scale": scale,
        "wall_seconds": wall,
        "search_trial_steps": transferred.surrogate.report["trial_steps"],
        "target_steps": transferred.target_report["trial_steps"],
        "config": transferred.config,
        "metric": transferred.target.metrics["val_loss"],
        "val_acc": transferred.target.metrics["val_acc"],
        "restarts": transferred.restarts,
    }


def run(mode: str, trainer: type) -> dict[str, Any]:
    """The arms, `rounds` times in turn on one embedded 2-worker cluster (whatever else the
    machine runs meanwhile falls on every arm alike), then the seed runs."""
    size = sizes(mode)
    epochs, kwargs = size["epochs"], {"base": size["base"]}
    rounds: list[list[dict[str, Any]]] = []
    with cluster_client(mode, 2) as client, tempfile.TemporaryDirectory(prefix="dagtune-surrogate-") as root:
        client.run(__import__, trainer.__module__)  # every arm finds the workers warm
        with dt.Study(
            trainer, {**kwargs, "scale": 2}, name="warm-up", storage=f"{root}/warm-up", client=client
        ) as study:
            study.run(  # the first study's one-time costs
                GridSearch(dt.Grid({"lr": [0.1, 0.2]}), "val_loss", "min", steps=1)
            )
        for r in range(size["rounds"]):
            arms = [_full_width(trainer, size, f"{root}/{r}/full", client)]
            arms += [_surrogate(trainer, size, s, f"{root}/{r}/s{s}", client) for s in size["scales"]]
            waiting = max(size["scales"])
            arms.append(_surrogate(trainer, size, waiting, f"{root}/{r}/wait{waiting}", client, eager=None))
            rounds.append(arms)
        for arms in rounds[1:]:  # training is deterministic: every round chooses and trains alike
            for arm, first in zip(arms, rounds[0], strict=True):
                assert (config_dumps(arm["config"]), arm["metric"]) == (
                    config_dumps(first["config"]),
                    first["metric"],
                )
        arms = rounds[0]
        chosen = {config_dumps(arm["config"]): arm["config"] for arm in arms}
        jobs = [(text, seed) for text in chosen for seed in SEEDS]
        curves = client.gather(
            client.map(
                dt.run_alone,
                [trainer] * len(jobs),
                [chosen[text] for text, _ in jobs],
                [epochs] * len(jobs),
                [kwargs] * len(jobs),
                [seed for _, seed in jobs],
                pure=False,
            )
        )
    seeded: dict[str, list[float]] = {}
    for (text, _), curve in zip(jobs, curves, strict=True):
        seeded.setdefault(text, []).append(curve[-1]["val_loss"])
    for i, arm in enumerate(arms):
        arm["walls"] = [each[i]["wall_seconds"] for each in rounds]
        arm["target_steps"] = [each[i]["target_steps"] for each in rounds]  # eager: timing-dependent
        arm["restarts"] = [each[i]["restarts"] for each in rounds]
        arm["wall_seconds"] = statistics.fmean(arm["walls"])
        values = seeded[config_dumps(arm["config"])]
        assert values[0] == arm["metric"], "seed 0 alone must give the study's model exactly"
        arm["seeds"] = values
        arm["mean"] = statistics.fmean(values)
        arm["std"] = statistics.stdev(values) if len(values) > 1 else math.nan
        arm["speedups"] = [each[0]["wall_seconds"] / each[i]["wall_seconds"] for each in rounds]
        arm["speedup"] = arms[0]["wall_seconds"] / arm["wall_seconds"]
        arm["vs_full"] = arm["mean"] - arms[0]["mean"]
        arm["config"] = _shown(arm["config"])
    return {
        "sizes": {**size, "grid": len(size["lr_exponents"]) * len(size["momenta"])},
        "arms": arms,
        "noise": max(arm["std"] for arm in arms),
    }


def markdown(result: dict[str, Any]) -> list[str]:
    """The end-to-end table and what it was run with."""
    from perf.table import table

    s = result["sizes"]
    lrs = f"2^{s['lr_exponents'][0]}..2^{s['lr_exponents'][-1]}"
    momenta = ", ".join(f"{m:g}" for m in s["momenta"])
    rows = [
        {
            **arm,
            "wall": " / ".join(f"{w:.1f}" for w in arm["walls"]),
            "target_steps": " / ".join(map(str, arm["target_steps"])),
            "restarts": " / ".join(map(str, arm["restarts"])),
            "speedup": " / ".join(f"{x:.1f}x" for x in arm["speedups"]) + f" (means: {arm['speedup']:.1f}x)",
            "metric": f"{arm['metric']:.4f}",
            "seeds": f"{arm['mean']:.4f} ± {arm['std']:.4f}",
            "vs_full": "–" if arm["scale"] == 1 else f"{arm['vs_full']:+.4f}",
            "val_acc": f"{arm['val_acc']:.4f}",
        }
        for arm in result["arms"]
    ]
    return [
        f"**End to end** (`perf/surrogate_study.py`): the digits CNN (muP, SGD) at width {s['base']}, "
        f"grid lr {lrs} x momentum {momenta} ({s['grid']} configs, {s['epochs']} epochs each), on a "
        "2-worker local Dask cluster, each arm with empty storage; the surrogate arms transfer eagerly "
        "at half the grid, on a slot the search leaves idle (but the one marked waiting, which trains "
        f"the target after the search). Wall time from the study's start to the model it gives, in each of "
        f"{s['rounds']} rounds (every arm once per round, in turn; the ratio of the means in brackets); "
        "target epochs "
        "include those of eager targets stopped for a better configuration.",
        table(
            rows,
            [
                ("arm", "arm"),
                ("wall", "wall (s) per round"),
                ("speedup", "faster than full width, per round"),
                ("search_trial_steps", "search epochs"),
                ("target_steps", "target epochs"),
                ("restarts", "eager restarts"),
                ("config", "chosen config"),
                ("metric", "model's val_loss"),
                ("val_acc", "model's val_acc"),
                ("seeds", f"chosen config at full width, seeds {', '.join(map(str, SEEDS))}: mean ± std"),
                ("vs_full", "mean minus full width's"),
            ],
        ),
        f"Noise: the largest standard deviation over seeds of one configuration is {result['noise']:.4f}.",
        *_eager_verdict(result["arms"]),
    ]


def _eager_verdict(arms: list[dict[str, Any]]) -> list[str]:
    """Eager transfer against waiting, at the scale both ran (runs recorded before the
    waiting arm existed have none)."""
    waiting = [arm for arm in arms if arm["arm"].endswith(", waiting")]
    if not waiting:
        return []
    wait = waiting[0]
    eager = next(arm for arm in arms if arm["arm"] == f"surrogate S={wait['scale']} + target")
    rounds = " / ".join(f"{w / e:.2f}" for w, e in zip(wait["walls"], eager["walls"], strict=True))
    return [
        f"Eager transfer at S={wait['scale']} against waiting for the search to end: "
        f"{eager['wall_seconds']:.1f} s against {wait['wall_seconds']:.1f} s on average (waiting / eager "
        f"per round: {rounds}); eager restarts {' / '.join(map(str, eager['restarts']))}, eager target "
        f"epochs {' / '.join(map(str, eager['target_steps']))} against {wait['target_steps'][0]}."
    ]
