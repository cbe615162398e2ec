"""Simulation as users start it: the simulated executor and a synthetic trainer.

`SimulatedExecutor` (of `dagtune.execution`, handed on here) runs a study's real coordinator
and runner on virtual workers in virtual time. `SyntheticTrainer` is a cheap trainer whose
learning curve genuinely depends on its hyper-parameter sequences (noisy SGD with momentum
on a quadratic), so algorithms can be tested against it.

`SyntheticTrainer` is defined here, and stays here: a study records its trainer by import
path (`dagtune.identity`), so the studies stored with ``dagtune.sim.SyntheticTrainer`` keep
their model identity and their search plans (docs/architecture.md, "Execution: one package,
the paths users know").
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from dagtune.execution import MemoryStore, SimulatedExecutor
from dagtune.trainer import Trainer

__all__ = ["MemoryStore", "SimulatedExecutor", "SyntheticTrainer"]


class SyntheticTrainer(Trainer):
    """Noisy SGD with momentum on a fixed, ill-conditioned quadratic.

    Hyper-parameters ``lr``, ``momentum``, ``batch_size`` and ``weight_decay`` (all optional)
    shape its curve as they shape a network's: too small a learning rate is slow, a large
    one is noisy (noise grows with lr / sqrt(batch size)), too large diverges to NaN.
    One step is `inner` SGD iterations. Metrics: ``val_loss`` (lower is better) and
    ``val_acc = 1 / (1 + val_loss)`` (higher is better). Deterministic for a seed, and
    cheap enough for thousands of simulated trials.
    """

    def __init__(
        self, dim: int = 8, inner: int = 10, noise: float = 0.5, condition: float = 100.0, seed: int = 0
    ):
        rng = np.random.default_rng(seed)
        self.seed = seed
        self.inner = inner
        self.noise = noise
        self.curvature = np.geomspace(1.0, 1.0 / condition, dim)
        self.target = rng.normal(size=dim)
        self.w = np.zeros(dim)
        self.v = np.zeros(dim)
        self.step = 0
        self.hp: dict[str, Any] = {"lr": 0.1, "momentum": 0.0, "batch_size": 128, "weight_decay": 0.0}

    def setup(self, hp: dict) -> None:
        self.hp.update(hp)

    def _loss(self, w: np.ndarray) -> float:
        with np.errstate(over="ignore", invalid="ignore"):
            return float(0.5 * np.sum(self.curvature * (w - self.target) ** 2))

    def train(self) -> dict:
        lr, momentum = float(self.hp["lr"]), float(self.hp["momentum"])
        decay, scale = (
            float(self.hp["weight_decay"]),
            self.noise / math.sqrt(float(self.hp["batch_size"]) / 128),
        )
        noise = scale * np.random.default_rng([self.seed, self.step]).standard_normal(
            (self.inner, self.w.size)
        )
        with np.errstate(over="ignore", invalid="ignore"):
            for k in range(self.inner):
                grad = self.curvature * (self.w - self.target) + decay * self.w + noise[k]
                self.v = momentum * self.v + grad
                self.w = self.w - lr * self.v
        self.step += 1
        return {"loss": self._loss(self.w)}

    def evaluate(self) -> dict:
        loss = self._loss(self.w)
        return {"val_loss": loss, "val_acc": 1.0 / (1.0 + loss) if math.isfinite(loss) else float("nan")}

    def state_dict(self) -> dict:
        return {"w": self.w.tolist(), "v": self.v.tolist(), "step": self.step, "hp": dict(self.hp)}

    def load_state_dict(self, state: dict) -> None:
        self.w, self.v = np.array(state["w"]), np.array(state["v"])
        self.step, self.hp = state["step"], dict(state["hp"])
