"""The digits CNN at a width scale, under muP or the standard parametrization.

What a surrogate study of the digits tunes (Hydro §4.1): `ScaledDigitsTrainer(scale=8)`
builds the CNN of `make_cnn` with every hidden width divided by 8 and trains it with SGD, so
that the ``lr`` and ``momentum`` (and batch size and schedule) best for it are, under muP,
the best for the full model (``scale=1``) too. The scale is a trainer argument, so each
scale is its own model identity for dagtune: its own stage tree and checkpoints.
"""

from __future__ import annotations

from typing import Any

import torch
from digits import digits_split
from torch import nn

import dagtune as dt
from dagtune.trainer import ResumableBatches, Trainer

#: The hyper-parameters `ScaledDigitsTrainer.setup` understands, with the values it starts from.
DEFAULTS: dict[str, Any] = {"lr": 0.05, "momentum": 0.9, "batch_size": 64, "weight_decay": 0.0}
#: The width (channels of the first convolution) of the full model.
BASE_WIDTH = 64


def make_cnn(width: int) -> nn.Sequential:
    """Two 3x3 convolutions of `width` and ``2 * width`` channels with max pooling (8x8 -> 4x4
    -> 2x2) and a readout; no dropout (its best rate depends on the width: it does not transfer)."""
    return nn.Sequential(
        nn.Conv2d(1, width, kernel_size=3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(width, 2 * width, kernel_size=3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        dt.mup.Readout(2 * width * 2 * 2, 10),
    )


class ScaledDigitsTrainer(Trainer):
    """The digits CNN at width ``base / scale``, trained with SGD; one step is one epoch.

    `parametrization` is ``"mup"`` (hyper-parameters transfer across `scale`) or ``"sp"``
    (PyTorch's defaults, for comparison). `seed` fixes the order of the training data (the
    weights come from torch's global RNG, which dagtune seeds); `validation_fraction` and
    `split_seed` fix the validation images.
    """

    def __init__(
        self,
        scale: float = 1,
        base: int = BASE_WIDTH,
        parametrization: str = "mup",
        seed: int = 0,
        validation_fraction: float = 0.2,
        split_seed: int = 0,
    ):
        torch.set_num_threads(1)  # a fixed sequence of floating-point operations (see examples/digits.py)
        train_x, train_y, val_x, val_y = digits_split(validation_fraction, split_seed)
        self.train_x, self.train_y = torch.from_numpy(train_x.copy()), torch.from_numpy(train_y.copy())
        self.val_x, self.val_y = torch.from_numpy(val_x.copy()), torch.from_numpy(val_y.copy())
        self.model = dt.mup.build(make_cnn, base=base, scale=scale, parametrization=parametrization)
        self.optimizer = dt.mup.SGD(
            self.model,
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
                f"ScaledDigitsTrainer has no hyper-parameter {unknown}; it knows {sorted(DEFAULTS)}"
            )
        values = {name: float(hp[name]) for name in ("lr", "momentum", "weight_decay") if name in hp}
        dt.mup.set_hyperparameters(self.optimizer, **values)
        if "batch_size" in hp:
            self.batches.set_batch_size(hp["batch_size"])

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
