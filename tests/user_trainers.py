"""Trainers written the way users write them, for the tests of what dagtune accepts and catches.

`MnistStyle` is PyTorch's MNIST example ported to dagtune as a user ports it: the same CNN
(convolutions, dropout, batch norm here too), ``model.train()`` at the start of ``train()``,
``model.eval()`` in ``evaluate()`` and never switched back, a ``DataLoader`` that shuffles
with torch's global generator, SGD with momentum. The data is a small fixed random set of
8x8 images, so a step (one epoch) takes milliseconds. The variants make the mistakes users
make: an optimizer left out of ``state_dict()``, a typo in a hyper-parameter's name, a
``train()`` that raises.

Dask workers import this module to unpickle the trainers (``tests/`` is on their sys.path,
see conftest).
"""

from __future__ import annotations

import inspect
import math
import os
import random

import numpy as np
import torch
import torch.nn.functional as F  # noqa: N812 (as PyTorch's examples write it)
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import dagtune as dt


def _data(n: int, seed: int) -> TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    images = torch.randn(n, 1, 8, 8, generator=generator)
    labels = (images.mean(dim=(1, 2, 3)) > 0).long() + 2 * (images[:, 0, 0, 0] > 0).long()
    return TensorDataset(images, labels)


class Net(nn.Module):
    """The MNIST example's network, shrunk to 8x8 images (and with batch norm)."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3, 1)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 16, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(16 * 2 * 2, 32)
        self.fc2 = nn.Linear(32, 4)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        x = F.relu(self.conv2(x))
        x = F.max_pool2d(x, 2)
        x = self.dropout1(x)
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        x = self.dropout2(x)
        return F.log_softmax(self.fc2(x), dim=1)


class MnistStyle(dt.Trainer):
    """PyTorch's MNIST example as a dagtune trainer; one step is one epoch."""

    def __init__(self, seed: int = 0, samples: int = 96):
        torch.manual_seed(seed)
        self.model = Net()
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.05, momentum=0.9)
        self.train_loader = DataLoader(_data(samples, 1), batch_size=32, shuffle=True)
        self.test_loader = DataLoader(_data(64, 2), batch_size=64)

    def setup(self, hp):
        if "lr" in hp:
            for group in self.optimizer.param_groups:
                group["lr"] = hp["lr"]

    def train(self):
        self.model.train()
        total = 0.0
        for data, target in self.train_loader:
            self.optimizer.zero_grad()
            loss = F.nll_loss(self.model(data), target)
            loss.backward()
            self.optimizer.step()
            total += loss.item()
        return {"loss": total / len(self.train_loader)}

    def evaluate(self):
        self.model.eval()
        test_loss, correct = 0.0, 0
        with torch.no_grad():
            for data, target in self.test_loader:
                output = self.model(data)
                test_loss += F.nll_loss(output, target, reduction="sum").item()
                correct += (output.argmax(dim=1) == target).sum().item()
        n = len(self.test_loader.dataset)
        return {"val_loss": test_loss / n, "val_acc": correct / n}

    def state_dict(self):
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state):
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])


class ReliesOnTheMode(MnistStyle):
    """Sets training mode once, in ``__init__``, and never again: evaluating in eval mode
    would leave dropout and batch norm off for the rest of training without dagtune."""

    def __init__(self, seed: int = 0, samples: int = 96):
        super().__init__(seed, samples)
        self.model.train()

    def train(self):
        total = 0.0
        for data, target in self.train_loader:
            self.optimizer.zero_grad()
            loss = F.nll_loss(self.model(data), target)
            loss.backward()
            self.optimizer.step()
            total += loss.item()
        return {"loss": total / len(self.train_loader)}


class ForgetsTheOptimizer(MnistStyle):
    """Saves only the model: every resume restarts SGD's momentum from nothing."""

    def state_dict(self):
        return {"model": self.model.state_dict()}

    def load_state_dict(self, state):
        self.model.load_state_dict(state["model"])


class BuildsInSetup(MnistStyle):
    """Builds its model and optimizer at its first ``setup`` (where a hyper-parameter that
    shapes the model would be read), so a trainer that ``__init__`` just built has none to
    load a checkpoint into."""

    def __init__(self, seed: int = 0, samples: int = 96):
        super().__init__(seed, samples)
        self.model = self.optimizer = None

    def setup(self, hp):
        if self.model is None:
            self.model = Net()
            self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.05, momentum=0.9)
        super().setup(hp)


class ForgetsTheScheduler(MnistStyle):
    """Decays the learning rate with its own ``StepLR`` (as the MNIST example does) but saves
    no scheduler: a resumed trainer starts its decay over."""

    def __init__(self, seed: int = 0, samples: int = 96):
        super().__init__(seed, samples)
        self.scheduler = torch.optim.lr_scheduler.StepLR(self.optimizer, step_size=1, gamma=0.7)

    def setup(self, hp):
        if "lr" in hp:  # where the schedule starts; the scheduler decides from there
            self.scheduler.base_lrs = [hp["lr"]]

    def train(self):
        metrics = super().train()
        self.scheduler.step()
        return metrics


class Typo(MnistStyle):
    """Reads ``learning_rate`` where the search space says ``lr``: every trial trains alike."""

    def setup(self, hp):
        for group in self.optimizer.param_groups:
            group["lr"] = hp.get("learning_rate", 0.05)


class FailsAtStep(MnistStyle):
    """``train()`` raises at step `fail_at` (counted from 0) of a fresh run."""

    def __init__(self, seed: int = 0, samples: int = 96, fail_at: int = 2):
        super().__init__(seed, samples)
        self.steps = 0
        self.fail_at = fail_at

    def train(self):
        if self.steps == self.fail_at:
            raise RuntimeError(f"CUDA out of memory (pretend) at step {self.steps}")
        self.steps += 1
        return super().train()

    def state_dict(self):
        return {**super().state_dict(), "steps": self.steps}

    def load_state_dict(self, state):
        super().load_state_dict(state)
        self.steps = state["steps"]


class DivergesAtHighLr(MnistStyle):
    """Its training loss is NaN when ``lr`` is above 1, as a learning rate far too high makes it."""

    def setup(self, hp):
        super().setup(hp)
        if "lr" in hp:
            self.lr = hp["lr"]

    def train(self):
        metrics = super().train()
        return {"loss": math.nan} if self.lr > 1 else metrics


class TooBigForTwo(MnistStyle):
    """Takes its worker process down when built for the resume check, as a second copy of a
    model that fills the machine's memory would (the kernel's out-of-memory killer)."""

    def __init__(self, seed: int = 0, samples: int = 96):
        if any(frame.function == "_resumed_step" for frame in inspect.stack()):
            os._exit(9)
        super().__init__(seed, samples)


class SeedsInSetup(MnistStyle):
    """Seeds torch from a hyper-parameter in ``setup()``, as scripts seed at their top: a
    resumed trainer's ``setup()`` (handed every value) reseeds where the trainer that saved
    the checkpoint did not, so every branch trains on other random numbers."""

    def setup(self, hp):
        super().setup(hp)
        if "seed" in hp:
            torch.manual_seed(hp["seed"])


class LoaderWorkers(MnistStyle):
    """Loads its batches in two worker processes (``DataLoader(num_workers=2)``), as scripts
    for large datasets do: fine in the user's own process, refused in a daemonic one (a Dask
    worker's)."""

    def __init__(self, seed: int = 0, samples: int = 96):
        super().__init__(seed, samples)
        self.train_loader = DataLoader(_data(samples, 1), batch_size=32, shuffle=True, num_workers=2)


class EvaluatesEveryOther(MnistStyle):
    """Evaluates only every other epoch, to save time, as scripts do (`first`: the first
    epoch is one of them): its other results hold only ``train()``'s loss."""

    def __init__(self, seed: int = 0, samples: int = 96, first: bool = True):
        super().__init__(seed, samples)
        self.epochs = 0
        self.first = first

    def train(self):
        self.epochs += 1
        return super().train()

    def evaluate(self):
        return super().evaluate() if (self.epochs % 2 == 1) == self.first else {}

    def state_dict(self):
        return {**super().state_dict(), "epochs": self.epochs}

    def load_state_dict(self, state):
        super().load_state_dict(state)
        self.epochs = state["epochs"]


class SetsLrUnderAScheduler(MnistStyle):
    """Saves its ``StepLR`` as it should, but its ``setup()`` (MnistStyle's) writes ``lr`` into
    the optimizer: a resumed trainer's ``setup()``, handed every value, undoes the decay the
    scheduler made since the value was set."""

    def __init__(self, seed: int = 0, samples: int = 96):
        super().__init__(seed, samples)
        self.scheduler = torch.optim.lr_scheduler.StepLR(self.optimizer, step_size=1, gamma=0.7)

    def train(self):
        metrics = super().train()
        self.scheduler.step()
        return metrics

    def state_dict(self):
        return {**super().state_dict(), "scheduler": self.scheduler.state_dict()}

    def load_state_dict(self, state):
        super().load_state_dict(state)
        self.scheduler.load_state_dict(state["scheduler"])


class OneCycleOverEpochs(MnistStyle):
    """``OneCycleLR`` over ``hp["epochs"]`` epochs: built in ``setup()`` (its length is a
    hyper-parameter), its state loaded there once it exists. Its constructor rewrites the
    optimizer's momentum (``cycle_momentum``), so a resumed trainer trains on with the first
    step's momentum, not the checkpoint's."""

    def __init__(self, seed: int = 0, samples: int = 96):
        super().__init__(seed, samples)
        self.scheduler = self.pending = None

    def setup(self, hp):
        if "epochs" in hp:
            total = hp["epochs"] * len(self.train_loader)
            self.scheduler = torch.optim.lr_scheduler.OneCycleLR(
                self.optimizer, max_lr=0.1, total_steps=total
            )
            if self.pending is not None:
                self.scheduler.load_state_dict(self.pending)
                self.pending = None

    def train(self):
        self.model.train()
        for data, target in self.train_loader:
            self.optimizer.zero_grad()
            loss = F.nll_loss(self.model(data), target)
            loss.backward()
            self.optimizer.step()
            self.scheduler.step()
        return {"loss": loss.item()}

    def state_dict(self):
        return {**super().state_dict(), "scheduler": self.scheduler.state_dict()}

    def load_state_dict(self, state):
        super().load_state_dict(state)
        self.pending = state["scheduler"]


class KeepsNumpyHistory(MnistStyle):
    """Keeps its losses so far as a numpy array in ``state_dict()``, which a checkpoint
    (read with ``torch.load(weights_only=True)``) can't hold."""

    def __init__(self, seed: int = 0, samples: int = 96):
        super().__init__(seed, samples)
        self.history = np.zeros(0)

    def train(self):
        metrics = super().train()
        self.history = np.append(self.history, metrics["loss"])
        return metrics

    def state_dict(self):
        return {**super().state_dict(), "history": self.history}

    def load_state_dict(self, state):
        super().load_state_dict(state)
        self.history = state["history"]


class GetsWithDefault(MnistStyle):
    """Reads ``lr`` with ``hp.get("lr", 0.05)``, meaning "0.05 where the config has none":
    before a step where only another value changes, ``lr`` is not handed, and the default
    replaces the config's learning rate."""

    def setup(self, hp):
        for group in self.optimizer.param_groups:
            group["lr"] = hp.get("lr", 0.05)
        hp.get("batch_size")


class GetsWithTheValueInUse(GetsWithDefault):
    """``hp.get("lr", the learning rate in use)``: the idiom that keeps an unchanged value."""

    def setup(self, hp):
        for group in self.optimizer.param_groups:
            group["lr"] = hp.get("lr", group["lr"])
        hp.get("batch_size")


class ReadsAnUnchangedValue(MnistStyle):
    """Reads ``hp["momentum"]`` in every setup(), testing only ``"lr" in hp``: wrong before a
    step where only ``lr`` changes (setup() is handed only the changed values)."""

    def setup(self, hp):
        super().setup(hp)
        for group in self.optimizer.param_groups:
            group["momentum"] = hp["momentum"]


class AugmentsWithGlobalRandom(MnistStyle):
    """Shuffles the order of its batches with ``random.shuffle`` and jitters its inputs with
    ``random.random()``: python's global generator, which dagtune seeds and checkpoints."""

    def train(self):
        self.model.train()
        batches = list(self.train_loader)
        random.shuffle(batches)
        total = 0.0
        for data, target in batches:
            self.optimizer.zero_grad()
            loss = F.nll_loss(self.model(data * (1 + 0.1 * random.random())), target)
            loss.backward()
            self.optimizer.step()
            total += loss.item()
        return {"loss": total / len(batches)}
