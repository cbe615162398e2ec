"""Snapshots and the tree layout behind every view (simulated executor, fast)."""

from __future__ import annotations

import json
from typing import ClassVar

import pytest

import dagtune as dt
from dagtune import catalog
from dagtune.algos import GridSearch
from dagtune.checkpoints import CheckpointStore
from dagtune.dashboard.snapshot import compose, live_snapshot, result_snapshot, stored_snapshot
from dagtune.dashboard.tree import DONE, TrialPath, layout
from dagtune.gc import GcPolicy
from dagtune.sim import SimulatedExecutor, SyntheticTrainer
from dagtune.summary import pick_metric, readable

SPACE = dt.Grid(
    {
        "lr": [dt.Constant(0.1), dt.MultiStep(0.1, [10, 15], 0.1)],
        "momentum": [0.9, dt.Steps([0.9, 0.5], [6])],
    }
)


def durable_sim_study(path, name="snap", workers=2) -> dt.Study:
    store = CheckpointStore(str(path))
    return dt.Study(
        SyntheticTrainer, name=name, storage=str(path), executor=SimulatedExecutor(workers, store=store)
    )


def test_layout_cuts_paths_at_branches_and_counts_sharing():
    trials = [
        TrialPath(0, [("a", 0, 10)]),
        TrialPath(1, [("a", 0, 4), ("b", 4, 10)]),
        TrialPath(2, [("a", 0, 4), ("c", 4, 8)]),
    ]
    tree = layout(trials, lambda node, start, end: DONE, critical=[("b", 4, 6)])
    pieces = {(p.node, p.start, p.end): p for p in tree.pieces}
    assert set(pieces) == {("a", 0, 4), ("a", 4, 10), ("b", 4, 10), ("c", 4, 8)}
    assert pieces[("a", 0, 4)].trials == 3 and pieces[("a", 4, 10)].trials == 1
    assert [p.critical for p in tree.pieces if p.node == "b"] == [True]
    assert tree.rows["a"] == 0 and sorted(tree.rows.values()) == [0, 1, 2]
    assert sorted(tree.links) == sorted([(4, 0, tree.rows["b"]), (4, 0, tree.rows["c"])])
    assert tree.children("a") == sorted(["b", "c"], key=tree.rows.__getitem__)


def test_readable_forms_and_metric_choice():
    assert readable(dt.Constant(0.5)) == "0.5"
    assert readable(dt.Steps([64, 128], [18])) == "64→128@18"
    assert readable(dt.MultiStep(0.1, [10], 0.1)) == repr(dt.MultiStep(0.1, [10], 0.1))
    assert pick_metric(["loss", "val_loss", "val_acc"]) == ("val_acc", "max")
    assert pick_metric(["loss", "val_loss"]) == ("val_loss", "min")
    assert pick_metric([]) == (None, "max")


def test_live_snapshot_shows_running_queued_and_the_critical_path(tmp_path):
    study = durable_sim_study(tmp_path)
    for config in SPACE:
        study.submit(config, 20)
    study.coordinator.pump()
    snapshot = live_snapshot(study)
    json.dumps(snapshot)  # JSON-ready (and so msgpack-able)
    states = set(snapshot["tree"]["state"])
    assert "running" in states
    assert any(snapshot["tree"]["critical"])
    assert snapshot["counters"]["pending"] == 4 and snapshot["counters"]["running_tasks"] >= 1
    assert max(snapshot["tree"]["trials"]) == 4  # steps 0-6 are everyone's
    result = study.run(GridSearch(SPACE, metric="val_loss", mode="min", steps=20))
    final = live_snapshot(study)
    assert set(final["tree"]["state"]) == {"done"}
    assert final["best"]["value"] == min(t.metrics["val_loss"] for t in study.coordinator.trials.values())
    assert final["metric"] == "val_loss" and final["mode"] == "min"
    assert final["counters"]["executed_steps"] == final["counters"]["unique_steps"]
    assert final["counters"]["gpu_seconds_saved"] > 0
    mine = result_snapshot(result)
    assert mine["tree"]["trials"] and set(mine["tree"]["state"]) == {"done"}
    assert len(mine["curves"]["trial"]) == 4
    study.close()

    stored = catalog.load_study(catalog.open_storage(str(tmp_path)), "snap")
    again = stored_snapshot(stored, "val_loss", "min")
    assert again["tree"] == {**final["tree"], "critical": [False] * len(final["tree"]["node"])}
    assert again["curves"] == final["curves"] and again["best"] == final["best"]
    report = stored.report()
    assert report["trial_steps"] == final["counters"]["trial_steps"]
    assert report["unique_steps"] == report["plan_steps"] == final["counters"]["unique_steps"]


def test_storage_errors_are_one_line(tmp_path):
    with pytest.raises(catalog.StorageError, match="does not exist"):
        catalog.open_storage(str(tmp_path / "nowhere"))
    (tmp_path / "runs").mkdir()
    with pytest.raises(catalog.StorageError, match=r"no study 'x' .*studies there: none"):
        catalog.load_study(catalog.open_storage(str(tmp_path / "runs")), "x")


def test_collecting_garbage_from_storage_keeps_what_the_policy_keeps(tmp_path):
    study = durable_sim_study(tmp_path, "gc")
    study.run(GridSearch(SPACE, metric="val_loss", mode="min", steps=20))
    study.close()
    store = catalog.open_storage(str(tmp_path))
    before = catalog.load_study(store, "gc").report()["checkpoints"]
    dry = catalog.collect_garbage(store, GcPolicy(keep_best=1), dry_run=True)
    assert catalog.load_study(store, "gc").report()["checkpoints"] == before
    (summary,) = catalog.collect_garbage(store, GcPolicy(keep_best=1))
    assert summary == dry[0] and 0 < summary["deleted"] < before
    after = catalog.load_study(store, "gc")  # the drops were journaled
    assert after.report()["checkpoints"] == before - summary["deleted"] == summary["kept"]
    points = {(node, step) for node, step, _ in store.points(after.identity)}
    assert points == {(n.id, s) for n in after.plan.nodes.values() for s in n.checkpoints}


def test_collecting_garbage_from_storage_spares_what_live_studies_lease(tmp_path):
    from dagtune.checkpoint_leases import Leases

    study = durable_sim_study(tmp_path, "gc")
    study.run(GridSearch(SPACE, metric="val_loss", mode="min", steps=20))
    study.close()
    store = catalog.open_storage(str(tmp_path))
    identity = catalog.load_study(store, "gc").identity
    points = {(node, step) for node, step, _ in store.points(identity)}
    leased = sorted(points)[:2]
    live = Leases(store, identity, "a-live-study")  # as a running study of the model holds it
    live.renew(leased)
    nothing = GcPolicy(keep_best=0, keep_latest=False, orphan_seconds=None)
    (summary,) = catalog.collect_garbage(store, nothing)
    assert {(node, step) for node, step, _ in store.points(identity)} == set(leased)
    assert summary["deleted"] == len(points) - 2
    live.release()  # the study closed: its points are no longer needed
    catalog.collect_garbage(store, nothing)
    assert list(store.points(identity)) == []


@pytest.fixture
def scheduler_client():
    """A client of an in-process scheduler (no workers) with Dask's dashboard."""
    from distributed import Client, LocalCluster

    with (
        LocalCluster(
            n_workers=0, processes=False, protocol="tcp://", host="127.0.0.1", dashboard_address="127.0.0.1:0"
        ) as cluster,
        Client(cluster) as client,
    ):
        yield cluster, client


def test_the_scheduler_holds_the_latest_snapshot_per_study(tmp_path, scheduler_client, monkeypatch):
    from dagtune.dashboard import SNAPSHOTS, SnapshotFeed, attach, register, snapshots_on
    from dagtune.dashboard.page import labels

    cluster, client = scheduler_client
    assert register(client)  # the page is served there
    studies = [durable_sim_study(tmp_path / str(i), name="study") for i in range(2)]  # same name
    publishers = [SnapshotFeed(study, client) for study in studies]
    for config in SPACE:
        studies[0].submit(config, 20)
    sent = 0
    for _ in range(30):  # the study moves on: every change is published
        studies[0].coordinator.pump()
        sent += publishers[0].publish()
    publishers[1].publish()
    assert sent >= 10
    held = client.get_metadata(list(SNAPSHOTS))
    keys = {f"study-{s._token}" for s in studies}
    assert set(held) == keys  # one snapshot per study, not one per publication
    latest = held[f"study-{studies[0]._token}"]
    assert latest["counters"]["executed_steps"] == studies[0].coordinator.report()["executed_steps"]
    assert not client.get_events("dagtune-dashboard")  # no event log grows with the study
    shown = snapshots_on(cluster.scheduler)  # what the page reads
    assert set(shown) == keys
    assert sorted(label for _, label in labels(shown)) == sorted(f"study ({s._token})" for s in studies)
    for study in studies:
        study.close()

    monkeypatch.setattr("dagtune.dashboard.plugin.register", lambda client: False)
    other = durable_sim_study(tmp_path / "other", name="unserved")
    other.client = client
    assert attach(other) is None  # no page there: nothing is published
    assert set(client.get_metadata(list(SNAPSHOTS))) == keys
    other.close()


def test_a_snapshot_carries_a_bounded_number_of_curves(monkeypatch):
    """Past `CURVES_SENT` trials with a curve, a snapshot carries the best half and trials
    evenly spaced by id, and says how many trials have one (issue 24: a 100,000-trial page)."""
    from dagtune.dashboard import snapshot as snapshots
    from dagtune.records import Trial

    monkeypatch.setattr(snapshots, "CURVES_SENT", 10)
    trials = []
    for i in range(40):
        trial = Trial(i, {"lr": dt.Constant(0.01 * (i + 1))}, 2, status="completed")
        trial.curve = [(1, {"val_loss": 1.0}), (2, {"val_loss": abs(i - 20) / 10})]
        trial.metrics, trial.reported = trial.curve[-1][1], 2
        trials.append(trial)
    result = type(
        "R",
        (),
        {"records": [t.snapshot() for t in trials], "report": {}, "metric": "val_loss", "mode": "min"},
    )()
    shown = result_snapshot(result)
    curves = shown["curves"]
    assert shown["curves_total"] == 40 and len(curves["trial"]) == 10
    assert {18, 19, 20, 21, 22} <= set(curves["trial"])  # the best five (lowest val_loss)
    assert curves["trial"] == sorted(curves["trial"]) and len(set(curves["trial"])) == 10


def test_a_publisher_spends_at_most_a_tenth_of_the_time_publishing():
    """A large study's snapshot takes longer than the publisher's second (0.5 s of CPU at 10,000
    trials): the publisher then waits nine times as long as its round took."""
    from types import SimpleNamespace

    from dagtune.execution.dask import Publisher

    publisher = Publisher(SimpleNamespace(name="big"), [], interval=1.0)
    assert publisher.pause_after(0.02) == 1.0  # a small study's page: every second
    for busy in (0.5, 2.0, 20.0):
        pause = publisher.pause_after(busy)
        assert busy / (busy + pause) == pytest.approx(0.1)


class CountedSpan(tuple):
    """A ``(node, start, end)`` span that counts how often it is read (unpacked)."""

    reads: ClassVar[list[int]] = [0]

    def __iter__(self):
        CountedSpan.reads[0] += 1
        return super().__iter__()


def test_the_tree_reads_each_running_and_queued_span_a_fixed_number_of_times():
    """The layout's pieces look up their node's spans: however many pieces the tree has, a
    span is read twice (grouped by node, and for the pieces' boundaries); it was read once
    for every piece."""
    from dagtune.sim import SimulatedExecutor, SyntheticTrainer

    reads = {}
    for width in (4, 16):
        study = dt.Study(SyntheticTrainer, executor=SimulatedExecutor(2))
        for k in range(width):
            study.submit({"lr": dt.Steps([0.1, 0.01 * (k + 1)], [3]), "batch_size": 32}, 8)
        study.coordinator.pump()
        view = study.view(schedule=True)
        running = [CountedSpan(span) for span in view.schedule.running]
        queued = [CountedSpan(span) for span in view.schedule.queued]
        CountedSpan.reads[0] = 0
        snapshot = compose(
            study="s",
            identity="i",
            source="live",
            trials=list(view.trials),
            metric="val_loss",
            mode="min",
            counters={},
            configs=view.configs,
            trained=view.trained,
            running=running,
            queued=queued,
            importance=False,
        )
        assert len(snapshot["tree"]["node"]) > width  # a piece per trial at least
        reads[width] = (CountedSpan.reads[0], len(running) + len(queued))
    assert all(n > 0 and count == 2 * n for count, n in reads.values()), reads


def test_a_running_study_labels_only_the_nodes_new_since_its_last_snapshot(monkeypatch):
    """A node's label depends on its config and its parent's, which never change, so the
    labels a feed kept are reused: the next snapshot labels only the new nodes, and its tree
    reads the same as one labelled from scratch (issue 24: a 10,000-trial page spent a
    quarter of its time writing the same labels every second)."""
    from dagtune.dashboard import snapshot as snapshots

    made = []
    label = snapshots._label
    monkeypatch.setattr(snapshots, "_label", lambda config, parent: made.append(1) or label(config, parent))
    study = dt.Study(SyntheticTrainer, executor=SimulatedExecutor(2))
    for k in range(6):
        study.submit({"lr": dt.Steps([0.1, 0.01 * (k + 1)], [3]), "batch_size": 32}, 8)
    study.coordinator.pump()
    kept: dict = {}
    first = live_snapshot(study, kept)
    assert len(made) == len(kept) == len(set(first["tree"]["node"]))
    made.clear()
    again = live_snapshot(study, kept)
    assert made == [] and again["tree"] == first["tree"]  # nothing new: no label made
    for k in range(3):
        study.submit({"lr": dt.Steps([0.1, 0.5 * (k + 1)], [3]), "batch_size": 64}, 8)
    study.coordinator.pump()
    made.clear()
    later = live_snapshot(study, kept)
    new_nodes = set(later["tree"]["node"]) - set(first["tree"]["node"])
    assert len(made) == len(new_nodes) > 0
    assert later["tree"] == live_snapshot(study)["tree"]  # the same as labelled from scratch
