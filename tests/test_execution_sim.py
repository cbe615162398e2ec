"""The coordinator and runner on the simulated executor (virtual time, real training steps)."""

from __future__ import annotations

import random

import pytest

import dagtune as dt
from dagtune.algos import GridSearch
from dagtune.config import normalize_config
from dagtune.plan import SearchPlan, build_stage_tree
from dagtune.scheduling import CostModel, critical_path_priorities
from dagtune.sim import SimulatedExecutor, SyntheticTrainer
from dagtune.study import Study, TrialError, run_alone

SPACE = dt.Grid(
    {
        "lr": [dt.Constant(0.1), dt.MultiStep(0.1, [10, 15], 0.1), dt.Exponential(0.1, 0.9)],
        "momentum": [0.0, dt.Steps([0.5, 0.9], [8])],
        "batch_size": [128, dt.Steps([128, 256], [12])],
    }
)


def sim_study(workers: int = 2, **kwargs) -> Study:
    return Study(SyntheticTrainer, executor=SimulatedExecutor(workers), **kwargs)


def random_configs(rng: random.Random, n: int, steps: int) -> list[dict]:
    configs = []
    for _ in range(n):
        milestones = sorted(rng.sample(range(1, steps), rng.randint(0, 3)))
        lr = dt.Steps([rng.choice([0.1, 0.05, 0.01]) for _ in range(len(milestones) + 1)], milestones)
        batch = dt.Steps([128, rng.choice([128, 256])], [rng.choice([10, 20, 30])])
        configs.append({"lr": lr, "batch_size": batch})
    return configs


def test_grid_study_trains_every_prefix_once_and_matches_run_alone():
    study = sim_study()
    result = study.run(GridSearch(SPACE, metric="val_loss", mode="min", steps=20))
    report = result.report
    assert report["trials"] == 12
    assert report["trial_steps"] == 240
    assert report["executed_steps"] == report["unique_steps"] == dt.unique_steps((c, 20) for c in SPACE)
    assert report["reuse"] == pytest.approx(report["trial_steps"] / report["unique_steps"])
    assert report["merge_rate"] > 1.5
    for trial in study.coordinator.trials.values():
        alone = run_alone(SyntheticTrainer, trial.config, 20)
        assert [metrics for _, metrics in trial.curve] == alone
    best = result.best
    assert best.metrics["val_loss"] == min(t.metrics["val_loss"] for t in study.coordinator.trials.values())
    frame = result.trials
    assert len(frame) == 12 and {"lr", "momentum", "val_loss"} <= set(frame.columns)


def test_trial_based_baseline_trains_every_trial_alone():
    study = sim_study(reuse=False)
    report = study.run(GridSearch(SPACE, metric="val_loss", mode="min", steps=20)).report
    assert report["executed_steps"] == report["trial_steps"] == 240
    assert report["reuse"] == 1.0


def test_known_metrics_return_without_training():
    study = sim_study()
    config = {"lr": 0.1, "momentum": 0.0, "batch_size": 128}
    first = study.submit(config, 10).result()
    executed = study.report["executed_steps"]
    assert study.evaluate(config, 10) == first
    assert study.evaluate(config, 4) == run_alone(SyntheticTrainer, config, 4)[-1]
    assert study.report["executed_steps"] == executed


def test_with_one_worker_the_critical_path_runs_first():
    rng = random.Random(3)
    configs = random_configs(rng, 20, 40)
    configs.append({"lr": dt.Steps([0.1, 0.01], [5]), "batch_size": 128})  # a lone long branch
    study = sim_study(workers=1)
    launched = []
    launch = study.executor.launch
    study.executor.launch = lambda task, priority=0.0, prefer=None: (
        launched.append(task),
        launch(task, priority, prefer),
    )
    study.run(GridSearch(configs, metric="val_loss", mode="min", steps=40))
    plan = SearchPlan()
    for i, config in enumerate(configs):
        plan.add_request(normalize_config(config), 40, i)
    tree = build_stage_tree(plan)
    priority = critical_path_priorities(tree, CostModel())
    longest = max(priority)
    first = launched[0]
    assert first.start == 0
    assert sum(s.end - s.start for s in first.segments) == longest  # a whole root-to-leaf critical path


@pytest.mark.parametrize("workers", [2, 4])
def test_makespan_is_close_to_the_lower_bound(workers):
    ratios = []
    for seed in range(4):
        configs = random_configs(random.Random(seed), 40, 60)
        plan = SearchPlan()
        for i, config in enumerate(configs):
            plan.add_request(normalize_config(config), 60, i)
        longest = max(critical_path_priorities(build_stage_tree(plan), CostModel()))
        report = sim_study(workers).run(GridSearch(configs, metric="val_loss", mode="min", steps=60)).report
        assert report["executed_steps"] == report["unique_steps"]
        ratios.append(report["makespan_seconds"] / max(longest, report["unique_steps"] / workers))
    print(f"makespan / lower bound with {workers} workers: {[round(r, 3) for r in ratios]}")
    assert max(ratios) <= 1.10


def test_trial_branching_from_a_running_stage_gets_its_checkpoint_on_the_way():
    study = sim_study(workers=2)
    first = study.submit({"lr": 0.1, "batch_size": 128}, 100)
    while study.coordinator.executed_steps < 30:
        study.coordinator.pump()
    (running,) = study.coordinator.running.values()
    assert running.progress < 60
    second = study.submit({"lr": dt.Steps([0.1, 0.01], [60]), "batch_size": 128}, 100)
    first.result()
    second.result()
    report = study.report
    assert report["unique_steps"] == 140
    assert report["executed_steps"] == 140  # nothing recomputed: [0, 60) trained once
    assert (
        second.result()
        == run_alone(SyntheticTrainer, {"lr": dt.Steps([0.1, 0.01], [60]), "batch_size": 128}, 100)[-1]
    )


def test_branching_behind_a_running_stage_recomputes_from_the_latest_checkpoint():
    study = sim_study(workers=2, checkpoint_every=20)
    first = study.submit({"lr": 0.1, "batch_size": 128}, 100)
    while study.coordinator.executed_steps < 70:
        study.coordinator.pump()
    second = study.submit({"lr": dt.Steps([0.1, 0.01], [50]), "batch_size": 128}, 60)
    first.result()
    assert (
        second.result()
        == run_alone(SyntheticTrainer, {"lr": dt.Steps([0.1, 0.01], [50]), "batch_size": 128}, 60)[-1]
    )
    # the point at 50 had passed: resumed from the periodic checkpoint at 40, not from scratch
    assert study.report["executed_steps"] == 100 + (50 - 40) + 10


def test_stopping_a_trial_stops_its_running_stage_but_not_shared_work():
    study = sim_study(workers=1)
    shared = study.submit({"lr": dt.Steps([0.1, 0.05], [30]), "batch_size": 128}, 40)
    doomed = study.submit({"lr": dt.Steps([0.1, 0.01], [30]), "batch_size": 128}, 200)
    while study.coordinator.executed_steps < 35:
        study.coordinator.pump()
    doomed.stop()
    shared.result()
    while study.coordinator.running:
        study.coordinator.pump()
    assert doomed.status == "stopped"
    assert shared.status == "completed"
    assert study.report["executed_steps"] < 100  # the 200-step branch did not run to its end


class FlakyTrainer(SyntheticTrainer):
    """Raises in the step after `fail_at` the first `failures` times it gets there."""

    raised = 0

    def __init__(self, fail_at: int = 5, failures: int = 1, **kwargs):
        super().__init__(**kwargs)
        self.fail_at, self.failures = fail_at, failures

    def train(self):
        if self.step == self.fail_at and FlakyTrainer.raised < self.failures:
            FlakyTrainer.raised += 1
            raise RuntimeError("flaky hardware")
        return super().train()


def test_a_failing_stage_is_retried():
    FlakyTrainer.raised = 0
    study = Study(FlakyTrainer, {"failures": 1}, executor=SimulatedExecutor(1), max_retries=1)
    assert study.submit({"lr": 0.1}, 10).result() == run_alone(SyntheticTrainer, {"lr": 0.1}, 10)[-1]


def test_a_trial_that_keeps_failing_is_marked_failed_and_others_finish():
    FlakyTrainer.raised = 0
    study = Study(FlakyTrainer, {"failures": 99}, executor=SimulatedExecutor(2), max_retries=1)
    bad = study.submit({"lr": dt.Steps([0.1, 0.01], [3])}, 10)
    good = study.submit({"lr": dt.Steps([0.1, 0.05], [3])}, 5)
    with pytest.raises(TrialError, match="flaky hardware"):
        bad.result()
    assert bad.status == "failed"
    assert good.result() and good.status == "completed"


def test_diverging_trial_is_marked_diverged():
    study = sim_study()
    handle = study.submit({"lr": 50.0}, 20)
    handle.result()
    assert handle.status == "diverged"


def test_configs_must_name_the_same_hyper_parameters():
    study = sim_study()
    study.submit({"lr": 0.1}, 2)
    with pytest.raises(ValueError, match="same hyper-parameters"):
        study.submit({"lr": 0.1, "momentum": 0.9}, 2)


@pytest.mark.parametrize("steps", [0, -3, 2.5, True])
def test_bad_steps_are_rejected(steps):
    with pytest.raises(ValueError, match="steps"):
        sim_study().submit({"lr": 0.1}, steps)
