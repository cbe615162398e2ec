"""Trial fusion: K trials trained as one fused model against the same K trials one after another.

For K = 1, 2, 4, 8, 16, 32 trials of one model that differ in learning rate and momentum,
the same steps are trained (a) unfused, one trial after another in this process, each a
`FusibleTrainer` trained the ordinary way (torch.optim SGD), and (b) as one `FusedGroup` of K
members (vmap over the stacked weights, one backward, the fused SGD). Throughput is trial
steps per second (a step is an epoch); the ratio fused / unfused is the speed-up. Models: a
tiny MLP (30-64-2, batches of 32), a small CNN (the fusion tests' CNN: 3x3 convolutions of
1 -> 4 -> 8 channels with max pooling on 8x8 images, batches of 32), the digits CNN of
`examples/digits.py` (1 -> 16 -> 32 channels, batches of 64) and a medium MLP (784-1024-10,
batches of 128), all on synthetic or bundled data, one thread
(``torch.set_num_threads(1)``, as dagtune's workers run). Training time only: building the
trainers is not timed. Each measurement is the best of its repeats (3 for the tiny MLP in
quick mode, 1 for the others), unfused and fused interleaved; the CPU-time ratio (this
process's CPU time, one training thread) shows what the training cost where other work shares
the machine.

Memory: the peak of one fused batch at each K (the profiler's CPU allocation events on a CPU,
the CUDA allocator's counters on a GPU), the peak the linear model fitted at K = 1 and 2
predicts (Hydro's profile), and the fusion count F chosen from it: for the device's free
memory on CUDA, for a 1 GiB budget on a CPU. Fidelity: two members trained fused against the
same trials fused alone (K = 1, bitwise) and unfused (largest absolute difference of any
weight after the stated number of steps). On CUDA the same code runs unchanged on the GPU.

The CNNs run twice: with ``fused_kernels="exact"`` (the default: convolutions one member at
a time, every member bit for bit what it computes alone) and ``"grouped"`` (one grouped
convolution for all members, as HFTA and Hydro fuse; a member's result then depends on K
within rounding: the fidelity table gives the largest weight difference between a member of
a group of 2 and the same trial alone). Both pool in the channels-last layout (bitwise the
NCHW result, 8x faster on this CPU).

Study level (`perf/fusion_study.py`): a grid of 32 schedules of the tiny MLP (4096 samples,
128 batches a step) and the digits grid of `examples/digits.py` (36 trials, 30 epochs),
each as a fused study (``Study(fuse=16)``) against the same study unfused, on
one LocalCluster of 2 single-threaded workers, and against the same trials under Ray Tune
on 2 CPUs (as in the Ray Tune section), alternating, after an untimed warm-up of each dagtune
kind; wall time, trial-steps per second, executed and unique steps, the fused tasks, and where
the worker-seconds went.
"""

from __future__ import annotations

import itertools
import os
import sys
import time
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))

import dagtune as dt  # noqa: E402
from dagtune.fusion import CpuMemory, CudaMemory, FusedGroup, profile_fusion, same_state  # noqa: E402
from dagtune.trainer import build_trainer  # noqa: E402
from perf import fusion_study  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
CPU_BUDGET = 2**30  # the memory budget F is chosen for on a CPU
# smoke: a group of one and of two, enough to run every fused code path (larger K is the same code)
SIZES = {"smoke": (1, 2), "quick": (1, 2, 4, 8, 16, 32), "full": (1, 2, 4, 8, 16, 32)}
GOAL = 4.0  # fused / unfused throughput at K = 32 on the tiny MLP
CNN_GOALS = {8: 2.0, 32: 3.0}  # the small CNN's, grouped kernels
STUDY_MODEL = {"dims": (30, 64, 2), "samples": 4096}  # the study comparison's: 128 batches a step


class SyntheticTask(dt.FusibleTrainer):
    """`samples` synthetic inputs of `features` values labelled by a random linear teacher
    with `classes` classes, inputs shaped `shape`, trained by `model`; one step is one epoch."""

    fusible: ClassVar[dict[str, str]] = {"lr": "lr", "momentum": "momentum", "weight_decay": "weight_decay"}
    batch_size_name = "batch_size"

    def __init__(
        self,
        model: nn.Module,
        features: int,
        classes: int,
        shape: tuple[int, ...],
        samples: int,
        seed: int,
        device: str,
    ):
        torch.set_num_threads(1)
        rng = np.random.default_rng(12345)
        x = rng.standard_normal((samples + 256, features)).astype(np.float32)
        y = (x @ rng.standard_normal((features, classes))).argmax(1)
        inputs, labels = torch.from_numpy(x).view(-1, *shape).to(device), torch.from_numpy(y).to(device)
        self.x, self.y = inputs[:samples], labels[:samples]
        self.val_x, self.val_y = inputs[samples:], labels[samples:]
        super().__init__(
            model=model.to(device),
            optimizer=dt.SGD(lr=0.05, momentum=0.9),
            batches=dt.ResumableBatches(samples, 32, seed=seed),
        )

    def batch(self, indices: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        index = torch.from_numpy(indices).to(self.x.device)
        return self.x[index], self.y[index]

    def loss(self, model, batch) -> torch.Tensor:
        x, y = batch
        return nn.functional.cross_entropy(model(x), y, reduction="none")

    def evaluate_model(self, model: nn.Module) -> dict[str, float]:
        return {"val_loss": nn.functional.cross_entropy(model(self.val_x), self.val_y).item()}


class SyntheticMlp(SyntheticTask):
    """An MLP of layer widths `dims` on `samples` synthetic samples."""

    def __init__(
        self, dims: tuple[int, ...] = (30, 64, 2), samples: int = 1024, seed: int = 0, device: str = "cpu"
    ):
        layers: list[nn.Module] = []
        for i, (width_in, width_out) in enumerate(itertools.pairwise(dims)):
            layers += [nn.Linear(width_in, width_out)] + ([nn.ReLU()] if i < len(dims) - 2 else [])
        super().__init__(nn.Sequential(*layers), dims[0], dims[-1], (dims[0],), samples, seed, device)


class SmallCnn(SyntheticTask):
    """The fusion tests' CNN: 3x3 convolutions of 1 -> 4 -> 8 channels, each with ReLU and
    2x2 max pooling, and a linear layer, on `samples` synthetic 8x8 images (10 classes)."""

    def __init__(self, samples: int = 1024, seed: int = 0, device: str = "cpu"):
        model = nn.Sequential(
            nn.Conv2d(1, 4, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(4, 8, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(8 * 2 * 2, 10),
        )
        super().__init__(model, 64, 10, (1, 8, 8), samples, seed, device)


class SmallCnnGrouped(SmallCnn):
    """`SmallCnn` fused with grouped convolutions."""

    fused_kernels = "grouped"


def _digits_trainer(kernels: str = "exact") -> type[dt.FusibleTrainer]:
    from digits import DigitsTrainer

    class DigitsOnDevice(DigitsTrainer):
        """`examples/digits.py`'s trainer with its model and images on `device`."""

        fused_kernels = kernels

        def __init__(self, seed: int = 0, device: str = "cpu"):
            super().__init__(seed=seed)
            self.model.to(device)  # in place: the optimizer keeps its parameters
            self.train_x, self.train_y = self.train_x.to(device), self.train_y.to(device)
            self.val_x, self.val_y = self.val_x.to(device), self.val_y.to(device)

        def batch(self, indices: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
            index = torch.from_numpy(indices).to(self.train_x.device)
            return self.train_x[index], self.train_y[index]

    return DigitsOnDevice


def models(mode: str) -> list[dict[str, Any]]:
    """name, trainer, its arguments, the batch size, steps timed and steps for fidelity."""
    timed = {"smoke": 1, "quick": 2, "full": 5}[mode]
    return [
        {
            "model": "tiny MLP 30-64-2",
            "trainer": SyntheticMlp,
            "kwargs": {"dims": (30, 64, 2), "samples": 1024},
            "batch_size": 32,
            "steps": timed + (1 if mode != "smoke" else 0),
            "fidelity_steps": 20 if mode != "smoke" else 2,
        },
        *(
            {
                "model": f"small CNN 1-4-8 ({kernels})",
                "trainer": trainer,
                "kwargs": {"samples": 1024 if mode != "smoke" else 256},
                "batch_size": 32,
                "steps": timed + (1 if mode != "smoke" else 0),
                "fidelity_steps": 5 if mode != "smoke" else 1,
            }
            for kernels, trainer in (("exact", SmallCnn), ("grouped", SmallCnnGrouped))
        ),
        *(
            {
                "model": f"digits CNN ({kernels})",
                "trainer": _digits_trainer(kernels),
                "kwargs": {},
                "batch_size": 64,
                "steps": max(1, timed // 2),
                "fidelity_steps": 5 if mode != "smoke" else 1,
            }
            for kernels in ("exact", "grouped")
        ),
        {
            "model": "medium MLP 784-1024-10",
            "trainer": SyntheticMlp,
            "kwargs": {"dims": (784, 1024, 10), "samples": 1024 if mode != "smoke" else 256},
            "batch_size": 128,
            "steps": max(1, timed // 2),
            "fidelity_steps": 5 if mode != "smoke" else 1,
        },
    ]


def _values(members: int, batch_size: int) -> list[dict[str, Any]]:
    """K distinct trials: learning rates spread over [0.01, 0.1], momentum 0.9 or 0.5."""
    return [
        {
            "lr": 0.01 + 0.09 * k / max(members - 1, 1),
            "momentum": 0.9 if k % 2 == 0 else 0.5,
            "batch_size": batch_size,
        }
        for k in range(members)
    ]


def _sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


class Clock:
    """Wall time and this process's CPU time of the timed sections (one training thread: on
    a machine shared with other work, CPU time is what the training itself cost)."""

    def __init__(self) -> None:
        self.wall = self.cpu = 0.0

    def __enter__(self) -> Clock:
        _sync()
        self._began = (time.perf_counter(), time.process_time())
        return self

    def __exit__(self, *exc: object) -> None:
        _sync()
        self.wall += time.perf_counter() - self._began[0]
        self.cpu += time.process_time() - self._began[1]


def unfused_time(spec: dict, values: list[dict], steps: int) -> Clock:
    """Training time of the trials one after another, each an ordinary (unfused) trainer."""
    clock = Clock()
    for hp in values:
        trainer = build_trainer(spec["trainer"], {**spec["kwargs"], "device": DEVICE}, 0)
        trainer.setup(hp)
        with clock:
            for _ in range(steps):
                trainer.train()
    return clock


def _group(spec: dict, values: list[dict]) -> FusedGroup:
    host = build_trainer(spec["trainer"], {**spec["kwargs"], "device": DEVICE}, 0)
    group = FusedGroup.from_states(host, [host.state_dict()] * len(values))
    group.setup(values)
    return group


def fused_time(spec: dict, values: list[dict], steps: int) -> Clock:
    """Training time of the trials as one fused group."""
    group = _group(spec, values)
    with Clock() as clock:
        for _ in range(steps):
            group.train()
    return clock


def throughput(spec: dict, sizes: tuple[int, ...], repeats: int) -> list[dict[str, Any]]:
    unfused_time(spec, _values(1, spec["batch_size"]), 1)  # warm up: one-time costs
    fused_time(spec, _values(2, spec["batch_size"]), 1)
    rows = []
    for members in sizes:
        values = _values(members, spec["batch_size"])
        steps = spec["steps"]
        unfused, fused = [], []
        for _ in range(repeats):  # interleaved, so a burst of other load hits both
            unfused.append(unfused_time(spec, values, steps))
            fused.append(fused_time(spec, values, steps))
        trial_steps = members * steps
        wall_u, wall_f = min(c.wall for c in unfused), min(c.wall for c in fused)
        cpu_u, cpu_f = min(c.cpu for c in unfused), min(c.cpu for c in fused)
        rows.append(
            {
                "model": spec["model"],
                "members": members,
                "trial_steps": trial_steps,
                "unfused_per_second": trial_steps / wall_u,
                "fused_per_second": trial_steps / wall_f,
                "speedup": wall_u / wall_f,
                "cpu_speedup": cpu_u / cpu_f,
            }
        )
        print(
            f"[perf] fusion {spec['model']} K={members}: {wall_u / wall_f:.2f}x ({cpu_u / cpu_f:.2f}x CPU)",
            flush=True,
        )
    return rows


def memory(spec: dict, sizes: tuple[int, ...]) -> dict[str, Any]:
    probe = CudaMemory() if DEVICE == "cuda" else CpuMemory(CPU_BUDGET)
    hp = _values(1, spec["batch_size"])[0]
    kwargs = {**spec["kwargs"], "device": DEVICE}
    profile = profile_fusion(spec["trainer"], kwargs, 0, hp, probe)
    host = build_trainer(spec["trainer"], kwargs, 0)
    state = host.state_dict()
    rows = []
    for members in sizes:

        def one_batch(members=members) -> None:
            group = FusedGroup.from_states(host, [state] * members)
            group.setup([hp] * members)
            group.train_batch(host.batches.next_batch())

        measured = probe.peak(one_batch)
        rows.append(
            {
                "model": spec["model"],
                "members": members,
                "peak_mb": measured / 1e6,
                "predicted_mb": profile.predict(members) / 1e6,
                "error": profile.predict(members) / measured - 1,
            }
        )
    available = probe.available()
    return {"rows": rows, "available_mb": available / 1e6, "fusion_count": profile.count(available)}


def fidelity(spec: dict) -> dict[str, Any]:
    """Two members fused against each alone (fused, K = 1) and unfused, after some steps."""
    values = _values(2, spec["batch_size"])
    steps = spec["fidelity_steps"]
    group = _group(spec, values)
    for _ in range(steps):
        group.train()
    alone_equal, weight_difference, group_difference = True, 0.0, 0.0
    for member, hp in enumerate(values):
        fused_state = group.state_dict(member)
        alone = _group(spec, [hp])
        for _ in range(steps):
            alone.train()
        alone_equal &= same_state(fused_state, alone.state_dict(0))
        for key, weight in alone.state_dict(0)["model"].items():
            difference = (fused_state["model"][key].double() - weight.double()).abs().max().item()
            group_difference = max(group_difference, difference)
        trainer = build_trainer(spec["trainer"], {**spec["kwargs"], "device": DEVICE}, 0)
        trainer.setup(hp)
        for _ in range(steps):
            trainer.train()
        for key, weight in trainer.state_dict()["model"].items():
            difference = (fused_state["model"][key].double() - weight.double()).abs().max().item()
            weight_difference = max(weight_difference, difference)
    return {
        "model": spec["model"],
        "steps": steps,
        "alone_equal": alone_equal,
        "max_group_difference": group_difference,
        "max_weight_difference": weight_difference,
    }


def benchmark(mode: str = "quick") -> dict[str, Any]:
    sizes = SIZES[mode]
    repeats = {"smoke": 1, "quick": 3, "full": 5}[mode]
    result: dict[str, Any] = {
        "load": {"start": os.getloadavg()[0]},
        "device": DEVICE,
        "sizes": list(sizes),
        "throughput": [],
        "memory": [],
        "fidelity": [],
    }
    for spec in models(mode):
        small = spec["model"].startswith(("tiny", "small"))
        result["throughput"] += throughput(spec, sizes, repeats if small else 1)
        result["memory"].append({"model": spec["model"], **memory(spec, sizes)})
        result["fidelity"].append(fidelity(spec))
    tiny = [r for r in result["throughput"] if r["model"].startswith("tiny") and r["members"] == max(sizes)]
    result["tiny_speedup_at_max"] = tiny[0]["speedup"]
    result["small_cnn_speedups"] = {
        r["members"]: r["speedup"] for r in result["throughput"] if r["model"] == "small CNN 1-4-8 (grouped)"
    }
    result["studies"] = fusion_study.compare(SyntheticMlp, STUDY_MODEL, mode)
    result["load"]["end"] = os.getloadavg()[0]
    return result


def markdown(result: dict[str, Any]) -> str:
    from perf.table import table

    largest = max(result["sizes"])
    speedup = result["tiny_speedup_at_max"]
    goal = "meets" if largest == 32 and speedup >= GOAL else "misses" if largest == 32 else "does not measure"
    load = result.get("load")
    shared = (
        f" The machine was shared: its load average (1 minute) was {load['start']:.1f} at the start of "
        f"the run and {load['end']:.1f} at its end, on {os.cpu_count()} cores."
        if load
        else ""
    )
    parts = [
        f"On **{result['device']}**.{shared} Trial steps per second, K trials unfused one after another "
        "against the same K trials fused:",
        table(
            result["throughput"],
            [
                ("model", "model"),
                ("members", "K"),
                ("unfused_per_second", "unfused trial-steps/s"),
                ("fused_per_second", "fused trial-steps/s"),
                ("speedup", "fused / unfused"),
                ("cpu_speedup", "same, CPU time"),
            ],
        ),
        f"Tiny MLP at K = {largest}: **{speedup:.2f}x** ({goal} the goal of {GOAL:.0f}x at K = 32). "
        + _cnn_verdict(result.get("small_cnn_speedups", {})),
    ]
    budget = "free device memory" if result["device"] == "cuda" else f"a {CPU_BUDGET / 2**30:.0f} GiB budget"
    memory_rows = [row for entry in result["memory"] for row in entry["rows"]]
    parts += [
        "Peak memory of one fused batch (building the group included), measured and as predicted by the "
        "line through K = 1 and K = 2:",
        table(
            [{**row, "error": f"{100 * row['error']:+.1f}%"} for row in memory_rows],
            [
                ("model", "model"),
                ("members", "K"),
                ("peak_mb", "peak MB"),
                ("predicted_mb", "predicted MB"),
                ("error", "prediction error"),
            ],
        ),
        "Fusion count chosen for "
        + budget
        + ": "
        + ", ".join(
            f"{e['model']} F = {e['fusion_count']:,} ({e['available_mb']:,.0f} MB)" for e in result["memory"]
        )
        + ".",
        "Fidelity, two trials fused:",
        table(
            [
                {
                    **row,
                    "difference": f"{row['max_weight_difference']:.1e}",
                    "group_difference": f"{row.get('max_group_difference', 0.0):.1e}",
                }
                for row in result["fidelity"]
            ],
            [
                ("model", "model"),
                ("steps", "steps"),
                ("alone_equal", "each bitwise equal to itself fused alone (K = 1)"),
                ("group_difference", "max abs weight difference to itself alone"),
                ("difference", "max abs weight difference to unfused"),
            ],
        ),
    ]
    if "studies" in result:  # runs recorded before the study comparison existed have none
        parts.append(fusion_study.markdown(result["studies"]))
    return "\n\n".join(parts)


def _cnn_verdict(speedups: dict) -> str:
    """The small CNN's (grouped kernels) speed-ups against the goals, where measured."""
    speedups = {int(k): v for k, v in speedups.items()}
    parts = [
        f"K = {k}: **{speedups[k]:.2f}x** ({'meets' if speedups[k] >= goal else 'misses'} the goal of {goal:.0f}x)"
        for k, goal in CNN_GOALS.items()
        if k in speedups
    ]
    return ("Small CNN, grouped kernels, " + "; ".join(parts) + ".") if parts else ""


if __name__ == "__main__":
    import json

    if sys.argv[1:2] == ["study"]:  # python -m perf.fusion study --case digits: one grid's study alone
        fusion_study.main(sys.argv[2:], SyntheticMlp, STUDY_MODEL)
    else:
        print(json.dumps(benchmark(sys.argv[1] if len(sys.argv) > 1 else "quick"), indent=1, default=str))
