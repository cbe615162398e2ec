"""The read model every view reads a study through: `Study.view()`, a frozen `StudyView`
(simulated executor, fast)."""

from __future__ import annotations

import dataclasses

import pytest

import dagtune as dt
from dagtune.algos import GridSearch
from dagtune.checkpoints import CheckpointStore
from dagtune.records import PENDING, ScheduleView, StudyView, TrialSnapshot
from dagtune.sim import SimulatedExecutor, SyntheticTrainer

SPACE = dt.Grid(
    {
        "lr": [dt.Constant(0.1), dt.MultiStep(0.1, [10, 15], 0.1)],
        "momentum": [0.9, dt.Steps([0.9, 0.5], [6])],
    }
)


@pytest.fixture
def study(tmp_path):
    store = CheckpointStore(str(tmp_path))
    study = dt.Study(
        SyntheticTrainer, name="view", storage=str(tmp_path), executor=SimulatedExecutor(2, store=store)
    )
    yield study
    study.close()


def test_a_view_is_frozen_and_stays_as_it_was_while_the_study_goes_on(study):
    for config in SPACE:
        study.submit(config, 20)
    before = study.view()
    assert isinstance(before, StudyView) and before.schedule is None and before.configs is None
    assert [t.status for t in before.trials] == [PENDING] * 4
    assert all(isinstance(t, TrialSnapshot) for t in before.trials)
    with pytest.raises(dataclasses.FrozenInstanceError):
        before.trials[0].status = "completed"  # type: ignore[misc]
    with pytest.raises(TypeError):
        before.report["trial_steps"] = 0  # type: ignore[index]
    changes = study.activity().changes
    study.run(GridSearch(SPACE, metric="val_loss", mode="min", steps=20))
    after = study.view()
    assert study.activity().changes != changes
    assert [t.status for t in before.trials] == [PENDING] * 4 and all(not t.curve for t in before.trials)
    assert {t.status for t in after.trials} == {"completed"} and all(t.curve for t in after.trials)
    assert (before.metric, before.mode) == (None, "max") and (after.metric, after.mode) == ("val_loss", "min")
    assert after.report == study.report and after.report["executed_steps"] > before.report["executed_steps"]
    assert (
        after.token == study.activity().token
        and after.name == "view"
        and not after.closed
        and after.demand == 0
    )
    study.close()
    assert study.activity().closed and study.view().closed


def test_a_view_with_its_schedule_shows_what_runs_what_waits_and_the_critical_path(study):
    for config in SPACE:
        study.submit(config, 20)
    study.coordinator.pump()
    view = study.view(schedule=True)
    schedule = view.schedule
    assert isinstance(schedule, ScheduleView)
    assert schedule.running_tasks == len(study.coordinator.running) >= 1
    assert schedule.running and schedule.critical
    assert schedule.queued_stages == len(schedule.queued)
    trial_nodes = {node for t in view.trials for node, _, _ in t.segments}
    assert set(view.configs) == trial_nodes and set(view.trained) <= trial_nodes
    for node, start, end in [*schedule.running, *schedule.queued, *schedule.critical]:
        assert node in trial_nodes and 0 <= start < end <= 20
    study.run(GridSearch(SPACE, metric="val_loss", mode="min", steps=20))
    done = study.view(schedule=True).schedule
    assert done == ScheduleView()  # nothing runs, nothing waits


def test_a_result_gives_its_trials_as_frozen_records(study):
    result = study.run(GridSearch(SPACE, metric="val_loss", mode="min", steps=20))
    records = result.records
    assert sorted(t.id for t in records) == sorted(result.trials.index)
    assert all(isinstance(t, TrialSnapshot) and t.reached == 20 for t in records)
    assert result.best.id in {t.id for t in records}
