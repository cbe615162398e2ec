"""The coordinator's incremental planner against the rebuild it replaces: the same simulated
studies run with ``planner="incremental"`` and ``planner="rebuild"`` give the same trials
(configs, steps, statuses, curves), execute exactly the unique steps, and the incremental
one finishes no later."""

from __future__ import annotations

import functools
import random

import pytest

import dagtune as dt
import dagtune.coordinator._dispatcher as dispatcher_module
import dagtune.study._study as study_module
from dagtune.algos import ASHA, PBT, GridSearch, SuccessiveHalving
from dagtune.config import config_dumps
from dagtune.coordinator import Coordinator
from dagtune.plan import SearchPlan
from dagtune.scheduling import CriticalPath, Fifo
from dagtune.sim import SimulatedExecutor, SyntheticTrainer
from dagtune.study import Study

# lr schedules branching at several steps, momentum and batch size changing later
BRANCHING = dt.Grid(
    {
        "lr": [dt.Constant(0.1), dt.MultiStep(0.1, [10, 15], 0.1), dt.Exponential(0.1, 0.9)],
        "momentum": [0.0, dt.Steps([0.5, 0.9], [8])],
        "batch_size": [128, dt.Steps([128, 256], [12])],
    }
)

# schedules branching at and between ASHA's rungs (1, 3, 9, 27)
RUNGS = dt.Grid(
    {
        "lr": [
            dt.Steps([0.1, 0.05], [7]),
            dt.Constant(0.1),
            dt.MultiStep(0.1, [3, 9], 0.3),
            dt.Steps([0.03, 0.05], [5]),
        ],
        "momentum": [0.0, dt.Steps([0.0, 0.5], [5]), dt.Steps([0.0, 0.9], [2])],
    }
)


def random_schedules(seed: int, n: int, steps: int) -> list[dict]:
    """Random step schedules: a deep, uneven tree on which critical path pauses paths."""
    rng = random.Random(seed)
    configs = []
    for _ in range(n):
        milestones = sorted(rng.sample(range(1, steps), rng.randint(0, 3)))
        lr = dt.Steps([rng.choice([0.1, 0.05, 0.01]) for _ in range(len(milestones) + 1)], milestones)
        configs.append(
            {"lr": lr, "batch_size": dt.Steps([128, rng.choice([128, 256])], [rng.choice([10, 20])])}
        )
    return configs


STUDIES = {
    "grid, branching lr": (2, lambda: GridSearch(BRANCHING, "val_loss", "min", steps=20)),
    "grid, random schedules (pauses)": (
        8,
        lambda: GridSearch(random_schedules(0, 40, 60), "val_loss", "min", steps=60),
    ),
    "ASHA": (3, lambda: ASHA(RUNGS, "val_loss", "min", max_steps=27, eta=3)),
    "successive halving": (4, lambda: SuccessiveHalving(RUNGS, "val_loss", "min", max_steps=27, eta=3)),
    "PBT": (
        4,
        lambda: PBT(
            dt.Random({"lr": dt.loguniform(0.01, 0.3), "momentum": dt.uniform(0.0, 0.9)}, n=6, seed=1),
            "val_loss",
            "min",
            max_steps=20,
            interval=5,
            population=6,
            seed=3,
        ),
    ),
}


def run(name: str, planner: str, monkeypatch) -> tuple[list[tuple], dict, Coordinator]:
    workers, algorithm = STUDIES[name]
    with monkeypatch.context() as patch:
        patch.setattr(study_module, "Coordinator", functools.partial(Coordinator, planner=planner))
        study = Study(SyntheticTrainer, executor=SimulatedExecutor(workers))
    if planner == "incremental":  # it must not fall back on rebuilding the tree
        monkeypatch.setattr(dispatcher_module, "build_stage_tree", None)
    try:
        result = study.run(algorithm())
    finally:
        monkeypatch.undo()
    trials = [
        (config_dumps(t.config), t.steps, t.status, t.curve)
        for t in sorted(study.coordinator.trials.values(), key=lambda t: t.id)
    ]
    return trials, result.report, study.coordinator


@pytest.mark.parametrize("name", list(STUDIES))
def test_incremental_planner_runs_the_studies_the_rebuild_runs(name, monkeypatch):
    rebuilt, rebuilt_report, reference = run(name, "rebuild", monkeypatch)
    trials, report, coordinator = run(name, "incremental", monkeypatch)
    assert reference.planner is None and coordinator.planner is not None
    assert trials == rebuilt
    assert report["executed_steps"] == report["unique_steps"] == rebuilt_report["executed_steps"]
    assert report["trial_steps"] == rebuilt_report["trial_steps"]
    assert report["makespan_seconds"] <= rebuilt_report["makespan_seconds"] * 1.001
    print(
        f"{name}: makespan {report['makespan_seconds']:.1f} (rebuild {rebuilt_report['makespan_seconds']:.1f})"
    )


def test_planner_choice_is_checked():
    executor = SimulatedExecutor(1)
    spec = None
    with pytest.raises(ValueError, match=r"planner must be one of \['incremental', 'rebuild'\], got 'fast'"):
        Coordinator(SearchPlan(), executor, spec, CriticalPath(), planner="fast")

    class OwnPick(Fifo):
        def pick(self, tree, slots, cost, plan=None, priority=None):
            return super().pick(tree, slots, cost, plan, priority)

    assert Coordinator(SearchPlan(), executor, spec, OwnPick()).planner is None  # the default
    with pytest.raises(ValueError, match='OwnPick overrides pick: use planner="rebuild"'):
        Coordinator(SearchPlan(), executor, spec, OwnPick(), planner="incremental")
