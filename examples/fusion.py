"""Trial fusion: many trials of a small model trained as fused tasks on the stage tree.

A 64-32-10 MLP on scikit-learn's digits (flattened 8x8 images; nothing is downloaded) is
tuned over learning-rate schedules, momenta and weight decays: all fusible, so trials whose
stages start at the same step train side by side in one fused task (one stacked model, each
batch read once), while the stage tree still trains every shared prefix once. Each trial's
metrics are exactly ``dt.run_alone(..., fused=True)``'s; against unfused training they agree
within rounding (``--compare`` prints the largest difference; docs/fusion.md has it per model).

A study this small is mostly fixed costs (starting tasks, saving checkpoints, evaluating), so
its two timings are close; `python -m perf --only fusion` measures what fusion gains
(perf/RESULTS.md §7).

    python examples/fusion.py                 # the fused study
    python examples/fusion.py --compare       # and the same study unfused, side by side
    dagtune run examples/fusion.py --fuse 8   # the same from the command line
"""

from __future__ import annotations

import argparse
import os
import time
from typing import ClassVar

import numpy as np
import torch
from digits import digits_split
from torch import nn

import dagtune as dt
from dagtune.algos import GridSearch
from dagtune.launch import StudySetup


class DigitsMLP(dt.FusibleTrainer):
    """A 64-`hidden`-10 MLP trained with SGD on the flattened digits; one step is one epoch.

    ``lr``, ``momentum`` and ``weight_decay`` are fusible (they may differ inside a fused
    task); ``batch_size`` is not (trials with different batch sizes never share one)."""

    fusible: ClassVar[dict[str, str]] = {"lr": "lr", "momentum": "momentum", "weight_decay": "weight_decay"}
    batch_size_name = "batch_size"

    def __init__(self, hidden: int = 32, seed: int = 0):
        torch.set_num_threads(1)  # one thread: every step a fixed sequence of operations
        train_x, train_y, val_x, val_y = digits_split()
        self.train_x = torch.from_numpy(train_x.reshape(len(train_x), -1).copy())
        self.train_y = torch.from_numpy(train_y.copy())
        self.val_x = torch.from_numpy(val_x.reshape(len(val_x), -1).copy())
        self.val_y = torch.from_numpy(val_y.copy())
        model = nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, 10))
        super().__init__(
            model=model,
            optimizer=dt.SGD(lr=0.05, momentum=0.9),
            batches=dt.ResumableBatches(len(self.train_y), 64, seed=seed),
        )

    def batch(self, indices: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        index = torch.from_numpy(indices)
        return self.train_x[index], self.train_y[index]

    def loss(self, model, batch) -> torch.Tensor:
        x, y = batch
        return nn.functional.cross_entropy(model(x), y, reduction="none")

    def evaluate_model(self, model: nn.Module) -> dict[str, float]:
        logits = model(self.val_x)
        return {
            "val_acc": (logits.argmax(dim=1) == self.val_y).double().mean().item(),
            "val_loss": nn.functional.cross_entropy(logits, self.val_y).item(),
        }


def search_space() -> dt.Grid:
    """4 learning-rate schedules x 3 momenta x 2 weight decays: 24 trials, all fusible."""
    return dt.Grid(
        {
            "lr": [
                dt.Constant(0.1),
                dt.MultiStep(0.1, [6], 0.1),
                dt.MultiStep(0.1, [4, 8], 0.3),
                dt.Constant(0.03),
            ],
            "momentum": [0.9, 0.5, dt.Steps([0.5, 0.9], [3])],
            "weight_decay": [0.0, 5e-4],
            "batch_size": [32],
        }
    )


def study_setup(epochs: int = 10) -> StudySetup:
    """What ``dagtune run examples/fusion.py`` runs: the grid, fused 8 trials per task."""
    algorithm = GridSearch(search_space(), metric="val_acc", mode="max", steps=epochs)
    return StudySetup(trainer=DigitsMLP, algorithm=algorithm, name="fusion", options={"fuse": 8})


def run(fuse: bool | int, epochs: int, storage: str, client, workers: int | None) -> tuple[dt.Result, float]:
    """The grid as one study (`fuse`: as `dt.Study` takes it); its result and the seconds
    `Study.run` took (the cluster's start not counted)."""
    with dt.Study(
        DigitsMLP, name="fusion", storage=storage, client=client, workers=workers, fuse=fuse
    ) as study:
        began = time.perf_counter()
        result = study.run(GridSearch(search_space(), metric="val_acc", mode="max", steps=epochs))
        return result, time.perf_counter() - began


def describe(label: str, result: dt.Result, seconds: float) -> None:
    best, report = result.best, result.report
    print(
        f"{label}: best val_acc {best.metrics['val_acc']:.4f} of {report['trials']} trials; trained "
        f"{report['executed_steps']} epochs for {report['trial_steps']} trial epochs (unique "
        f"{report['unique_steps']}) in {seconds:.1f} s, {report['trial_steps'] / seconds:.0f} trial-epochs/s"
    )


def main(argv: list[str] | None = None) -> dict[str, dt.Result]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=10, help="epochs per trial (default 10)")
    parser.add_argument("--fuse", type=int, default=8, help="most trials per fused task (default 8)")
    parser.add_argument("--compare", action="store_true", help="also run the same study unfused")
    parser.add_argument("--storage", default="./dagtune-runs", help="checkpoint storage URL or directory")
    parser.add_argument(
        "--scheduler", help="address of a running `dask scheduler` (default: a local cluster)"
    )
    parser.add_argument("--workers", type=int, help="workers of the local cluster (default: one per core)")
    args = parser.parse_args(argv)

    client = None
    if args.scheduler:
        from distributed import Client

        client = Client(args.scheduler)
    results = {}
    # apart: the second study would otherwise find every result of the first in storage
    kinds = {"fused": args.fuse, **({"unfused": False} if args.compare else {})}
    for label, fuse in kinds.items():
        result, seconds = run(fuse, args.epochs, os.path.join(args.storage, label), client, args.workers)
        describe(label, result, seconds)
        results[label] = result
    if args.compare:
        fused, unfused = (results[kind].trials for kind in ("fused", "unfused"))
        metrics = [name for name in ("val_acc", "val_loss") if name in fused]
        difference = (fused[metrics] - unfused.loc[fused.index, metrics]).abs().max().max()
        print(f"largest difference of a final metric, fused against unfused: {difference:.1e}")
    best = results["fused"].best
    for name, sequence in best.config.items():
        print(f"  {name:13s} {sequence!r}")
    alone = dt.run_alone(DigitsMLP, best.config, best.steps, fused=True)[-1]
    print(
        f"the best trial alone, fused: val_acc {alone['val_acc']:.4f} (the study's: {best.metrics['val_acc']:.4f})"
    )
    if client is not None:
        client.close()
    return results


if __name__ == "__main__":
    main()
