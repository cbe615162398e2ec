"""Tuning an existing PyTorch Lightning module with dagtune, unchanged.

`DigitsClassifier` and `DigitsDataModule` are an ordinary ``LightningModule`` and
``LightningDataModule`` (scikit-learn's digits: nothing is downloaded), written as for
Lightning's own ``Trainer``. `DigitsTuning` is all dagtune needs: a `dagtune.LightningTrainer`
naming them. dagtune then drives ``configure_optimizers``, ``training_step``,
``validation_step`` and the data module itself (a step is one epoch), applies the tuned
``lr``, ``momentum`` and ``batch_size`` (optimizer param groups, the data order), and every
trial's metrics are exactly ``dt.run_alone``'s.

    python examples/lightning_digits.py          # the grid below, on a local Dask cluster
    dagtune run examples/lightning_digits.py     # the same through the command line

Needs ``pip install 'dagtune[lightning]'``.
"""

from __future__ import annotations

import argparse

import pytorch_lightning as pl
import torch
from sklearn.datasets import load_digits
from torch import nn
from torch.nn import functional
from torch.utils.data import DataLoader, TensorDataset

import dagtune as dt
from dagtune.algos import GridSearch
from dagtune.launch import StudySetup

# --------------------------------------------------------------------------- plain Lightning


class DigitsClassifier(pl.LightningModule):
    """An MLP with batch norm and dropout for the 8x8 digits."""

    def __init__(self, hidden: int = 32, dropout: float = 0.1, lr: float = 0.05, momentum: float = 0.9):
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(
            nn.Flatten(),
            nn.Linear(64, hidden),
            nn.BatchNorm1d(hidden),
            nn.ReLU(),
            nn.Dropout(dropout),
            nn.Linear(hidden, 10),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = functional.cross_entropy(self(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        self.log("val_loss", functional.cross_entropy(logits, y))
        self.log("val_acc", (logits.argmax(dim=1) == y).float().mean())

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=self.hparams.momentum)


class DigitsDataModule(pl.LightningDataModule):
    """scikit-learn's digits, a fixed 80/20 split."""

    def __init__(self, batch_size: int = 64, split_seed: int = 0):
        super().__init__()
        self.batch_size, self.split_seed = batch_size, split_seed

    def setup(self, stage: str | None = None) -> None:
        digits = load_digits()
        x = torch.tensor(digits.images / 16.0, dtype=torch.float32)
        y = torch.tensor(digits.target, dtype=torch.int64)
        order = torch.randperm(len(y), generator=torch.Generator().manual_seed(self.split_seed))
        cut = len(y) // 5
        self.val, self.train = (
            TensorDataset(x[order[:cut]], y[order[:cut]]),
            TensorDataset(x[order[cut:]], y[order[cut:]]),
        )

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train, batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val, batch_size=512)


# --------------------------------------------------------------------------- dagtune


class DigitsTuning(dt.LightningTrainer):
    """The module and data above, tuned by dagtune (one step = one epoch)."""

    module_class = DigitsClassifier
    datamodule_class = DigitsDataModule

    def __init__(self, **kwargs):
        # one thread: a CPU kernel then always sums in the same order, so a trial resumed in
        # another process (or trained alone, in this one) computes bit for bit the same
        torch.set_num_threads(1)
        super().__init__(**kwargs)


def search_space() -> dt.Grid:
    """12 schedules that share their first epochs: constant and step-decayed learning rates,
    two momenta, a constant batch size and one that doubles at epoch 4."""
    return dt.Grid(
        {
            "lr": [0.05, dt.MultiStep(0.05, [4], 0.2), dt.Warmup(2, dt.Constant(0.1), start=0.02)],
            "momentum": [0.9, 0.5],
            "batch_size": [64, dt.Steps([64, 128], [4])],
        }
    )


def study_setup(epochs: int = 8) -> StudySetup:
    """What ``dagtune run examples/lightning_digits.py`` runs."""
    algorithm = GridSearch(search_space(), metric="val_acc", mode="max", steps=epochs)
    return StudySetup(
        trainer=DigitsTuning,
        algorithm=algorithm,
        trainer_kwargs={"module_kwargs": {"hidden": 32}},
        name="lightning-digits",
    )


def main(argv: list[str] | None = None) -> dt.Result:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--storage", default="./dagtune-runs")
    parser.add_argument("--workers", type=int, default=None)
    args = parser.parse_args(argv)
    setup = study_setup(args.epochs)
    with dt.Study(
        setup.trainer, setup.trainer_kwargs, name=setup.name, storage=args.storage, workers=args.workers
    ) as study:
        result = study.run(setup.algorithm)
    best = result.best
    print(f"best val_acc {best.metrics['val_acc']:.4f} after {best.steps} epochs:")
    for name, sequence in best.config.items():
        print(f"  {name:10s} {sequence!r}")
    report = result.report
    print(f"trained {report['executed_steps']} epochs for {report['trial_steps']} trial epochs")
    return result


if __name__ == "__main__":
    main()
