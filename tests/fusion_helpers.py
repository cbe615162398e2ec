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
from dagtune.events import MetricsReported, StepDone, to_wire
from dagtune.fusion import same_state
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
    return [{k: v for k, v in to_wire(e).items() if k not in ("attempt", "time", "seconds")} for e in events]


def drive(steps: Iterator[list[dict]], update, directives: dict[tuple[str, int], Directive]) -> list[dict]:
    """Run a runner's `steps()`; after the yield carrying task `key`'s step `n`, apply
    ``directives[(key, n)]`` with ``update(key, directive)`` (what an executor does between
    steps). Returns every event."""
    everything = []
    for events in steps:
        everything.extend(events)
        for event in events:
            directive = directives.get((event.task, event.step)) if isinstance(event, StepDone) else None
            if directive is not None:
                everything.extend(update(event.task, directive))
    return everything


def of(events: Iterable[dict], key: str) -> list[dict]:
    return [e for e in events if e.task == key]


def metrics(events: Iterable[dict]) -> list[dict]:
    return [e.metrics for e in events if isinstance(e, MetricsReported)]


# --------------------------------------------------------------------------- models of each kind


class Square(torch.autograd.Function):
    """x², written the old way (no setup_context, no vmap rule): vmap cannot batch it."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return 2 * x * grad


class Squared(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return Square.apply(x)


class RunningMean(nn.Module):
    """Subtracts a running mean of its inputs, a buffer re-assigned (not updated in place) in
    every training forward."""

    def __init__(self, features: int):
        super().__init__()
        self.register_buffer("mean", torch.zeros(features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            self.mean = 0.9 * self.mean + 0.1 * x.detach().mean(0)
        return x - self.mean


class Sequences(nn.Module):
    """A recurrent layer (GRU, LSTM) reading each sample as 8 steps of 4 values, its last
    output classified."""

    def __init__(self, recurrent: nn.Module):
        super().__init__()
        self.recurrent = recurrent
        self.head = nn.Linear(recurrent.hidden_size, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.recurrent(x.view(x.shape[0], 8, 4))
        return self.head(out[:, -1])


class DroppedSequences(Sequences):
    """A 2-layer bidirectional LSTM (batch first, dropout between its layers) whose outputs
    are dropped before the head reads them: its batch-first output is a transposed view (not
    contiguous), which dropout's noise is laid out like."""

    def __init__(self):
        super().__init__(nn.LSTM(4, 8, num_layers=2, bidirectional=True, dropout=0.2, batch_first=True))
        self.head = nn.Linear(16, 2)
        self.dropout = nn.Dropout(0.3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.recurrent(x.view(x.shape[0], 8, 4))
        return self.head(self.dropout(out).mean(1))


class Encoder(nn.Module):
    """A Transformer encoder layer (batch first, dropout 0.1) over each sample read as 8
    tokens of 4 values, mean-pooled and classified."""

    def __init__(self, width: int = 16):
        super().__init__()
        self.embed = nn.Linear(4, width)
        self.layer = nn.TransformerEncoderLayer(width, 2, 2 * width, dropout=0.1, batch_first=True)
        self.head = nn.Linear(width, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.layer(self.embed(x.view(x.shape[0], 8, 4))).mean(1))


def batchnorm_cnn() -> nn.Module:
    """BatchNorm2d on the input, after a max pooling and after a convolution."""
    return nn.Sequential(
        nn.Unflatten(1, (1, 8, 4)),
        nn.BatchNorm2d(1),
        nn.Conv2d(1, 4, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.BatchNorm2d(4),
        nn.Conv2d(4, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.Flatten(),
        nn.Dropout(0.1),
        nn.Linear(8 * 4 * 2, 2),
    )


def frozen_first_layer() -> nn.Module:
    """An MLP whose first layer is frozen (``requires_grad=False``, as a pretrained one):
    unfused, the optimizer skips it (no gradient)."""
    model = nn.Sequential(nn.Linear(32, 16), nn.ReLU(), nn.Linear(16, 2))
    model[0].requires_grad_(False)
    return model


#: kind -> the model of `Kinds` (each on 32 features per sample)
KINDS = {
    "batchnorm2d": batchnorm_cnn,
    "transformer": Encoder,
    "gru": lambda: Sequences(nn.GRU(4, 8, batch_first=True)),
    "lstm": lambda: Sequences(nn.LSTM(4, 8, batch_first=True)),
    "lstm-dropout": DroppedSequences,
    "frozen": frozen_first_layer,
    "running-mean": lambda: nn.Sequential(nn.Linear(32, 16), RunningMean(16), nn.ReLU(), nn.Linear(16, 2)),
    "custom-op": lambda: nn.Sequential(nn.Linear(32, 16), Squared(), nn.Linear(16, 2)),
    "batchnorm1d": lambda: nn.Sequential(
        nn.BatchNorm1d(32), nn.Linear(32, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 2)
    ),
    "batchnorm3d": lambda: nn.Sequential(
        nn.Unflatten(1, (1, 2, 4, 4)),
        nn.Conv3d(1, 4, 3, padding=1),
        nn.BatchNorm3d(4),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(4 * 32, 2),
    ),
    "groupnorm": lambda: nn.Sequential(
        nn.Unflatten(1, (1, 8, 4)),
        nn.Conv2d(1, 8, 3, padding=1),
        nn.GroupNorm(2, 8),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.GroupNorm(4, 8),
        nn.Flatten(),
        nn.Linear(8 * 8, 2),
    ),
    "instancenorm": lambda: nn.Sequential(
        nn.Unflatten(1, (1, 8, 4)),
        nn.Conv2d(1, 8, 3, padding=1),
        nn.InstanceNorm2d(8, affine=True, track_running_stats=True),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.InstanceNorm2d(8),
        nn.Flatten(),
        nn.Linear(8 * 8, 2),
    ),
    "layernorm": lambda: nn.Sequential(
        nn.Linear(32, 16), nn.LayerNorm(16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 2)
    ),
}


class Kinds(TinyMLP):
    """`TinyMLP`'s data (32 features, 2 classes, batches of 32) trained by the model of kind
    `kind` (`KINDS`)."""

    def __init__(self, kind: str = "batchnorm2d", seed: int = 0, **optimizer: Any):
        self.kind = kind
        super().__init__(features=32, seed=seed, **optimizer)

    def make_model(self, features: int, hidden: int) -> nn.Module:
        return KINDS[self.kind]()


class AdamKinds(Kinds):
    """`Kinds` trained with AdamW, which turns a gradient's rounding noise into lr-sized
    updates where the true gradient is zero (attention's key bias): fused must compute such
    gradients as unfused does to agree with it."""

    fusible = TinyAdamW.fusible
    optimizer_class = dt.AdamW
    optimizer_defaults: ClassVar[dict[str, Any]] = {"lr": 0.01}


class GroupedKinds(Kinds):
    """`Kinds` fused with batched convolutions and matrix products."""

    fused_kernels = "grouped"


def step_members_and_fused(members, optimizers, stacked, fused_optimizer, shapes, generator) -> None:
    """One optimizer step of each member's own torch optimizer and of the fused one, on the
    same random gradients (member k's gradient is slice k of the stacked one)."""
    grads = [torch.randn((len(members), *shape), generator=generator) for shape in shapes]
    for member, (params, optimizer) in enumerate(zip(members, optimizers)):
        for param, grad in zip(params, grads):
            param.grad = grad[member].clone()
        optimizer.step()
    for param, grad in zip(stacked, grads):
        param.grad = grad.clone()
    with torch.no_grad():
        fused_optimizer.step()


def assert_members_match_fused(members, optimizers, stacked, fused_optimizer) -> None:
    """Each member's parameters and optimizer state bit for bit the fused ones' slice."""
    for member, (params, optimizer) in enumerate(zip(members, optimizers)):
        for param, fused_param in zip(params, stacked):
            assert same_state(fused_param[member].detach(), param.detach())
        assert same_state(fused_optimizer.member_state_dict(member), optimizer.state_dict())
