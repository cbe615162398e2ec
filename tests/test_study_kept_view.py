"""A study's view taken again copies only what changed (`dagtune.study._kept_view.KeptView`),
and is still, field for field, the view made from scratch: at every pump of a grid with shared
prefixes, a failure, a stop, a prefix trial, a branch and a new root submitted mid-run; at every
result and end of ASHA and median stopping; through a study resumed from storage."""

from __future__ import annotations

import random
from dataclasses import fields
from types import MappingProxyType, SimpleNamespace

import pytest
from live_study_helpers import SPACE, FailsLate, mid_run_grid, run_algorithm

import dagtune as dt
from dagtune.algos import GridSearch
from dagtune.checkpoints import CheckpointStore
from dagtune.coordinator import KeptFigures, report_figures
from dagtune.records import Trial, TrialSnapshot
from dagtune.sim import SimulatedExecutor, SyntheticTrainer
from dagtune.study._page_figures import PageFigures
from dagtune.summary import best_of, failures, merge_rate_so_far, metric_of, status_counts, trained_from_plan


def shown(snapshot: TrialSnapshot) -> tuple:
    """Every field of a trial's snapshot, as values."""
    values = tuple(getattr(snapshot, f.name) for f in fields(snapshot))
    return (*values, snapshot.metrics and dict(snapshot.metrics), snapshot.curve)


def same_as_from_scratch(study: dt.Study) -> dt.records.StudyView:
    """The study's view, checked against one made from scratch (the copy of every trial and
    node the view made before it kept anything)."""
    view = study.view(schedule=True)
    coordinator = study.coordinator
    trials = [trial.snapshot() for trial in coordinator.trials.values()]
    assert [shown(t) for t in view.trials] == [shown(t) for t in trials]
    plan = coordinator.plan
    nodes = {node for trial in trials for node, _, _ in trial.segments}
    assert dict(view.configs) == {n: plan.nodes[n].config for n in nodes if n in plan.nodes}
    assert dict(view.trained) == trained_from_plan(plan, nodes)
    assert isinstance(view.configs, MappingProxyType) and isinstance(view.trained, MappingProxyType)
    assert dict(view.report) == coordinator.report()
    assert study.view().configs is None and len(study.view().trials) == len(trials)
    figures = view.figures
    metric, mode = (view.metric, view.mode) if view.metric is not None else metric_of(trials)
    assert (figures.metric, figures.mode) == (metric, mode)
    best = best_of(trials, metric, mode)
    assert (figures.best and shown(figures.best)) == (best and shown(best))
    assert (figures.merge_rate_ended, figures.ended) == merge_rate_so_far(trials)
    assert same_page_figures(figures, trials)
    return view


def same_page_figures(figures, trials) -> bool:
    """Whether the kept status counts, failures and hyper-parameters' names are the summary's."""
    failed = failures(trials)
    first = figures.first_failed
    assert figures.statuses == status_counts(trials)
    assert (figures.failed, first and first.id) == (len(failed), failed[0][0] if failed else None)
    assert figures.hyper_parameters == tuple(sorted({n for t in trials for n in t.config}))
    return True


@pytest.mark.parametrize(("workers", "reuse"), [(1, True), (3, True), (2, False)])
def test_the_kept_view_is_the_one_from_scratch_at_every_pump_of_a_grid(workers, reuse):
    """`reuse` False: the trial-based baseline, each trial on its own path (its report's unique
    steps are counted from the configs)."""
    study = dt.Study(FailsLate, executor=SimulatedExecutor(workers), max_retries=0, reuse=reuse)
    same_as_from_scratch(study)  # before any trial
    handles = [study.submit(config, 8) for config in SPACE]
    study.submit({"lr": 0.1, "batch_size": 32}, 3)  # a prefix of another trial
    coordinator = study.coordinator
    same_as_from_scratch(study)  # submitted, not placed
    coordinator.settle()
    same_as_from_scratch(study)  # placed, nothing delivered
    pumps = 0
    while coordinator.running or coordinator.plan.active:
        coordinator.pump()
        if pumps == 3:
            coordinator.stop(handles[3].id)
            same_as_from_scratch(study)
        completed = [t for t in coordinator.trials.values() if t.status == "completed" and t.steps < 10]
        if pumps >= 6 and completed:  # trained further: seen before it is placed again
            coordinator.extend(completed[0].id, 10)
            same_as_from_scratch(study)
        if pumps == 5:  # a branch off what runs, and a new root
            study.submit({"lr": dt.Steps([0.1, 0.05, 0.2], [2, 6]), "batch_size": 32}, 10)
            study.submit({"lr": 0.7, "batch_size": 16}, 4)
        same_as_from_scratch(study)
        pumps += 1
    statuses = {t.status for t in coordinator.trials.values()}
    assert pumps > 10 and {"failed", "stopped", "completed"} <= statuses
    study.close()


class Checked:
    """A listener that compares the kept view with one from scratch at every result and end
    (inside the coordinator's delivery: the view sees a trial mid-change)."""

    def __init__(self, study: dt.Study):
        self.study, self.checked = study, 0

    def on_result(self, trial, step, metrics) -> None:
        same_as_from_scratch(self.study)
        self.checked += 1

    def on_complete(self, trial) -> None:
        same_as_from_scratch(self.study)

    def on_end(self, trial) -> None:
        same_as_from_scratch(self.study)


@pytest.mark.parametrize("algorithm", ["asha", "median"])
def test_the_kept_view_is_the_one_from_scratch_through_an_algorithm(algorithm):
    """ASHA extends trials (promotions), median stopping stops them."""
    study = dt.Study(SyntheticTrainer, executor=SimulatedExecutor(3))
    checked = Checked(study)
    study.coordinator.listeners.append(checked)
    run_algorithm(study, algorithm)
    assert checked.checked > 20
    same_as_from_scratch(study)
    study.close()


def on(path, workers: int) -> SimulatedExecutor:
    """A simulator whose checkpoints and study storage are at `path`."""
    return SimulatedExecutor(workers, store=CheckpointStore(str(path)))


def test_the_kept_view_is_the_one_from_scratch_in_a_resumed_study(tmp_path):
    """A study opened again on its storage: its trials restored (finished and pending), then
    adopted by the same grid run again (tagged anew) and trained on."""
    configs = [{"lr": dt.Steps([0.1, lr], [3]), "batch_size": 32} for lr in (0.05, 0.01, 0.2)]
    first = dt.Study(SyntheticTrainer, executor=on(tmp_path, 1), name="s")
    for config in configs:
        first.submit(config, 6)
    while first.coordinator.executed_steps < 7:
        first.coordinator.pump()
        same_as_from_scratch(first)
    first.close()
    again = dt.Study(SyntheticTrainer, executor=on(tmp_path, 2), name="s")
    restored = same_as_from_scratch(again)
    assert {t.status for t in restored.trials} >= {"completed", "pending"}
    again.coordinator.listeners.append(Checked(again))
    again.run(GridSearch(configs, "val_loss", "min", steps=6))
    view = same_as_from_scratch(again)
    assert {t.status for t in view.trials} == {"completed"}
    again.close()


def snapshotted_after_one_pump(trials: int) -> int:
    """The trials a view snapshots after one pump of a mid-run grid of `trials` trials on one
    worker (one task's steps: a few trials' results)."""
    study = mid_run_grid(trials)
    coordinator = study.coordinator
    study.view(schedule=True)
    kept = study._kept_view
    first, walks = kept.snapshotted, kept._figures.walks
    assert first == trials  # the first view snapshots them all
    assert study.view(schedule=True).trials is study.view().trials  # nothing changed: the same
    assert kept.snapshotted == first
    coordinator.pump()
    retrained = kept.retrained
    view = same_as_from_scratch(study)
    assert len(view.trials) == trials
    study.close()
    assert kept._figures.walks == walks  # the report's figures: no walk of the trials since
    return kept.snapshotted - first, kept.retrained - retrained


def test_a_view_snapshots_the_trials_that_changed_not_the_study():
    small, large = snapshotted_after_one_pump(50), snapshotted_after_one_pump(500)
    assert small == large, (small, large)
    assert 0 < large[0] <= 10 and 0 < large[1] <= 12


def test_kept_figures_are_the_report_figures_through_random_changes():
    """Trials made, trained on, ended, extended (their end undone), re-placed and moved to a
    private path at random: after each change the kept figures are `report_figures`."""
    rng = random.Random(7)
    paths = [[("a", 0, 4), ("b", 4, 8)], [("a", 0, 4), ("c", 4, 10)], [("d", 0, 6)]]
    trials: dict[int, Trial] = {}
    kept: dict[int, TrialSnapshot] = {}
    figures = KeptFigures(kept)
    ended = 0
    work = {"executed_steps": 5, "gpu_seconds": 2.0, "now": 100.0}
    for change in range(600):
        trial_id = rng.randrange(len(trials) + (len(trials) < 6))
        if trial_id == len(trials):
            trials[trial_id] = Trial(trial_id, {"lr": dt.Constant(0.1)}, 8, submitted_at=rng.randrange(20))
        trial = trials[trial_id]
        what = rng.choices(range(6), weights=[2, 2, 5, 1, 1, 1])[0]  # ends most: all done at times
        if what == 0:
            trial.segments = list(rng.choice(paths))
        elif what == 1:
            trial.reported = rng.randrange(11)
        elif what == 2:
            trial.status, trial.finished_at = rng.choice(["completed", "stopped"]), rng.randrange(50, 90)
        elif what == 3:
            trial.status, trial.finished_at, trial.steps = "pending", None, rng.randrange(1, 11)
        elif what == 4:
            trial.salt = rng.choice(["", "", "", "private"])
        else:  # (no trial's submission moves; the figures would follow it)
            trial.submitted_at = rng.randrange(20)
        old = kept.get(trial_id)
        kept[trial_id] = trial.snapshot()
        figures.change(old, kept[trial_id])
        if change % 3 == 0:  # figures asked now and then: what was kept is patched in between
            assert figures.figures(**work) == report_figures(list(kept.values()), **work), change
            assert figures.merge_rate_ended() == merge_rate_so_far(kept.values()), change
            ended += all(t.done for t in kept.values())
    assert {t.status for t in trials.values()} == {"pending", "completed", "stopped"} and ended > 5


def test_the_page_figures_are_the_summarys_through_random_changes():
    """Trials given final metrics (ties, NaN, infinities, a missing metric), steps, curves and
    every status at random, and the metric and mode asked changed now and then: after each
    change the kept best is `best_of` (its tie rule: completed first, then the longest, then
    the first), the kept guess `metric_of`, and the statuses, failures and names the
    summary's."""
    rng = random.Random(11)
    trials: dict[int, Trial] = {}
    kept: dict[int, TrialSnapshot] = {}
    best = PageFigures(kept)
    asked = ("val_loss", "min")
    values = [0.5, 0.5, 1.0, 2.0, float("nan"), float("inf"), -float("inf")]
    statuses = ["pending", "completed", "stopped", "failed", "diverged"]
    found = set()
    for change in range(800):
        trial_id = rng.randrange(len(trials) + (len(trials) < 8))
        if trial_id == len(trials):
            trials[trial_id] = Trial(trial_id, {"lr": dt.Constant(0.1)}, 8)
        trial = trials[trial_id]
        what = rng.randrange(5)
        if what == 0:
            name = rng.choice(["val_loss", "val_loss", "acc"])
            trial.metrics = {name: rng.choice(values)} if rng.random() < 0.9 else None
        elif what == 1:
            trial.status = rng.choice(statuses)
        elif what == 2:
            trial.steps = rng.choice([4, 8, 8])
        elif what == 3:  # points replaced
            names = rng.choice([("loss",), ("val_acc",), ("val_loss", "acc")])
            trial.curve = [(step, dict.fromkeys(names, 1.0)) for step in range(rng.randrange(3))]
        else:  # points grown
            names = rng.choice([("loss",), ("val_acc",), ("val_loss", "acc")])
            trial.points.append(dt.records.MetricsPoint.of(len(trial.points), dict.fromkeys(names, 1.0)))
            trial.config = rng.choice(
                [{"lr": dt.Constant(0.1)}, {"lr": dt.Constant(0.1), "bs": dt.Constant(2)}]
            )
        old = kept.get(trial_id)
        kept[trial_id] = trial.snapshot()
        best.change(old, kept[trial_id])
        if change % 50 == 0:
            asked = rng.choice([("val_loss", "min"), ("val_loss", "max"), ("acc", "max"), (None, "max")])
        if change % 2 == 0:
            expected = best_of(kept.values(), *asked)
            got = best.best(*asked)
            assert (got and got.id) == (expected and expected.id), change
            found.add(None if got is None else got.status)
            assert best.metric() == metric_of(kept.values()), change
            failed, first = best.failed()
            shown_now = SimpleNamespace(
                statuses=best.statuses(),
                failed=failed,
                first_failed=first,
                hyper_parameters=best.hyper_parameters(),
            )
            assert same_page_figures(shown_now, list(kept.values())), change
    assert {None, "completed", "failed"} <= found
