"""A running study's schedule (`Study.view(schedule=True).schedule`, what the page draws) is
read off the coordinator's incremental planner and equals the one `schedule_view` draws from a
stage tree rebuilt from scratch, at every moment of a simulated study (shared prefixes and
branches, a trial stopped, one failed, one added mid-run, running tasks); and a view builds no
stage tree: the plan nodes it rebuilds follow the changes since the last view, not the
trials (it rebuilt the whole tree under the study's lock: 2 of 2.45 s at 100,000 trials)."""

from __future__ import annotations

from collections.abc import Mapping

import pytest
from live_study_helpers import SPACE, FailsLate, mid_run_grid, run_algorithm

import dagtune as dt
import dagtune.planner
import dagtune.scheduling as scheduling
from dagtune.plan import SearchPlan
from dagtune.records import ScheduleView
from dagtune.scheduling import CostModel, schedule_view
from dagtune.sim import SimulatedExecutor, SyntheticTrainer


class Planned:
    """The costs the planner's priorities were computed with (`IncrementalPlanner.estimates`)
    and the cost model's for nodes with no stage (a running task's rest, once nothing waits)."""

    def __init__(self, estimates: Mapping[str, float], cost: CostModel):
        self.estimates, self.cost = estimates, cost

    def step_seconds(self, node: str, plan: SearchPlan | None = None) -> float:
        found = self.estimates.get(node)
        return self.cost.step_seconds(node, plan) if found is None else found

    def stage_seconds(self, stage, plan: SearchPlan | None = None) -> float:
        return stage.steps * self.step_seconds(stage.node, plan)


def rebuilt(study: dt.Study) -> ScheduleView:
    """The schedule drawn from a stage tree built from scratch, priced as the planner prices."""
    coordinator = study.coordinator
    costs = Planned(coordinator.planner.estimates._estimates, coordinator.cost)
    return schedule_view(coordinator.plan, coordinator.running, costs)  # type: ignore[arg-type]


@pytest.fixture(params=["kept", "patched"])
def patched(request, monkeypatch) -> str:
    """``patched``: the planner's kept order places every change again, however many (by
    default it sorts all the stages again when more than an eighth of them changed, which a
    small study's rounds often do)."""
    if request.param == "patched":
        monkeypatch.setattr(dagtune.planner._KeptOrder, "_RESORT", 0)
    return request.param


@pytest.mark.parametrize("workers", [1, 3])
def test_the_schedule_off_the_live_tree_is_the_rebuilt_ones_at_every_moment(workers, patched):
    study = dt.Study(FailsLate, executor=SimulatedExecutor(workers), max_retries=0)
    handles = [study.submit(config, 8) for config in SPACE]
    study.submit({"lr": 0.1, "batch_size": 32}, 3)  # a prefix of another trial
    coordinator = study.coordinator
    assert coordinator.planner is not None
    moments, running, critical_from_task = 0, 0, 0
    while coordinator.running or coordinator.plan.active:
        coordinator.pump()
        if moments == 3:
            coordinator.stop(handles[3].id)  # a trial stopped while its path is planned or runs
            assert study.view(schedule=True).schedule == rebuilt(study)  # before the next round
        if moments == 5:  # a branch off what runs, before the next round plans it
            study.submit({"lr": dt.Steps([0.1, 0.05, 0.2], [2, 6]), "batch_size": 32}, 10)
            assert study.view(schedule=True).schedule == rebuilt(study)
        schedule = study.view(schedule=True).schedule
        assert schedule == rebuilt(study)
        running += bool(schedule.running)
        critical_from_task += bool(schedule.critical and schedule.critical[0] in schedule.running)
        moments += 1
    assert moments > 10 and running > 5 and critical_from_task > 0
    statuses = {t.status for t in coordinator.trials.values()}
    assert {"failed", "stopped", "completed"} <= statuses
    assert study.view(schedule=True).schedule == ScheduleView() == rebuilt(study)
    study.close()


class Checked:
    """A listener that compares the study's schedule with the rebuilt one at every result and
    end (inside the coordinator's delivery)."""

    def __init__(self, study: dt.Study):
        self.study, self.checked = study, 0

    def check(self, *_: object) -> None:
        assert self.study.view(schedule=True).schedule == rebuilt(self.study)
        self.checked += 1

    on_result = on_complete = on_end = check


@pytest.mark.parametrize("algorithm", ["asha", "median"])
def test_the_schedule_off_the_live_tree_is_the_rebuilt_ones_through_an_algorithm(algorithm, patched):
    """ASHA extends trials (promotions), median stopping stops them."""
    study = dt.Study(SyntheticTrainer, executor=SimulatedExecutor(3))
    checked = Checked(study)
    study.coordinator.listeners.append(checked)
    run_algorithm(study, algorithm)
    assert checked.checked > 20
    assert study.view(schedule=True).schedule == rebuilt(study)
    study.close()


def read_by_a_view_after_pumps(trials: int) -> tuple[int, int]:
    """The stages a schedule view places again or reads after ten pumps of a mid-run grid of
    `trials` trials on one worker (stages start, end and move), and after nothing changed (its
    critical path only)."""
    study = mid_run_grid(trials)
    coordinator, planner = study.coordinator, study.coordinator.planner
    sorts = [0]

    def counting(*args, **kwargs):
        sorts[0] += 1
        return sorted(*args, **kwargs)

    first = study.view(schedule=True).schedule
    assert first.queued_stages > trials // 2  # most trials wait: their stages are queued
    before = planner.view_reads
    study.view(schedule=True)
    unchanged = planner.view_reads - before
    for _ in range(10):
        coordinator.pump()
    before = planner.view_reads
    dagtune.planner.sorted = counting  # type: ignore[attr-defined]  # the module's, for this view
    try:
        schedule = study.view(schedule=True).schedule
    finally:
        del dagtune.planner.sorted  # type: ignore[attr-defined]
    assert schedule == rebuilt(study)
    assert sorts == [0]  # no stage sorted
    read = planner.view_reads - before
    study.close()
    return read, unchanged


def test_a_schedule_view_reads_what_changed_not_the_stages():
    small, large = read_by_a_view_after_pumps(50), read_by_a_view_after_pumps(500)
    assert small == large, (small, large)
    assert large[1] < large[0] <= 40


def test_a_policy_with_its_own_pick_keeps_the_rebuilt_schedule():
    """A coordinator without an incremental planner (``planner="rebuild"``) is drawn as before."""

    class Picky(scheduling.CriticalPath):
        def pick(self, tree, slots, cost, plan=None, priority=None):
            return super().pick(tree, slots, cost, plan, priority)

    study = dt.Study(SyntheticTrainer, executor=SimulatedExecutor(2), scheduler=Picky())
    for config in SPACE:
        study.submit(config, 8)
    coordinator = study.coordinator
    coordinator.pump()
    assert coordinator.planner is None
    view = study.view(schedule=True).schedule
    assert view == schedule_view(coordinator.plan, coordinator.running, coordinator.cost)
    assert view.queued and view.critical
    study.close()


def built_by_views(trials: int, monkeypatch) -> list[int]:
    """Plan nodes rebuilt by each view of a study of `trials` trials mid-run: the first, one
    with nothing new, one after each of 10 rounds, one after a trial more."""
    trees = [0]
    build = scheduling.build_stage_tree

    def counting(*args, **kwargs):
        trees[0] += 1
        return build(*args, **kwargs)

    monkeypatch.setattr(scheduling, "build_stage_tree", counting)
    study = dt.Study(SyntheticTrainer, executor=SimulatedExecutor(10))
    for i in range(trials // 10):
        for branch in range(1, 11):
            study.submit({"lr": 0.001 * (i + 1), "batch_size": dt.MultiStep(32, [branch], 0.5)}, 12)
    coordinator = study.coordinator
    while coordinator.executed_steps < 3 * trials:
        coordinator.pump()
    live = coordinator.planner.live

    def view() -> int:
        before = live.rebuilds
        study.view(schedule=True)
        return live.rebuilds - before

    built = [view(), view()]
    for _ in range(10):
        coordinator.pump()
        built.append(view())
    study.submit({"lr": 1.0, "batch_size": 32}, 12)
    built.append(view())
    study.close()
    assert trees == [0]  # no stage tree built from scratch
    return built


def test_a_view_rebuilds_what_changed_not_the_tree(monkeypatch):
    small, large = built_by_views(50, monkeypatch), built_by_views(500, monkeypatch)
    assert small[1] == large[1] == 0  # nothing new: nothing
    assert small[-1] == large[-1] == 1  # a new root node: itself
    assert max(small) <= 4 and max(large) <= 4  # a round's changes: a few nodes, at any size
