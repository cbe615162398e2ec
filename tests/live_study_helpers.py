"""A simulated study's parts that the live-view tests share (tests/test_schedule_view.py,
tests/test_dashboard_kept.py, tests/test_study_kept_view.py): a grid with shared prefixes and
branches, a trainer that fails one of its trials late, and ASHA or median stopping run to
the end (`run_algorithm`), a grid of any size stopped mid-run (`mid_run_grid`)."""

from __future__ import annotations

import dagtune as dt
from dagtune.algos import ASHA, MedianStopping
from dagtune.sim import SimulatedExecutor, SyntheticTrainer
from dagtune.study import Study

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


def run_algorithm(study: Study, algorithm: str) -> None:
    """Run ASHA (``asha``: trials extended by promotions) or median stopping (``median``:
    trials stopped) on 12 configs in `study`, and check that it did extend or stop some."""
    configs = [{"lr": 0.01 * (k + 1), "batch_size": dt.Steps([32, 64], [3])} for k in range(12)]
    if algorithm == "asha":
        study.run(ASHA(configs, "val_loss", "min", max_steps=9, eta=3))
    else:
        study.run(MedianStopping(configs, "val_loss", "min", max_steps=8, grace=2, min_samples=2))
    trials = list(study.coordinator.trials.values())
    if algorithm == "asha":
        assert len({t.reached for t in trials}) > 1  # promoted
    else:
        assert any(t.status == "stopped" for t in trials)


def mid_run_grid(trials: int) -> Study:
    """A study of `trials` trials on one simulated worker (10 learning rates by 10 batch-size
    schedules, 12 steps each), pumped until 30 steps were trained: what the tests that count
    the work of one more pump start from, at two sizes."""
    study = dt.Study(SyntheticTrainer, executor=SimulatedExecutor(1))
    for i in range(trials):
        study.submit({"lr": 0.001 * (i // 10 + 1), "batch_size": dt.MultiStep(32, [i % 10 + 1], 0.5)}, 12)
    while study.coordinator.executed_steps < 30:
        study.coordinator.pump()
    return study
