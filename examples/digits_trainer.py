"""The digits trainer written by hand: the `dagtune.Trainer` contract without `FusibleTrainer`.

`examples/digits.py` declares its trainer as a `dagtune.FusibleTrainer` (dagtune writes setup,
train, evaluate and the state). This is the same trainer with every method written out, for
models and training loops a `FusibleTrainer` does not cover: anything goes as long as
``state_dict`` holds everything a step depends on and evaluation leaves training alone.
Use it in place of the other: ``dagtune run examples/digits_trainer.py``.
"""

from __future__ import annotations

from typing import Any

import torch
from digits import DEFAULTS, digits_split, make_model, search_space
from torch import nn

from dagtune.algos import GridSearch
from dagtune.launch import StudySetup
from dagtune.trainer import ResumableBatches, Trainer


class HandWrittenDigitsTrainer(Trainer):
    """`digits.DigitsTrainer` written by hand against `dagtune.Trainer`: the same data, model,
    optimizer and step, every method of the contract spelled out.

    `hidden` is the width of the first convolution, `seed` fixes the order of the training
    data (the weights come from torch's global RNG, which dagtune seeds before building the
    trainer), `validation_fraction` and `split_seed` fix the validation images.
    """

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
        self.model = make_model(hidden, dropout)
        self.optimizer = torch.optim.SGD(
            self.model.parameters(),
            lr=DEFAULTS["lr"],
            momentum=DEFAULTS["momentum"],
            weight_decay=DEFAULTS["weight_decay"],
        )
        self.batches = ResumableBatches(len(self.train_y), DEFAULTS["batch_size"], seed=seed)

    def setup(self, hp: dict[str, Any]) -> None:
        """Apply the values given (all of them when a stage starts, the changed ones later)."""
        unknown = sorted(set(hp) - set(DEFAULTS))
        if unknown:
            raise ValueError(
                f"HandWrittenDigitsTrainer has no hyper-parameter {unknown}; it knows {sorted(DEFAULTS)}"
            )
        for name in ("lr", "momentum", "weight_decay"):
            if name in hp:
                for group in self.optimizer.param_groups:
                    group[name] = float(hp[name])
        if "batch_size" in hp:
            self.batches.set_batch_size(hp["batch_size"])  # keeps the position in the epoch

    def train(self) -> dict[str, float]:
        """One epoch of SGD; returns the mean training loss."""
        self.model.train()
        total, count = 0.0, 0
        for indices in self.batches.epoch():
            index = torch.from_numpy(indices)
            self.optimizer.zero_grad(set_to_none=True)
            loss = nn.functional.cross_entropy(self.model(self.train_x[index]), self.train_y[index])
            loss.backward()
            self.optimizer.step()
            total += loss.item() * len(indices)
            count += len(indices)
        return {"loss": total / count}

    def evaluate(self) -> dict[str, float]:
        """Accuracy and mean loss on the validation images."""
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad():
                logits = self.model(self.val_x)
                loss = nn.functional.cross_entropy(logits, self.val_y).item()
                accuracy = (logits.argmax(dim=1) == self.val_y).double().mean().item()
        finally:
            self.model.train(was_training)
        return {"val_acc": accuracy, "val_loss": loss}

    def state_dict(self) -> dict[str, Any]:
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "batches": self.batches.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.batches.load_state_dict(state["batches"])


def study_setup(epochs: int = 30) -> StudySetup:
    """What ``dagtune run examples/digits_trainer.py`` runs: the digits grid, hand-written trainer."""
    algorithm = GridSearch(search_space(), metric="val_acc", mode="max", steps=epochs)
    return StudySetup(trainer=HandWrittenDigitsTrainer, algorithm=algorithm, name="digits-hand-written")
