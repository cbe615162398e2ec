"""Small fusible trainers and task builders for the fusion tests.

`TinyMLP` is the 30-64-2 MLP whose fused training is bitwise the unfused one on CPU (so
event streams can be compared with `PathRunner`'s whole); `TinyAdamW` is the same model
with AdamW; `TinyCNN` is a small CNN whose fused convolutions round differently from the
unfused ones (fused runs are compared with `run_alone(..., fused=True)` there).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

import dagtune as dt
from dagtune.config import normalize_config
from dagtune.tasks import Directive, PathTask, Segment, TrainerSpec

IDENTITY = "a1b2c3d4e5f60718"
NODES = [f"{i:016x}" for i in range(1, 64)]


class TinyMLP(dt.FusibleTrainer):
    """A features-hidden-2 MLP (30-64-2 by default) on a fixed synthetic 2-class problem; one
    step is one epoch of 8 batches of 32."""

    fusible: ClassVar[dict[str, str]] = {"lr": "lr", "momentum": "momentum", "weight_decay": "weight_decay"}
    batch_size_name = "batch_size"
    optimizer_class: ClassVar[type] = dt.SGD
    optimizer_defaults: ClassVar[dict[str, Any]] = {"lr": 0.1, "momentum": 0.9}
    input_shape: ClassVar[tuple[int, ...] | None] = None  # samples are reshaped to it

    def __init__(
        self,
        hidden: int = 64,
        dropout: float = 0.0,
        features: int = 30,
        n: int = 256,
        seed: int = 0,
        **optimizer: Any,
    ):
        torch.set_num_threads(1)
        rng = np.random.default_rng(1234)
        x = rng.standard_normal((n + 128, features)).astype(np.float32)
        y = (x @ rng.standard_normal(features) > 0).astype(np.int64)
        shape = self.input_shape or (features,)
        self.x, self.y = torch.from_numpy(x[:n]).view(-1, *shape), torch.from_numpy(y[:n])
        self.val_x, self.val_y = torch.from_numpy(x[n:]).view(-1, *shape), torch.from_numpy(y[n:])
        self.dropout = nn.Dropout(dropout)
        spec = self.optimizer_class(**{**self.optimizer_defaults, **optimizer})
        model = self.make_model(features, hidden)
        super().__init__(model=model, optimizer=spec, batches=dt.ResumableBatches(n, 32, seed=seed))

    def make_model(self, features: int, hidden: int) -> nn.Module:
        return nn.Sequential(nn.Linear(features, hidden), nn.ReLU(), self.dropout, nn.Linear(hidden, 2))

    def apply(self, name: str, value: Any) -> None:
        if name == "dropout":
            self.dropout.p = float(value)
        else:
            super().apply(name, value)

    def batch(self, indices: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        index = torch.from_numpy(indices)
        return self.x[index], self.y[index]

    def loss(self, model, batch) -> torch.Tensor:
        x, y = batch
        return nn.functional.cross_entropy(model(x), y, reduction="none")

    def evaluate_model(self, model: nn.Module) -> dict[str, float]:
        logits = model(self.val_x)
        return {
            "val_loss": nn.functional.cross_entropy(logits, self.val_y).item(),
            "val_acc": (logits.argmax(1) == self.val_y).double().mean().item(),
        }


class TinyAdamW(TinyMLP):
    """`TinyMLP` trained with AdamW."""

    fusible: ClassVar[dict[str, str]] = {
        "lr": "lr",
        "beta1": "beta1",
        "beta2": "beta2",
        "eps": "eps",
        "weight_decay": "weight_decay",
    }
    optimizer_class = dt.AdamW
    optimizer_defaults: ClassVar[dict[str, Any]] = {"lr": 0.01}


class TinyCNN(TinyMLP):
    """Two 3x3 convolutions (1 -> 4 -> 8 channels) and a linear layer on synthetic 1x8x8 images."""

    input_shape = (1, 8, 8)

    def __init__(self, dropout: float = 0.1, seed: int = 0, **optimizer: Any):
        super().__init__(hidden=8, dropout=dropout, features=64, seed=seed, **optimizer)

    def make_model(self, features: int, hidden: int) -> nn.Module:
        return nn.Sequential(
            nn.Conv2d(1, hidden // 2, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(hidden // 2, hidden, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
            self.dropout,
            nn.Linear(hidden * 4, 2),
        )


def task(
    key: str,
    config: dict | Iterable[tuple[int, int, dict]],
    end: int | None = None,
    *,
    start: int = 0,
    source: tuple[str, int] | None = None,
    checkpoints: Iterable[int] = (),
    eval_every: int = 1,
    cls: type = TinyMLP,
    kwargs: dict | None = None,
    seed: int = 0,
    node: int = 0,
) -> PathTask:
    """A path task of one segment ``[start, end)`` of `config` (node ``NODES[node]``), or of
    several: `config` given as ``(start, end, config)`` triples, one node each."""
    pieces = [(start, end, config)] if isinstance(config, dict) else list(config)
    segments = tuple(
        Segment(NODES[node + i], normalize_config(c), lo, hi) for i, (lo, hi, c) in enumerate(pieces)
    )
    return PathTask(
        key=key,
        trainer=TrainerSpec(cls, dict(kwargs or {}), seed, IDENTITY),
        segments=segments,
        source=source,
        checkpoints=frozenset(checkpoints),
        eval_every=eval_every,
    )


def comparable(events: Iterable[dict]) -> list[dict]:
    """Events without what differs between two runs of the same training (attempt ids,
    wall-clock times, step durations)."""
    return [{k: v for k, v in e.items() if k not in ("attempt", "time", "seconds")} for e in events]


def drive(steps: Iterator[list[dict]], update, directives: dict[tuple[str, int], Directive]) -> list[dict]:
    """Run a runner's `steps()`; after the yield carrying task `key`'s step `n`, apply
    ``directives[(key, n)]`` with ``update(key, directive)`` (what an executor does between
    steps). Returns every event."""
    everything = []
    for events in steps:
        everything.extend(events)
        for event in events:
            directive = directives.get((event["task"], event["step"])) if event["kind"] == "step" else None
            if directive is not None:
                everything.extend(update(event["task"], directive))
    return everything


def of(events: Iterable[dict], key: str) -> list[dict]:
    return [e for e in events if e["task"] == key]


def metrics(events: Iterable[dict]) -> list[dict]:
    return [e["metrics"] for e in events if e["kind"] == "metrics"]
