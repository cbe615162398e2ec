"""A byte-level Transformer language model of the Python standard library's source, at a width scale.

The corpus is on every machine that runs dagtune: the ``*.py`` files at the top of
``sysconfig.get_paths()["stdlib"]``, sorted by name, every tenth file held out for validation,
the first `train_bytes` and `val_bytes` of each concatenation (so it differs only between
Python versions). `StdlibLMTrainer(scale=8)` builds a pre-norm decoder whose model width (and
head width) is the base divided by 8, under muP or the standard parametrization, and trains it
with AdamW; one step is `batches_per_step` batches.
"""

from __future__ import annotations

import functools
import hashlib
import sysconfig
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812

import dagtune as dt
from dagtune.trainer import ResumableBatches, Trainer

#: The hyper-parameters `StdlibLMTrainer.setup` understands, with the values it starts from.
DEFAULTS: dict[str, Any] = {
    "lr": 3e-3,
    "beta1": 0.9,
    "batch_size": 32,
    "weight_decay": 0.0,
    "output_mult": 1.0,
}
VOCAB = 256  # bytes


@functools.lru_cache(maxsize=2)
def stdlib_corpus(train_bytes: int = 1_000_000, val_bytes: int = 16_384) -> tuple[np.ndarray, np.ndarray]:
    """``(train, val)`` uint8 arrays of standard-library source (see the module docstring)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(root.glob("*.py"))
    train, val = bytearray(), bytearray()
    for index, path in enumerate(files):
        target, limit = (val, val_bytes) if index % 10 == 0 else (train, train_bytes)
        if len(target) < limit:
            target.extend(path.read_bytes()[: limit - len(target)])
    if len(train) < train_bytes or len(val) < val_bytes:
        raise ValueError(
            f"the standard library at {root} holds {len(train)} training and {len(val)} validation "
            f"bytes, fewer than the {train_bytes} and {val_bytes} asked for"
        )
    arrays = (np.frombuffer(bytes(train), dtype=np.uint8), np.frombuffer(bytes(val), dtype=np.uint8))
    return arrays


def corpus_digest(train_bytes: int = 1_000_000, val_bytes: int = 16_384) -> str:
    """A short hash of the corpus, so results say which one they were measured on."""
    train, val = stdlib_corpus(train_bytes, val_bytes)
    return hashlib.sha256(train.tobytes() + val.tobytes()).hexdigest()[:12]


class Block(nn.Module):
    """Pre-norm decoder block: causal self-attention and a 4x MLP, each on a residual."""

    def __init__(self, width: int, heads: int):
        super().__init__()
        self.norm1 = nn.LayerNorm(width)
        self.attention = dt.mup.SelfAttention(width, heads, causal=True)
        self.norm2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class ByteLM(nn.Module):
    """Byte and position embeddings, `layers` blocks, a final norm and a readout to the bytes."""

    def __init__(self, width: int, heads: int = 4, layers: int = 2, context: int = 64, vocab: int = VOCAB):
        super().__init__()
        self.embedding = nn.Embedding(vocab, width)
        self.position = nn.Embedding(context, width)
        self.blocks = nn.Sequential(*(Block(width, heads) for _ in range(layers)))
        self.norm = nn.LayerNorm(width)
        self.readout = dt.mup.Readout(width, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        return self.readout(self.norm(self.blocks(self.embedding(tokens) + self.position(positions))))


class StdlibLMTrainer(Trainer):
    """`ByteLM` at width ``base / scale`` on `stdlib_corpus`, trained with AdamW.

    Training draws windows of ``context + 1`` bytes at non-overlapping offsets in an order
    fixed by `seed`; validation is the mean cross-entropy (in bits per byte) over every
    window of the validation text. Hyper-parameters: ``lr``, ``beta1``, ``batch_size``,
    ``weight_decay``.
    """

    def __init__(
        self,
        scale: float = 1,
        base: int = 128,
        parametrization: str = "mup",
        heads: int = 4,
        layers: int = 2,
        context: int = 64,
        batches_per_step: int = 25,
        train_bytes: int = 1_000_000,
        val_bytes: int = 16_384,
        seed: int = 0,
    ):
        torch.set_num_threads(1)  # a fixed sequence of floating-point operations (see examples/digits.py)
        train, val = stdlib_corpus(train_bytes, val_bytes)
        window = context + 1
        self.train_windows = torch.from_numpy(train[: len(train) // window * window].astype(np.int64)).view(
            -1, window
        )
        self.val_windows = torch.from_numpy(val[: len(val) // window * window].astype(np.int64)).view(
            -1, window
        )
        self.model = dt.mup.build(
            functools.partial(ByteLM, heads=heads, layers=layers, context=context),
            base=base,
            scale=scale,
            parametrization=parametrization,
        )
        self.optimizer = dt.mup.AdamW(
            self.model,
            lr=DEFAULTS["lr"],
            betas=(DEFAULTS["beta1"], 0.999),
            weight_decay=DEFAULTS["weight_decay"],
        )
        self.batches = ResumableBatches(len(self.train_windows), DEFAULTS["batch_size"], seed=seed)
        self.batches_per_step = batches_per_step

    def setup(self, hp: dict[str, Any]) -> None:
        """Apply the values given (all of them when a stage starts, the changed ones later)."""
        unknown = sorted(set(hp) - set(DEFAULTS))
        if unknown:
            raise ValueError(f"StdlibLMTrainer has no hyper-parameter {unknown}; it knows {sorted(DEFAULTS)}")
        values = {name: float(hp[name]) for name in ("lr", "weight_decay") if name in hp}
        if "beta1" in hp:
            values["betas"] = (float(hp["beta1"]), 0.999)
        dt.mup.set_hyperparameters(self.optimizer, **values)
        if "batch_size" in hp:
            self.batches.set_batch_size(hp["batch_size"])
        if "output_mult" in hp:
            if not float(hp["output_mult"]) > 0:
                raise ValueError(f"output_mult must be positive, got {hp['output_mult']!r}")
            self.model.readout.output_mult = float(hp["output_mult"])

    def loss(self, windows: torch.Tensor) -> torch.Tensor:
        logits = self.model(windows[:, :-1])
        return F.cross_entropy(logits.reshape(-1, VOCAB), windows[:, 1:].reshape(-1))

    def train(self) -> dict[str, float]:
        """`batches_per_step` AdamW steps; returns their mean loss in bits per byte."""
        self.model.train()
        total = 0.0
        for indices in self.batches.take(self.batches_per_step):
            self.optimizer.zero_grad(set_to_none=True)
            loss = self.loss(self.train_windows[torch.from_numpy(indices)])
            loss.backward()
            self.optimizer.step()
            total += loss.item()
        return {"loss_bpb": total / self.batches_per_step / np.log(2)}

    def evaluate(self) -> dict[str, float]:
        """Cross-entropy on the validation text, in bits per byte."""
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad():
                loss = self.loss(self.val_windows).item()
        finally:
            self.model.train(was_training)
        return {"val_bpb": loss / np.log(2)}

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
