"""All three together: a surrogate (S = 8), fusion and prefix sharing against Ray Tune at full width.

Hydro's headline (8.7 to 78.5x over Ray Tune) comes from surrogates and fusion together;
dagtune adds the stage tree on top. One grid of learning-rate schedules for a muP-scaled CNN
on scikit-learn's 8x8 digits (nothing is downloaded) is tuned two ways, side by side in one
run, on 2 single-threaded worker slots each:

* **Ray Tune at full width, trial-based**: every trial trains on its own at full width
  (`perf/raytune.py`'s function trainable: ``reuse_actors=True``, one CPU each, a checkpoint
  at each trial's end, ``ray.init(num_cpus=2)``); its chosen configuration is the trial with
  the lowest final ``val_loss``.
* **dagtune, all three on**: a `dt.SurrogateStudy` with ``dt.Surrogate(scale=8, eager=0.5)``
  and ``fuse=16`` on the embedded Dask cluster (2 workers, torch threads 1): the grid trains
  on the CNN at 1/8 of the width, its trials' shared schedule prefixes trained once (the
  stage tree) and stages that start together trained as fused tasks; then the full-width
  CNN trains once with the best configuration (the target, eagerly at half the grid, on a
  slot the search leaves idle). Its chosen configuration is the one transferred.

The trainer (`ScaledCNN`, below) is `examples/scaled_digits.py`'s CNN (two 3x3 convolutions of
``width`` and ``2 width`` channels, max pooling, a muP readout; SGD with momentum 0.9) written
as a `dt.FusibleTrainer`. A fusible trainer's optimizer has one learning rate for every
parameter, while muP's SGD gives each parameter its own multiple of it
(`dagtune.mup.lr_multiplier`); so each parameter is stored divided by the square root ``a`` of
its multiple and multiplied by ``a`` in the forward pass, which makes one SGD step with ``lr``
change the effective weight by exactly the step of ``lr`` times the multiple (momentum is
linear, so it carries over; at full width every multiple is 1 and the model is the plain
one). The benchmark checks this first: the trainer's validation losses against
`examples/scaled_digits.py`'s after 3 epochs at S = 8 and at full width (reported).

The grid: learning rates 2^-6..2^-1 x 6 decay schedules that all start constant and share
prefixes (constant; step decays by 10x at a quarter, half or three quarters of the epochs;
at half and three quarters; cosine decay over the second half), momentum 0.9, batches of 64.

Timed: Ray Tune's `Tuner.fit` (its trial actors start, and import torch, inside it, as they
do in every Ray Tune study), in a Python process of its own that exits after it (Ray's driver
leaves threads, signal handlers and environment variables in the process that ran it, and
dagtune's arm and the Dask scheduler run in the benchmark's process); dagtune's `SurrogateStudy` from construction to its trained
target, each run with its own empty storage. Not timed: ``ray.init`` and the Dask cluster's
start (both reported), and one untimed warm-up surrogate study of 2 configs x 1 epoch on the
Dask workers (imports, first fused calls), as a long-lived cluster has them done. The two
arms alternate (dagtune, Ray Tune, dagtune in quick mode: Ray Tune's long run between two of
dagtune's), so whatever else the machine runs falls on both. Then each arm's chosen
configuration trains at full width with several seeds (`dt.run_alone`, unfused, on the Dask
workers; other initial weights and data order per seed): the mean ± standard deviation of its
final ``val_loss`` compares the two choices without the luck of one seed, the standard
deviation is the noise.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = str(ROOT / "examples")
if EXAMPLES not in sys.path:
    sys.path.insert(0, EXAMPLES)

from digits import digits_split  # noqa: E402 (from examples/, put on the path above)

import dagtune as dt  # noqa: E402
from dagtune.algos import GridSearch  # noqa: E402
from dagtune.config import config_dumps, config_from_json, normalize_config  # noqa: E402
from perf import raytune  # noqa: E402
from perf.machine import describe  # noqa: E402
from perf.smoke import cluster_client  # noqa: E402

WORKERS = 2
SCALE = 8  # the surrogate's width divisor
FUSE = 16  # the most trials one fused task trains
MOMENTUM = 0.9
BATCH_SIZE = 64
GOAL = 10.0  # Ray Tune's wall time over dagtune's


# --------------------------------------------------------------------------- the trainer


class MultipliedConv2d(nn.Conv2d):
    """A convolution whose weight and bias are multiplied by constants in the forward pass
    (`weight_mult`, `bias_mult`: muP's per-parameter learning rates as multipliers)."""

    weight_mult = 1.0
    bias_mult = 1.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.conv2d(x, self.weight * self.weight_mult, self.bias * self.bias_mult, padding=self.padding)


class MultipliedReadout(dt.mup.Readout):
    """`dt.mup.Readout` with its weight and bias multiplied by constants in the forward pass."""

    weight_mult = 1.0
    bias_mult = 1.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scaled = x * (self.output_mult / self.width_mult)
        return F.linear(scaled, self.weight * self.weight_mult, self.bias * self.bias_mult)


def make_cnn(width: int) -> nn.Sequential:
    """`examples/scaled_digits.py`'s CNN, layer for layer, with multiplied layers."""
    return nn.Sequential(
        MultipliedConv2d(1, width, kernel_size=3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        MultipliedConv2d(width, 2 * width, kernel_size=3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        MultipliedReadout(2 * width * 2 * 2, 10),
    )


def fold_learning_rates(model: nn.Module) -> None:
    """Move muP's SGD learning-rate multiple ``m`` of every parameter of a `dt.mup.build`
    model into the forward pass: store the parameter divided by ``sqrt(m)``, multiply it by
    ``sqrt(m)`` where it is used. SGD with one ``lr`` then moves each effective weight by
    ``lr * m`` times its gradient, as `dt.mup.SGD`'s parameter groups do."""
    table = dt.mup.shapes(model)
    with torch.no_grad():
        for module_name, module in model.named_modules():
            for name, parameter in module.named_parameters(recurse=False):
                full = f"{module_name}.{name}" if module_name else name
                root = math.sqrt(dt.mup.lr_multiplier(table[full], "mup", "sgd"))
                parameter.div_(root)
                setattr(module, f"{name}_mult", root)


class ScaledCNN(dt.FusibleTrainer):
    """The digits CNN at width ``base / scale`` under muP, fusible; one step is one epoch.

    `lr` and `momentum` are fusible (they may differ inside a fused group), `batch_size` sets
    the batch size. `seed` fixes the order of the training data (the weights come from torch's
    global RNG, which dagtune seeds).
    """

    fusible: ClassVar[dict[str, str]] = {"lr": "lr", "momentum": "momentum"}
    batch_size_name = "batch_size"

    def __init__(self, scale: int = 1, base: int = 64, seed: int = 0):
        torch.set_num_threads(1)  # a fixed sequence of floating-point operations
        train_x, train_y, val_x, val_y = digits_split(0.2, 0)
        self.train_x, self.train_y = torch.from_numpy(train_x.copy()), torch.from_numpy(train_y.copy())
        self.val_x, self.val_y = torch.from_numpy(val_x.copy()), torch.from_numpy(val_y.copy())
        model = dt.mup.build(make_cnn, base=base, scale=scale)
        fold_learning_rates(model)
        super().__init__(
            model=model,
            optimizer=dt.SGD(lr=0.05, momentum=MOMENTUM),
            batches=dt.ResumableBatches(len(self.train_y), BATCH_SIZE, seed=seed),
        )

    def batch(self, indices: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        index = torch.from_numpy(indices)
        return self.train_x[index], self.train_y[index]

    def loss(self, model, batch) -> torch.Tensor:
        images, labels = batch
        return F.cross_entropy(model(images), labels, reduction="none")

    def evaluate_model(self, model) -> dict[str, float]:
        logits = model(self.val_x)
        loss = F.cross_entropy(logits, self.val_y).item()
        accuracy = (logits.argmax(dim=1) == self.val_y).double().mean().item()
        return {"val_loss": loss, "val_acc": accuracy}


def transfer_check(base: int, epochs: int = 3) -> dict[str, float]:
    """The largest difference of validation loss, epoch by epoch, between `ScaledCNN` and
    `examples/scaled_digits.py`'s trainer (muP with `dt.mup.SGD`'s parameter groups), at S = 8
    and at full width: the folded multipliers train the same model."""
    from scaled_digits import ScaledDigitsTrainer

    config = {"lr": 2.0**-2, "momentum": MOMENTUM, "batch_size": BATCH_SIZE}
    differences = {}
    for scale in (SCALE, 1):
        ours = dt.run_alone(ScaledCNN, config, epochs, {"scale": scale, "base": base})
        theirs = dt.run_alone(ScaledDigitsTrainer, config, epochs, {"scale": scale, "base": base})
        differences[f"S={scale}"] = max(
            abs(a["val_loss"] - b["val_loss"]) for a, b in zip(ours, theirs, strict=True)
        )
    return differences


# --------------------------------------------------------------------------- the grid


def sizes(mode: str) -> dict[str, Any]:
    """The model's width, the epochs, the grid and the seeds of each mode (quick: about 10
    minutes on 2 loaded cores)."""
    if mode == "smoke":
        return {
            "base": 16,
            "epochs": 4,
            "lr_exponents": (-3, -2),
            "schedules": 2,
            "seeds": (0, 1),
            "order": ("dagtune", "ray"),
        }
    return {
        "base": 128,
        "epochs": 12 if mode == "full" else 8,
        "lr_exponents": tuple(range(-6, 0)),
        "schedules": 6,
        "seeds": (0, 1, 2, 3) if mode == "full" else (0, 1, 2),
        # Ray Tune's runs are the long ones: each lies between two of dagtune's
        "order": ("dagtune", "ray") * (2 if mode == "full" else 1) + ("dagtune",),
    }


def schedules(lr: float, epochs: int) -> list[Any]:
    """Learning-rate schedules starting at `lr` for `epochs` epochs, all constant at first, so
    that they share prefixes: constant, step decays by 10x at a quarter, half or three
    quarters of the epochs, at half and three quarters, and cosine decay over the second half."""
    quarter, half = epochs // 4, epochs // 2
    three = 3 * epochs // 4
    return [
        dt.Constant(lr),
        dt.MultiStep(lr, [half], 0.1),
        dt.MultiStep(lr, [quarter], 0.1),
        dt.MultiStep(lr, [three], 0.1),
        dt.MultiStep(lr, [half, three], 0.1),
        dt.Piecewise((0, lr), (half, dt.Cosine(lr, epochs - half))),
    ]


def search_space(size: dict[str, Any]) -> list[dict[str, Any]]:
    """The grid: every learning rate with each of its first `size["schedules"]` schedules."""
    return [
        normalize_config({"lr": schedule, "momentum": MOMENTUM, "batch_size": BATCH_SIZE})
        for k in size["lr_exponents"]
        for schedule in schedules(2.0**k, size["epochs"])[: size["schedules"]]
    ]


def shown(config: dict[str, Any]) -> str:
    """A configuration's learning-rate schedule, as its repr."""
    return repr(config["lr"])


# --------------------------------------------------------------------------- the two arms


def run_ray(configs: list[dict], size: dict[str, Any]) -> dict[str, Any]:
    """Ray Tune, trial-based at full width; its chosen config is the trial with the lowest
    final val_loss."""
    ran = raytune.run_ray(
        configs,
        size["epochs"],
        trainer=ScaledCNN,
        kwargs={"base": size["base"]},
        metric="val_loss",
        mode="min",
    )
    by_repr = {repr(config_from_json(json.loads(config_dumps(c)))): c for c in configs}
    finals = {text: value for text, value in ran["finals"].items() if math.isfinite(value)}
    chosen = min(finals, key=finals.__getitem__)
    return {
        "arm": "Ray Tune, full width, trial-based",
        "wall_seconds": ran["wall_seconds"],
        "startup_seconds": ran["startup_seconds"],
        "trials": ran["trials"],
        "search_steps": ran["executed_steps"],
        "search_width": size["base"],
        "target_steps": 0,
        "config": by_repr[chosen],
        "metric": finals[chosen],
        "train_ms_per_epoch": ran["train_ms_per_epoch"],
        "account": ran["account"],
    }


# the child imports this module by its name, as the in-process arm did, so that Ray's workers
# import `ScaledCNN` from it rather than receiving a copy of a ``__main__`` class
_CHILD = "import sys; from perf import all_three; all_three._ray_arm_main(sys.argv[1:])"


def run_ray_apart(mode: str, configs: list[dict]) -> dict[str, Any]:
    """`run_ray` in a fresh Python process of this interpreter, which exits when it returns:
    Ray's driver leaves its state in the process that ran it (a dozen idle threads, its
    signal handlers and excepthook, ``RAY_*`` environment variables), and that process is
    the one that then runs dagtune's study and the Dask scheduler; apart, each arm runs in a
    process that only it used."""
    import subprocess

    with tempfile.TemporaryDirectory(prefix="dagtune-all-three-ray-") as folder:
        out = Path(folder) / "ray.json"
        subprocess.run(
            [sys.executable, "-c", _CHILD, "--ray-arm", mode, "--out", str(out)],
            cwd=ROOT,
            check=True,
        )
        ran = json.loads(out.read_text())
    by_text = {config_dumps(c): c for c in configs}
    return {**ran, "config": by_text[ran["config"]]}


def _ray_arm_main(argv: list[str]) -> None:
    """The child side of `run_ray_apart`: Ray Tune's arm of `mode`, its result as JSON."""
    import argparse

    parser = argparse.ArgumentParser(description=_ray_arm_main.__doc__)
    parser.add_argument("--ray-arm", required=True, choices=("smoke", "quick", "full"))
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    size = sizes(args.ray_arm)
    ran = run_ray(raytune.distinct(search_space(size), size["epochs"]), size)
    Path(args.out).write_text(json.dumps({**ran, "config": config_dumps(ran["config"])}))


def run_dagtune(client: Any, configs: list[dict], size: dict[str, Any], storage: str) -> dict[str, Any]:
    """dagtune with a surrogate at S = 8, fusion and prefix sharing, on `client`'s cluster."""
    began, began_clock = time.perf_counter(), time.time()
    with dt.SurrogateStudy(
        ScaledCNN,
        {"base": size["base"]},
        dt.Surrogate(scale=SCALE, eager=0.5),
        name="all-three",
        storage=storage,
        client=client,
        fuse=FUSE,
    ) as study:
        transferred = study.run(GridSearch(configs, "val_loss", "min", steps=size["epochs"]))
        wall = time.perf_counter() - began
        chosen = config_dumps(transferred.config)
        ended = [  # when the search's trial of the configuration it chose ended
            handle.trial.finished_at
            for handle in study.surrogate_study.trials
            if handle.trial.finished_at is not None and config_dumps(handle.trial.config) == chosen
        ]
    search, target = transferred.surrogate.report, transferred.target_report
    return {
        "arm": f"dagtune: surrogate S={SCALE} + fusion + prefix sharing, then the target",
        "wall_seconds": wall,
        "trials": search["trials"],
        "search_steps": search["executed_steps"],
        "search_unique_steps": search["unique_steps"],
        "search_width": size["base"] // SCALE,
        "search_makespan_seconds": search["makespan_seconds"],
        "fused_tasks": search.get("fused_tasks", 0),
        "group_sizes": search.get("group_sizes", {}),
        "target_steps": target["executed_steps"],
        "target_makespan_seconds": target["makespan_seconds"],
        "chosen_ended_seconds": min(ended) - began_clock if ended else None,
        "restarts": transferred.restarts,
        "config": transferred.config,
        "metric": transferred.target.metrics["val_loss"],
    }


def _warm_up(client: Any, size: dict[str, Any], storage: str) -> None:
    """A first, untimed surrogate study of 2 configs x 1 epoch: imports and first fused calls
    on the workers, which a long-lived cluster has done already."""
    configs = [
        {"lr": 0.1, "momentum": MOMENTUM, "batch_size": BATCH_SIZE},
        {"lr": 0.2, "momentum": 0.5, "batch_size": BATCH_SIZE},
    ]
    with dt.SurrogateStudy(
        ScaledCNN,
        {"base": size["base"]},
        dt.Surrogate(scale=SCALE),
        name="warm-up",
        storage=storage,
        client=client,
        fuse=FUSE,
    ) as study:
        study.run(GridSearch(configs, "val_loss", "min", steps=1))


def retrain(client: Any, configs: list[dict], size: dict[str, Any]) -> dict[str, list[dict[str, float]]]:
    """Each of `configs` trained at full width with every seed (`dt.run_alone`, unfused, on
    the Dask workers): the final metrics, by the config's `config_dumps`."""
    texts = list(dict.fromkeys(config_dumps(c) for c in configs))
    chosen = {config_dumps(c): c for c in configs}
    jobs = [(text, seed) for text in texts for seed in size["seeds"]]
    curves = client.gather(
        client.map(
            dt.run_alone,
            [ScaledCNN] * len(jobs),
            [chosen[text] for text, _ in jobs],
            [size["epochs"]] * len(jobs),
            [{"base": size["base"]}] * len(jobs),
            [seed for _, seed in jobs],
            pure=False,
        )
    )
    finals: dict[str, list[dict[str, float]]] = {}
    for (text, _), curve in zip(jobs, curves, strict=True):
        finals.setdefault(text, []).append(curve[-1])
    return finals


def benchmark(mode: str = "quick") -> dict[str, Any]:
    """Both arms, alternating, then the chosen configurations at full width on every seed."""
    size = sizes(mode)
    configs = raytune.distinct(search_space(size), size["epochs"])
    if len(configs) != len(search_space(size)):
        raise AssertionError(f"the benchmark's trials are not distinct at {size['epochs']} epochs")
    steps = [(c, size["epochs"]) for c in configs]
    with_ray = raytune.ray_installed()
    check = transfer_check(size["base"])
    began = time.perf_counter()
    runs: dict[str, list[dict[str, Any]]] = {"ray": [], "dagtune": []}
    with (
        cluster_client(mode, WORKERS) as client,
        tempfile.TemporaryDirectory(prefix="dagtune-all-three-") as root,
    ):
        dask_startup = time.perf_counter() - began
        client.run(__import__, __name__)
        _warm_up(client, size, f"{root}/warm-up")
        order = [arm for arm in size["order"] if with_ray or arm != "ray"]
        for index, arm in enumerate(order):
            load = os.getloadavg()[0]
            if arm == "ray":
                runs["ray"].append(run_ray_apart(mode, configs))
            else:
                runs["dagtune"].append(run_dagtune(client, configs, size, f"{root}/{index}"))
            runs[arm][-1]["load"] = (load, os.getloadavg()[0])
            print(f"[perf] all three: {arm} {runs[arm][-1]['wall_seconds']:.1f} s", flush=True)
        for arm, found in runs.items():  # training is deterministic: every run chooses alike
            for run in found[1:]:
                assert config_dumps(run["config"]) == config_dumps(found[0]["config"]), (
                    f"{arm} chose differently"
                )
        firsts = {arm: found[0] for arm, found in runs.items() if found}
        seeded = retrain(client, [first["config"] for first in firsts.values()], size)
    arms = []
    for arm, found in runs.items():
        if not found:
            continue
        first = found[0]
        finals = seeded[config_dumps(first["config"])]
        losses = [m["val_loss"] for m in finals]
        arms.append(
            {
                **{k: v for k, v in first.items() if k != "config"},
                "kind": arm,
                "walls": [run["wall_seconds"] for run in found],
                "loads": [run["load"] for run in found],
                "wall_seconds": statistics.fmean(run["wall_seconds"] for run in found),
                "config": shown(first["config"]),
                "seed_losses": losses,
                "mean": statistics.fmean(losses),
                "std": statistics.stdev(losses),
                "mean_acc": statistics.fmean(m["val_acc"] for m in finals),
            }
        )
    result: dict[str, Any] = {
        "commit": _commit(),
        "machine": describe(),
        "sizes": {**size, "trials": len(configs)},
        "trial_steps": len(configs) * size["epochs"],
        "unique_steps": dt.unique_steps(steps),
        "merge_rate": dt.merge_rate(steps),
        "transfer_check": check,
        "dask_startup_seconds": dask_startup,
        "ray": raytune.ray_label(with_ray),
        "arms": arms,
    }
    if with_ray:
        ray, ours = arms[0], arms[1]
        result["speedups"] = [r / d for r in ray["walls"] for d in ours["walls"]]
        result["speedup"] = ray["wall_seconds"] / ours["wall_seconds"]
        result["noise"] = max(ray["std"], ours["std"])
        result["difference"] = ours["mean"] - ray["mean"]
    return result


def _commit() -> str:
    """The commit of the code that ran (with ``+changes`` when the work tree differs from it)."""
    import subprocess

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()

    head = git("rev-parse", "--short", "HEAD") or "unknown"
    return head + ("+changes" if git("status", "--porcelain", "--untracked-files=no") else "")


# --------------------------------------------------------------------------- the report


def markdown(result: dict[str, Any]) -> str:
    from perf.table import table

    s = result["sizes"]
    seeds = ", ".join(map(str, s["seeds"]))
    rows = [
        {
            **arm,
            "walls": " / ".join(f"{w:.1f}" for w in arm["walls"]),
            "loads": " / ".join(f"{a:.1f}→{b:.1f}" for a, b in arm["loads"]),
            "search": f"{arm['search_steps']} at width {arm['search_width']}"
            + (f" ({arm['search_unique_steps']} unique)" if "search_unique_steps" in arm else ""),
            "fused": _fused(arm),
            "seeds": f"{arm['mean']:.4f} ± {arm['std']:.4f}",
            "seed_acc": f"{arm['mean_acc']:.4f}",
        }
        for arm in result["arms"]
    ]
    check = ", ".join(f"{k} {v:.1e}" for k, v in result["transfer_check"].items())
    parts = [
        f"The digits CNN (muP, SGD, momentum {MOMENTUM}) at full width {s['base']} (surrogate: width "
        f"{s['base'] // SCALE}); {s['trials']} trials (learning rates 2^{s['lr_exponents'][0]}..2^"
        f"{s['lr_exponents'][-1]} x {s['schedules']} schedules) of {s['epochs']} epochs: "
        f"{result['trial_steps']} trial epochs, {result['unique_steps']} unique, merge rate "
        f"{result['merge_rate']:.2f}; {WORKERS} single-threaded worker slots for each system. "
        f"`ScaledCNN` against `examples/scaled_digits.py` (largest val_loss difference over 3 epochs): {check}.",
    ]
    if "commit" in result:
        machine = result["machine"]
        parts.append(
            f"Run at commit {result['commit']} on {machine['cores']} cores of {machine['cpu']} "
            f"({machine['memory']}; torch {machine['torch']}, distributed {machine['distributed']}, "
            f"{result['ray']}), shared with other work: the load average of each run is in the table "
            "(above 2, the workers of both systems got only part of a core each)."
        )
    if "speedup" not in result:
        parts.append(f"**Ray Tune {result['ray']}.** Only dagtune's rows ran.")
    parts.append(
        table(
            rows,
            [
                ("arm", "arm"),
                ("walls", "wall s, per run"),
                ("loads", "load average, start→end of each run"),
                ("search", "search epochs"),
                ("fused", "fused tasks x K"),
                ("target_steps", "target epochs"),
                ("config", "chosen lr schedule"),
                ("metric", "its val_loss in the study"),
                ("seeds", f"chosen config at full width, seeds {seeds}: val_loss mean ± std"),
                ("seed_acc", "… val_acc mean"),
            ],
        )
    )
    if "speedup" in result:
        ours = result["arms"][1]
        good = result["difference"] <= result["noise"]
        ratio = result["speedup"]
        parts.append(
            f"**Ray Tune / dagtune wall time: {ratio:.1f}x** (the means'; each Ray Tune run over each of dagtune's: "
            + " / ".join(f"{x:.1f}x" for x in result["speedups"])
            + f"; {'meets' if ratio >= GOAL else 'misses'} the goal of {GOAL:.0f}x"
            + ("" if ratio >= GOAL else f" by {GOAL / ratio:.2f}x")
            + f"). dagtune's chosen configuration at full width minus Ray Tune's: {result['difference']:+.4f} "
            f"val_loss against a seed noise (largest std) of {result['noise']:.4f}: "
            + ("as good within seed noise." if good else "**worse than seed noise**.")
            + f" Cluster start, not in the wall times: ray.init {result['arms'][0]['startup_seconds']:.1f} s, "
            f"Dask {result['dask_startup_seconds']:.1f} s. dagtune's search took {ours['search_makespan_seconds']:.1f} s "
            f"from its first submission to its last trial's end, the target {ours['target_makespan_seconds']:.1f} s "
            f"(eager restarts: {ours['restarts']})."
        )
        parts.append(_where_the_time_goes(result))
    return "\n\n".join(parts)


def _where_the_time_goes(result: dict[str, Any]) -> str:
    """What dominates dagtune's wall time, from the figures of its first run and Ray Tune's."""
    ray, ours = result["arms"][0], result["arms"][1]
    first = ours["walls"][0]
    search, target = ours["search_makespan_seconds"], ours["target_makespan_seconds"]
    ray_epoch = WORKERS * ray["wall_seconds"] / ray["search_steps"]
    search_epoch = WORKERS * search / ours["search_steps"]
    return (
        f"Where dagtune's time goes (its first run, {first:.1f} s): the search {search:.1f} s "
        f"({100 * search / first:.0f}%), the target {target:.1f} s ({100 * target / first:.0f}%; "
        f"{ours['target_steps']} full-width epochs on one slot, {target / ours['target_steps']:.2f} s each), "
        f"overlapping by {search + target - first:.1f} s. The target alone bounds the ratio at Ray "
        f"Tune's mean wall / target = {ray['wall_seconds'] / target:.1f}x. The search's "
        f"{ours['search_steps']} surrogate epochs took {search_epoch:.2f} slot-seconds each "
        f"({WORKERS} x the search's time / its epochs: idle slots, dispatch, checkpoints, the checks and "
        "the target's slot while they overlap included) against "
        f"{ray_epoch:.2f} for Ray Tune's full-width epochs ({WORKERS} x wall / {ray['search_steps']} "
        f"epochs): {ray_epoch / search_epoch:.1f}x cheaper each, and {ray['search_steps'] / ours['search_steps']:.2f}x "
        "fewer of them (prefix sharing)." + _chosen_bound(ours, ray["wall_seconds"])
    )


def _chosen_bound(ours: dict[str, Any], ray_wall: float) -> str:
    """When the search's trial of the configuration it chose ended (the target cannot train
    that configuration before it is known, eager or not), and the bound this puts on the ratio
    (the first run's figures)."""
    ended = ours.get("chosen_ended_seconds")
    if ended is None:  # runs recorded before this figure existed
        return ""
    target = ours["target_makespan_seconds"]
    started = ours["walls"][0] - target
    return (
        f" The search's trial of the chosen configuration ended {ended:.1f} s after the start and the "
        f"target started at about {started:.1f} s (the run's wall time less the target's): a target "
        f"started once its configuration is known cannot finish before {ended + target:.1f} s, which "
        f"bounds the ratio at {ray_wall / (ended + target):.1f}x with these step times (a target started "
        "earlier on another configuration saves at most the schedule prefix it shares with the chosen one)."
    )


def _fused(arm: dict[str, Any]) -> str:
    sizes = arm.get("group_sizes")
    if not sizes:
        return "–"
    return ", ".join(f"{count}x{size}" for size, count in sorted(sizes.items(), key=lambda kv: int(kv[0])))
