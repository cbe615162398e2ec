"""Tuning a small CNN on scikit-learn's digits with dagtune.

The data set is the 1797 8x8 images of handwritten digits bundled with scikit-learn (nothing
is downloaded), so a training step (one epoch) takes a few hundredths of a second on one CPU
core and a whole study runs on a laptop. The trainer tunes SGD's ``lr``, ``momentum``,
``weight_decay`` and the ``batch_size``, any of which may change from one epoch to the next.
"""

from __future__ import annotations

import argparse
import functools
from typing import Any, ClassVar

import numpy as np
import torch
from sklearn.datasets import load_digits
from torch import nn

import dagtune as dt
from dagtune.algos import GridSearch
from dagtune.launch import StudySetup
from dagtune.summary import reuse_text

# --------------------------------------------------------------------------- the trainer

#: The hyper-parameters the digits trainers understand, with the values they start from.
DEFAULTS: dict[str, Any] = {"lr": 0.05, "momentum": 0.9, "batch_size": 64, "weight_decay": 0.0}


@functools.lru_cache(maxsize=4)
def digits_split(validation_fraction: float = 0.2, split_seed: int = 0) -> tuple[np.ndarray, ...]:
    """``(train_x, train_y, val_x, val_y)``: images scaled to [0, 1] as ``(n, 1, 8, 8)`` float32
    and int64 labels. The split is fixed by `split_seed` through its own generator (the global
    RNGs are not touched), so every trainer of every trial validates on the same images."""
    digits = load_digits()
    images = (digits.images / 16.0).astype(np.float32)[:, None, :, :]
    labels = digits.target.astype(np.int64)
    order = np.random.default_rng(split_seed).permutation(len(labels))
    n_val = round(len(labels) * validation_fraction)
    val, train = order[:n_val], order[n_val:]
    arrays = (images[train], labels[train], images[val], labels[val])
    for array in arrays:
        array.flags.writeable = False  # shared by every trainer of the process
    return arrays


def make_model(hidden: int = 16, dropout: float = 0.1) -> nn.Sequential:
    """Two 3x3 convolutions with max pooling (8x8 -> 4x4 -> 2x2) and a linear classifier."""
    return nn.Sequential(
        nn.Conv2d(1, hidden, kernel_size=3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(hidden, 2 * hidden, kernel_size=3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Dropout(dropout),  # draws from torch's global RNG: restored with every checkpoint
        nn.Linear(2 * hidden * 2 * 2, 10),
    )


class DigitsTrainer(dt.FusibleTrainer):
    """A small CNN trained with SGD on the digits; one step is one epoch.

    Written as a `dagtune.FusibleTrainer`: the parts are declared (model, optimizer, data
    order, batch, loss, evaluation) and dagtune writes ``setup``, ``train``, ``evaluate`` and
    the state, so the same trainer also trains fused (its ``lr``, ``momentum`` and
    ``weight_decay`` may differ inside a fused group). `examples/digits_trainer.py` is the same
    trainer written by hand against `dagtune.Trainer`.

    `hidden` is the width of the first convolution, `seed` fixes the order of the training
    data (the weights come from torch's global RNG, which dagtune seeds before building the
    trainer), `validation_fraction` and `split_seed` fix the validation images.
    """

    fusible: ClassVar[dict[str, str]] = {"lr": "lr", "momentum": "momentum", "weight_decay": "weight_decay"}
    batch_size_name = "batch_size"

    def __init__(
        self,
        hidden: int = 16,
        dropout: float = 0.1,
        seed: int = 0,
        validation_fraction: float = 0.2,
        split_seed: int = 0,
    ):
        # Bit-exact sharing needs a resumed run to compute exactly what an uninterrupted run
        # computes, possibly in another process. With several threads, CPU kernels may split
        # reductions differently and round differently; one thread makes every step a fixed
        # sequence of floating-point operations. Dask workers run with OMP_NUM_THREADS=1, and
        # this makes an in-process run (dt.run_alone, tests) do the same.
        torch.set_num_threads(1)
        train_x, train_y, val_x, val_y = digits_split(validation_fraction, split_seed)
        self.train_x, self.train_y = torch.from_numpy(train_x.copy()), torch.from_numpy(train_y.copy())
        self.val_x, self.val_y = torch.from_numpy(val_x.copy()), torch.from_numpy(val_y.copy())
        super().__init__(
            model=make_model(hidden, dropout),
            optimizer=dt.SGD(
                lr=DEFAULTS["lr"], momentum=DEFAULTS["momentum"], weight_decay=DEFAULTS["weight_decay"]
            ),
            batches=dt.ResumableBatches(len(self.train_y), DEFAULTS["batch_size"], seed=seed),
        )

    def batch(self, indices: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        index = torch.from_numpy(indices)
        return self.train_x[index], self.train_y[index]

    def loss(self, model, batch) -> torch.Tensor:
        """Per-image cross-entropy (dagtune takes the mean)."""
        images, labels = batch
        return nn.functional.cross_entropy(model(images), labels, reduction="none")

    def evaluate_model(self, model: nn.Module) -> dict[str, float]:
        """Accuracy and mean loss on the validation images."""
        logits = model(self.val_x)
        loss = nn.functional.cross_entropy(logits, self.val_y).item()
        accuracy = (logits.argmax(dim=1) == self.val_y).double().mean().item()
        return {"val_acc": accuracy, "val_loss": loss}


# --------------------------------------------------------------------------- the study


def search_space() -> dt.Grid:
    """Learning-rate schedules x batch-size ramps x momentum ramps, like Hippo's Table 2 for
    ResNet56 scaled to 30 epochs: 36 trials whose schedules share long prefixes (merge rate
    2.2: a trial-based system trains 1080 epochs, dagtune 486)."""
    return dt.Grid(
        {
            "lr": [
                dt.Constant(0.05),
                dt.MultiStep(0.05, [15, 22], 0.1),
                dt.MultiStep(0.05, [20, 26], 0.1),
                dt.Warmup(3, dt.MultiStep(0.05, [12, 19], 0.1)),
                dt.Warmup(3, dt.Exponential(0.05, 0.9)),
                dt.Warmup(3, dt.Cosine(0.05, 9)),
            ],
            "batch_size": [64, dt.Steps([64, 128], [18]), dt.Steps([64, 256], [24])],
            "momentum": [0.9, dt.Steps([0.7, 0.8, 0.9], [6, 12])],
            "weight_decay": [5e-4],
        }
    )


def study_setup(epochs: int = 30) -> StudySetup:
    """What ``dagtune run examples/digits.py`` runs: this grid on the digits CNN."""
    algorithm = GridSearch(search_space(), metric="val_acc", mode="max", steps=epochs)
    return StudySetup(trainer=DigitsTrainer, algorithm=algorithm, name="digits")


def main(argv: list[str] | None = None) -> dt.Result:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=30, help="epochs per trial (default 30)")
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
    space = search_space()
    with dt.Study(
        DigitsTrainer, name="digits", storage=args.storage, client=client, workers=args.workers
    ) as study:
        result = study.run(GridSearch(space, metric="val_acc", mode="max", steps=args.epochs))
    best, report = result.best, result.report
    print(
        f"best of {report['trials']} trials: val_acc {best.metrics['val_acc']:.4f} after {best.steps} epochs"
    )
    for name, sequence in best.config.items():
        print(f"  {name:13s} {sequence!r}")
    print(
        f"trained {report['executed_steps']} epochs for {report['trial_steps']} trial epochs "
        f"(unique {report['unique_steps']}, merge rate {report['merge_rate']:.2f}, "
        f"reuse {reuse_text(report)}) in {report['makespan_seconds']:.1f} s"
    )
    return result


if __name__ == "__main__":
    main()
