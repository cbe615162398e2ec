"""The report's unique steps, read off the paths the plan gave the trials, are exactly the
definition's (counted from the trials' configs and reached steps) at every moment of a study:
shared prefixes, stops, promotions, failures and trials not placed yet; and taking a view of a
running study builds no counting plan of its trials (it did, under the study's lock, for every
view and every second's page snapshot)."""

from __future__ import annotations

import pytest
from durable_helpers import count_counting_plans

import dagtune as dt
from dagtune.algos import ASHA
from dagtune.coordinator import trial_figures
from dagtune.dashboard.snapshot import live_snapshot
from dagtune.plan import unique_steps
from dagtune.sim import SimulatedExecutor, SyntheticTrainer
from dagtune.summary import merge_rate_so_far

SPACE = dt.Grid(
    {
        "lr": [0.1, dt.Steps([0.1, 0.05], [2]), dt.Steps([0.1, 0.05, 0.01], [2, 5]), 0.3],
        "batch_size": [32, dt.Steps([32, 64], [4])],
    }
)


def by_configs(trials) -> int:
    """The unique steps of `trials` as defined: counted from their configs and reached steps."""
    return unique_steps([(t.config, t.reached) for t in trials if t.reached > 0])


class FailsLate(SyntheticTrainer):
    """Fails at step 5 for a batch size that grows to 64."""

    def train(self) -> dict:
        if self.step == 5 and self.hp["batch_size"] == 64 and self.hp["lr"] == 0.3:
            raise ValueError("diverged")
        return super().train()


@pytest.mark.parametrize("share", [True, False])
def test_the_unique_steps_off_the_paths_are_the_definitions_at_every_moment(share):
    study = dt.Study(FailsLate, executor=SimulatedExecutor(3), reuse=share, max_retries=0)
    for config in SPACE:
        study.submit(config, 8)
    study.submit({"lr": 0.1, "batch_size": 32}, 3)  # a prefix of another trial
    coordinator = study.coordinator
    moments = 0
    while coordinator.running or coordinator.plan.active:
        coordinator.pump()
        trials = [t.snapshot() for t in coordinator.trials.values()]
        assert trial_figures(trials)["unique_steps"] == by_configs(trials)
        ended = [t for t in trials if t.done]
        rate, count = merge_rate_so_far(trials)
        if ended:
            assert count == len([t for t in ended if t.reached > 0])
            assert rate == pytest.approx(sum(t.reached for t in ended) / by_configs(ended))
        moments += 1
    assert moments > 10
    trials = list(coordinator.trials.values())
    assert any(t.status == "failed" for t in trials)
    assert study.report["unique_steps"] == by_configs(trials)


def test_asha_promotions_count_as_defined():
    study = dt.Study(SyntheticTrainer, executor=SimulatedExecutor(4))
    configs = [{"lr": 0.01 * (k + 1), "batch_size": dt.Steps([32, 64], [3])} for k in range(27)]
    asha = ASHA(configs, "val_loss", "min", max_steps=27, eta=3)
    result = study.run(asha)
    trials = list(study.coordinator.trials.values())
    assert len({t.reached for t in trials}) == 4  # promoted through every rung
    assert result.report["unique_steps"] == by_configs(trials)


def test_a_view_of_a_running_study_builds_no_counting_plan(monkeypatch):
    counted = count_counting_plans(monkeypatch)
    study = dt.Study(SyntheticTrainer, executor=SimulatedExecutor(2))
    for config in SPACE:
        study.submit(config, 8)
    coordinator = study.coordinator
    while coordinator.executed_steps < 20:
        coordinator.pump()
    study.view(schedule=True)
    live_snapshot(study)
    assert study.report["unique_steps"] > 0
    assert counted == [0]
    private = dt.Study(SyntheticTrainer, executor=SimulatedExecutor(2), reuse=False)
    private.submit({"lr": 0.1}, 4).result()
    assert private.report["unique_steps"] == 4  # private paths: counted from the configs
    assert counted == [1]
