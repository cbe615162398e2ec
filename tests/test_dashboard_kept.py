"""A feed's snapshot of a running study (`live_snapshot(study, kept=...)`) redoes only what
changed since its last one (`dagtune.dashboard.kept`) and is the snapshot made from scratch at
every moment: a grid with shared prefixes, a failure, a stopped trial, a prefix and a branch
submitted mid-run, and ASHA's promotions and stops. And what it walks after a trial changed
does not grow with the study (a snapshot walked every trial's segments and points and cut
every node each time: about 4 s of CPU at 100,000 trials, perf/RESULTS.md section 9l)."""

from __future__ import annotations

import pytest
from live_study_helpers import SPACE, FailsLate, mid_run_grid, run_algorithm

import dagtune as dt
from dagtune.dashboard import snapshot as snapshots
from dagtune.dashboard.kept import KeptSnapshot
from dagtune.dashboard.snapshot import live_snapshot
from dagtune.sim import SimulatedExecutor, SyntheticTrainer
from dagtune.summary import best_of, failures, merge_rate_so_far, metric_of, status_counts


def same_as_from_scratch(study: dt.Study, kept: KeptSnapshot) -> dict:
    """The feed's snapshot, checked against one made from scratch (their times aside)."""
    incremental = live_snapshot(study, kept=kept)
    scratch = live_snapshot(study)
    incremental.pop("time"), scratch.pop("time")
    for key in scratch:
        assert incremental[key] == scratch[key], key
    assert list(incremental["parents"]) == list(scratch["parents"])  # in the same order
    assert incremental.keys() == scratch.keys()
    trials = study.view().trials  # the figures the page keeps are the summary's
    best = best_of(trials, *metric_of(trials))
    assert incremental["best"] == (None if best is None else scratch["best"])
    assert best is None or incremental["best"]["trial"] == best.id
    counters = incremental["counters"]
    assert (counters["merge_rate_ended"], counters["ended"]) == merge_rate_so_far(trials)
    assert {s: counters[s] for s in status_counts(trials)} == status_counts(trials)
    failed = failures(trials)
    assert incremental["failures"] == {"count": len(failed), "first": list(failed[0]) if failed else None}
    assert incremental["hp"] == sorted({name for t in trials for name in t.config})
    return incremental


@pytest.mark.parametrize("workers", [1, 3])
def test_the_kept_snapshot_is_the_one_from_scratch_at_every_moment_of_a_grid(workers, monkeypatch):
    monkeypatch.setattr(snapshots, "CURVES_SENT", 4)  # the curves chosen, not all of them
    study = dt.Study(FailsLate, executor=SimulatedExecutor(workers), max_retries=0)
    handles = [study.submit(config, 8) for config in SPACE]
    study.submit({"lr": 0.1, "batch_size": 32}, 3)  # a prefix of another trial
    kept = KeptSnapshot()
    coordinator = study.coordinator
    moments, states = 0, set()
    same_as_from_scratch(study, kept)  # before anything ran
    while coordinator.running or coordinator.plan.active:
        coordinator.pump()
        if moments == 3:
            coordinator.stop(handles[3].id)
            same_as_from_scratch(study, kept)
        if moments == 5:  # a branch off what runs, and a new root
            study.submit({"lr": dt.Steps([0.1, 0.05, 0.2], [2, 6]), "batch_size": 32}, 10)
            study.submit({"lr": 0.7, "batch_size": 16}, 4)
        snapshot = same_as_from_scratch(study, kept)
        states.update(snapshot["tree"]["state"])
        moments += 1
    assert moments > 10 and {"done", "running", "queued"} <= states
    statuses = {t.status for t in coordinator.trials.values()}
    assert {"failed", "stopped", "completed"} <= statuses
    assert kept.walked["orders"] < moments  # rows are assigned again only when nodes came
    study.close()


class Checked:
    """A listener that compares the kept snapshot with one from scratch at every result."""

    def __init__(self, study: dt.Study):
        self.study, self.kept, self.checked = study, KeptSnapshot(), 0

    def on_result(self, trial, step, metrics) -> None:
        same_as_from_scratch(self.study, self.kept)
        self.checked += 1

    def on_complete(self, trial) -> None:
        same_as_from_scratch(self.study, self.kept)

    def on_end(self, trial) -> None:
        same_as_from_scratch(self.study, self.kept)


@pytest.mark.parametrize("algorithm", ["asha", "median"])
def test_the_kept_snapshot_is_the_one_from_scratch_through_an_algorithm(algorithm, monkeypatch):
    """At every result and end of ASHA (promotions: trials extended) and median stopping
    (trials stopped)."""
    monkeypatch.setattr(snapshots, "CURVES_SENT", 6)
    study = dt.Study(SyntheticTrainer, executor=SimulatedExecutor(3))
    checked = Checked(study)
    study.coordinator.listeners.append(checked)
    run_algorithm(study, algorithm)
    assert checked.checked > 20
    same_as_from_scratch(study, checked.kept)
    study.close()


def walked_after_one_change(trials: int) -> dict[str, int]:
    """What a feed's snapshot walks after one pump of a mid-run grid of `trials` trials on one
    worker (one task's steps: one trial's results)."""
    study = mid_run_grid(trials)
    coordinator = study.coordinator
    kept = KeptSnapshot()
    live_snapshot(study, kept=kept)
    first = dict(kept.walked)
    assert first["trials"] >= trials and first["nodes"] >= trials // 10  # the first walks them all
    kept.walked.clear()
    coordinator.pump()
    snapshot = live_snapshot(study, kept=kept)
    assert len(snapshot["tree"]["node"]) > trials  # the whole tree is shown
    walked = dict(kept.walked)
    study.close()
    return walked


def test_a_kept_snapshot_walks_what_changed_not_the_study():
    small, large = walked_after_one_change(50), walked_after_one_change(500)
    assert small == large, (small, large)
    assert 0 < large["trials"] <= 10 and 0 < large["nodes"] <= 12 and "orders" not in large
    # the trials looked at (compared with what was kept): the changed ones, told by the view,
    # not every trial (a snapshot compared every trial's segments and points)
    assert 0 < large["looked"] <= 20


def test_the_kept_snapshot_is_the_one_from_scratch_when_other_readers_take_views(monkeypatch):
    """Views other readers take between the feed's (the versions it did not see), more of them
    than a view carries (it looks at every trial again), a view from another study and
    trials given without a view's changes: the feed's snapshot is the one from scratch at
    every pump, and it looks at every trial only where it cannot know which changed."""
    from dagtune.study import _kept_view

    monkeypatch.setattr(_kept_view, "CHANGES_KEPT", 3)
    monkeypatch.setattr(snapshots, "CURVES_SENT", 4)
    study = dt.Study(FailsLate, executor=SimulatedExecutor(2), max_retries=0)
    for config in SPACE:
        study.submit(config, 8)
    coordinator = study.coordinator
    kept = KeptSnapshot()
    same_as_from_scratch(study, kept)
    total, moments, partial, whole = len(coordinator.trials), 0, 0, 0
    while coordinator.running or coordinator.plan.active:
        missed = 1 + moments % 3 if moments != 6 else 5  # views other readers take
        for _ in range(missed):
            coordinator.pump()
            study.view(schedule=moments % 2 == 0)
        if moments == 4:
            study.submit({"lr": 0.7, "batch_size": 16}, 4)  # a trial the feed hears of late
            total += 1
        kept.walked.clear()
        same_as_from_scratch(study, kept)
        if kept.walked["looked"] < 2 * total:  # two parts look: the curves and the tree
            partial += 1
        else:
            whole += 1
        moments += 1
    assert partial > 3 and whole >= 1  # missed 5 > 3 views at moment 6: every trial again
    other = dt.Study(SyntheticTrainer, executor=SimulatedExecutor(1))  # another study's view
    other.submit({"lr": 0.2, "batch_size": 8}, 3)
    other.coordinator.pump()
    kept.walked.clear()
    same_as_from_scratch(other, kept)
    assert kept.walked["looked"] >= 2 * len(other.coordinator.trials)
    kept.walked.clear()
    same_as_from_scratch(study, kept)  # and back: every trial again
    assert kept.walked["looked"] >= 2 * total
    other.close()
    study.close()


def figures_read_after_one_change(trials: int, monkeypatch) -> tuple[int, int]:
    """The trials a feed's snapshot reads for its best trial, live merge rate, status counts and
    failures after one pump of a mid-run grid of `trials` trials on one worker, and the walks
    of every trial."""
    study = mid_run_grid(trials)
    kept = KeptSnapshot()
    first = live_snapshot(study, kept=kept)
    assert first["best"] is not None and first["counters"]["ended"] > 0
    figures, best = study._kept_view._figures, study._kept_view._page
    read, walks = best.read, figures.walks

    def walks_every_trial(*args, **kwargs):
        raise AssertionError("a live snapshot read every trial for its figures")

    monkeypatch.setattr(snapshots, "best_of", walks_every_trial)
    monkeypatch.setattr(snapshots, "merge_rate_so_far", walks_every_trial)
    monkeypatch.setattr(snapshots, "status_counts", walks_every_trial)
    monkeypatch.setattr(snapshots, "failures", walks_every_trial)
    study.coordinator.pump()
    live_snapshot(study, kept=kept)
    monkeypatch.undo()
    same_as_from_scratch(study, kept)
    study.close()
    return best.read - read, figures.walks - walks


def test_a_kept_snapshot_reads_the_changed_trials_for_its_figures(monkeypatch):
    small = figures_read_after_one_change(50, monkeypatch)
    large = figures_read_after_one_change(500, monkeypatch)
    assert small == large, (small, large)
    assert 0 < large[0] <= 10 and large[1] == 0


def test_a_kept_snapshot_starts_again_where_a_trial_was_rewritten():
    """A trial whose points were replaced (not extended) or whose path left a node (a trial
    restored on another node) is not patched: what was kept is made again, and the snapshot
    is still the one from scratch."""
    from dagtune.dashboard.snapshot import compose
    from dagtune.records import Trial

    def trial(i: int, segments: list, values: list[float]) -> Trial:
        made = Trial(i, {"lr": dt.Constant(0.1 * (i + 1))}, 4, segments=segments)
        made.curve = [(step + 1, {"val_loss": v}) for step, v in enumerate(values)]
        made.reported = len(values)
        return made

    def both(trials: list[Trial], kept: KeptSnapshot) -> None:
        parts = {
            "study": "s",
            "identity": "i",
            "source": "live",
            "metric": None,
            "mode": "max",
            "counters": {},
            "configs": {},
            "trained": {"a": 2},
        }
        views = [t.snapshot() for t in trials]
        incremental = compose(trials=views, kept=kept, **parts)
        scratch = compose(trials=views, **parts)
        incremental.pop("time"), scratch.pop("time")
        assert incremental == scratch

    kept = KeptSnapshot()
    trials = [trial(0, [("a", 0, 2), ("b", 2, 4)], [1.0, 0.5]), trial(1, [("a", 0, 2), ("c", 2, 4)], [1.0])]
    both(trials, kept)
    trials[0].curve = [(1, {"val_loss": 3.0}), (2, {"val_loss": 2.0})]  # the same length, new points
    both(trials, kept)
    trials[1].segments = [("d", 0, 4)]  # off nodes a and c
    both(trials, kept)
    assert kept.walked["orders"] == 2  # laid out from scratch again


def test_a_feed_makes_one_snapshot_at_a_time(monkeypatch):
    """The final snapshot (`finish`, from the closing thread) waits for one the publisher's
    thread is making: both change what the feed keeps."""
    import threading
    from types import SimpleNamespace

    from dagtune.dashboard import plugin

    inside, release = [], threading.Event()

    def slow(study, kept):
        inside.append(1)
        release.wait(10)
        inside.pop()
        return {}

    monkeypatch.setattr(plugin, "live_snapshot", lambda study, kept: slow(study, kept))
    study = dt.Study(SyntheticTrainer, executor=SimulatedExecutor(1))
    feed = plugin.SnapshotFeed(study, SimpleNamespace(set_metadata=lambda key, value: None))
    publishing = threading.Thread(target=feed.publish)
    publishing.start()
    while not inside:
        threading.Event().wait(0.01)
    finishing = threading.Thread(target=feed.finish)
    finishing.start()
    finishing.join(0.3)
    assert finishing.is_alive() and len(inside) == 1  # waits: one snapshot at a time
    release.set()
    publishing.join(10), finishing.join(10)
    assert not finishing.is_alive() and inside == []
    monkeypatch.setattr(plugin, "FINISH_WAIT", 0.1)  # a thread that does not let go in time
    release.clear()
    made = []

    def kept_waits(study, kept):
        made.append(kept)
        return slow(study, kept) if kept is feed._kept else {}

    monkeypatch.setattr(plugin, "live_snapshot", kept_waits)
    sent: list[dict] = []
    feed = plugin.SnapshotFeed(study, SimpleNamespace(set_metadata=lambda key, value: sent.append(value)))
    publishing = threading.Thread(target=feed.publish)
    publishing.start()
    while not inside:
        threading.Event().wait(0.01)
    feed.finish()  # from scratch, once its wait is over
    assert len(made) == 2 and made[0] is feed._kept and made[1] is not feed._kept
    assert len(sent) == 1  # the final snapshot
    release.set()
    publishing.join(10)
    assert len(sent) == 1  # the older one the publisher's thread made after it is not sent
    assert not feed.publish(force=True) and len(sent) == 1  # nor any later one
    study.close()


def test_trial_changes_say_what_changed_since_a_version_they_reach():
    """The newest snapshot of each trial changed after the version asked, and None (look at
    every trial) for another keeper, a version they do not reach back to or one ahead."""
    from types import SimpleNamespace

    from dagtune.records import TrialChanges

    old, a, b, newer = (SimpleNamespace(id=i) for i in (1, 1, 2, 1))
    keeper = object()
    changes = TrialChanges(keeper=keeper, version=5, recent=((old,), (a, b), (newer,)))
    assert changes.since(keeper, 5) == {}
    assert changes.since(keeper, 4) == {1: newer}
    assert changes.since(keeper, 3) == {1: newer, 2: b}
    assert changes.since(keeper, 2) == {1: newer, 2: b}
    assert changes.since(keeper, 1) is None  # version 2's changes are no longer carried
    assert changes.since(keeper, 6) is None
    assert changes.since(object(), 4) is None
    assert changes.since(None, 0) is None
