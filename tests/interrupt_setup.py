"""The study the interrupt tests run with ``dagtune run`` and interrupt: six schedules of a
small fusible MLP that share prefixes, 12 steps each with a checkpoint every 2, paced
(`PacedMLP`) so that a run lasts seconds and can be cut anywhere. ``--fuse`` trains it fused.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch
from fusion_helpers import TinyMLP

import dagtune as dt
from dagtune.algos import GridSearch
from dagtune.launch import StudySetup

STEPS = 12
SPACE = dt.Grid(
    {
        "lr": [dt.Constant(0.1), dt.MultiStep(0.1, [4], 0.1), dt.MultiStep(0.1, [8], 0.1)],
        "momentum": [0.9, dt.Steps([0.9, 0.5], [6])],
    }
)


class PacedMLP(TinyMLP):
    """`TinyMLP` taking `pace` seconds more per batch (8 batches a step): what it computes
    does not change, only how long a step lasts."""

    def __init__(self, pace: float = 0.01, **kwargs: Any):
        super().__init__(**kwargs)
        self.pace = pace

    def batch(self, indices: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        time.sleep(self.pace)
        return super().batch(indices)


def study_setup() -> StudySetup:
    algorithm = GridSearch(SPACE, metric="val_loss", mode="min", steps=STEPS)
    return StudySetup(trainer=PacedMLP, algorithm=algorithm, name="cut", options={"checkpoint_every": 2})
