"""A simulated study's parts that the live-view tests share (tests/test_schedule_view.py,
tests/test_dashboard_kept.py): a grid with shared prefixes and branches, and a trainer that
fails one of its trials late."""

from __future__ import annotations

import dagtune as dt
from dagtune.sim import SyntheticTrainer

SPACE = dt.Grid(
    {
        "lr": [0.1, dt.Steps([0.1, 0.05], [2]), dt.Steps([0.1, 0.05, 0.01], [2, 5]), 0.3],
        "batch_size": [32, dt.Steps([32, 64], [4])],
    }
)


class FailsLate(SyntheticTrainer):
    """Fails at step 5 for a batch size that grows to 64 with the largest learning rate."""

    def train(self) -> dict:
        if self.step == 5 and self.hp["batch_size"] == 64 and self.hp["lr"] == 0.3:
            raise ValueError("diverged")
        return super().train()
