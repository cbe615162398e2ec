"""Durability on local disk and on a loopback S3 endpoint: journals, resume, several studies
of one model, corrupt checkpoints and journals, failing trainers, checkpoint GC.

Studies here run on the simulated executor with a real `CheckpointStore`, so everything a
Dask study would keep is kept in the same storage, but in virtual time. The process- and
worker-killing tests are in `test_durability_kill.py`.
"""

from __future__ import annotations

import json
import logging
import math
import threading

import pytest
import torch
import zarr
from durable_helpers import SECRET

import dagtune as dt
from dagtune.algos import GridSearch
from dagtune.checkpoints import CheckpointStore
from dagtune.config import config_dumps, config_to_json, normalize_config
from dagtune.durable import records_header
from dagtune.events import TaskFailed
from dagtune.gc import GcPolicy
from dagtune.plan import SearchPlan
from dagtune.plan._journal import Journal, PlanJournal, encode_line
from dagtune.records import CheckpointInfo
from dagtune.results import open_results
from dagtune.sim import SimulatedExecutor, SyntheticTrainer
from dagtune.study import Study, TrialError, run_alone

STEPS = 12
SPACE = dt.Grid(
    {
        "lr": [dt.Constant(0.1), dt.MultiStep(0.1, [6], 0.1)],
        "batch_size": [128, dt.Steps([128, 256], [9])],
    }
)


def study_on(
    storage, name: str = "study", trainer=SyntheticTrainer, kwargs=None, workers: int = 2, **options
):
    store = CheckpointStore(storage.url, storage.options)
    executor = SimulatedExecutor(workers, store=store)
    return Study(trainer, kwargs, name=name, executor=executor, **options)


def final(config, steps: int) -> dict:
    return run_alone(SyntheticTrainer, config, steps)[-1]


def settle(study: Study) -> None:
    """Let tasks whose results are in finish (in virtual time a run returns before their
    end events, and GC never deletes what a running task may need)."""
    while study.coordinator.running:
        study.coordinator.pump()


def stored_points(study: Study) -> set[tuple[str, int]]:
    return {(node, step) for node, step, _ in study.store.points(study.identity)}


def plan_points(plan: SearchPlan) -> set[tuple[str, int]]:
    return {(n.id, s) for n in plan.nodes.values() for s in n.checkpoints}


# --------------------------------------------------------------------------- persistence


def test_a_second_study_trains_only_what_the_first_did_not(storage):
    a_configs = list(SPACE)
    # B: half of A's configs again, and half new ones sharing A's prefixes up to step 6
    b_configs = a_configs[::2] + [{**c, "lr": dt.MultiStep(0.1, [6], 0.5)} for c in a_configs[::2]]
    with study_on(storage, "a", checkpoint_every=4) as a:
        res_a = a.run(GridSearch(a_configs, metric="val_loss", mode="min", steps=STEPS))
        assert res_a.report["executed_steps"] == res_a.report["unique_steps"]
    with study_on(storage, "b", checkpoint_every=4) as b:
        res_b = b.run(GridSearch(b_configs, metric="val_loss", mode="min", steps=STEPS))
        union = dt.unique_steps((c, STEPS) for c in a_configs + b_configs)
        assert res_b.report["executed_steps"] == union - res_a.report["unique_steps"] > 0
        by_config = {config_dumps(t.config): t.metrics for t in a.coordinator.trials.values()}
        for trial in b.coordinator.trials.values():
            assert trial.metrics == final(trial.config, STEPS)
            if config_dumps(trial.config) in by_config:
                assert trial.metrics == by_config[config_dumps(trial.config)]
        executed = b.report["executed_steps"]
        assert b.evaluate(a_configs[1], STEPS) == final(a_configs[1], STEPS)  # A's, costs nothing
        assert b.evaluate(a_configs[1], 5) == final(a_configs[1], 5)
        assert b.report["executed_steps"] == executed
        assert b.incidents == []


def test_running_a_study_again_resumes_it(storage):
    configs = list(SPACE)
    with study_on(storage, "resume", checkpoint_every=3) as first:
        handles = [first.submit(c, STEPS) for c in configs[:2]]
        for handle in handles:
            handle.result()
        late = [first.submit(c, STEPS) for c in configs[2:]]
        target = first.coordinator.executed_steps + 8
        while first.coordinator.executed_steps < target:
            first.coordinator.pump()  # part of the late trials, then stop mid-way
        assert any(h.status == "pending" for h in late)
        done_before = first.coordinator.executed_steps
    with study_on(storage, "resume", checkpoint_every=3) as again:
        trials = again.trials
        assert [t.id for t in trials] == [0, 1, 2, 3]
        assert [t.status for t in trials[:2]] == ["completed", "completed"]
        assert trials[0].result() == final(configs[0], STEPS)  # from storage, at once
        assert again.coordinator.executed_steps == 0
        result = again.run(GridSearch(configs, metric="val_loss", mode="min", steps=STEPS))
        assert [t.id for t in result._trials] == [0, 1, 2, 3]  # the restored trials, adopted
        for trial in again.coordinator.trials.values():
            assert trial.status == "completed" and trial.metrics == final(trial.config, STEPS)
        total = done_before + again.coordinator.executed_steps
        unique = dt.unique_steps((c, STEPS) for c in configs)
        assert unique <= total <= unique + 2 * 3  # at most what was in flight, per worker
    from dagtune.catalog import load_study

    stored = load_study(CheckpointStore(storage.url, storage.options), "resume").report()
    assert stored["executed_steps"] == total  # each session recorded its own work
    frame = open_results(storage.url, "resume", storage.options).trials
    assert list(frame["status"]) == ["completed"] * 4
    assert list(frame["val_loss"]) == [final(c, STEPS)["val_loss"] for c in configs]


def test_the_same_study_name_with_another_model_is_refused(storage):
    with study_on(storage, "named") as first:
        first.submit({"lr": 0.1}, 2).result()
    with pytest.raises(ValueError, match="belongs to another model"):
        study_on(storage, "named", kwargs={"dim": 4})


@pytest.mark.parametrize(
    "changed", [{"kwargs": {"dim": 4}}, {"seed": 1}, {"version": "v2"}], ids=["kwargs", "seed", "version"]
)
def test_another_model_identity_shares_nothing(storage, changed):
    config = next(iter(SPACE))
    with study_on(storage, "base", checkpoint_every=4) as base:
        base.submit(config, 8).result()
    with study_on(storage, "other", checkpoint_every=4, **changed) as other:
        assert other.identity != base.identity
        assert len(other.plan.nodes) == 0  # a plan of its own, empty
        other.submit(config, 8).result()
        assert other.report["executed_steps"] == 8  # trained again: another model
    with study_on(storage, "same", checkpoint_every=4) as same:  # the first identity again
        assert same.evaluate(config, 8) == final(config, 8)
        assert same.report["executed_steps"] == 0


@pytest.mark.parametrize("name", ["../../x", "a/b", "..", "", ".hidden", "x" * 129, "a b"])
def test_a_study_name_can_never_leave_the_storage_root(storage, name):
    with pytest.raises(ValueError, match="name must be 1-128 letters"):
        study_on(storage, name)
    fs, root = storage.fs()
    assert not fs.exists(root) or fs.find(root) == []  # refused before anything was written


def test_an_unreadable_trial_record_is_reported_and_the_rest_resumes(storage):
    with study_on(storage, "records") as first:
        first.submit({"lr": 0.1}, 3).result()
        directory = f"{first.store.root}/studies/records/journal"
    fs, _ = storage.fs()
    forger = Journal(fs, directory, header=records_header("records"))
    forger.append({"r": "submit", "trial": 7, "steps": 2}, sync=True)  # no config
    with study_on(storage, "records") as again:
        assert [t.status for t in again.trials] == ["completed"]
        (incident,) = again.incidents  # reported with its place, as a bad checksum is
        assert f"{directory}/{forger.writer}" in incident
        assert ".jsonl:2: unreadable trial record (submit record has no field 'config')" in incident


def test_results_are_a_zarr_group_with_learning_curves(storage):
    configs = list(SPACE)[:3]
    with study_on(storage, "zarr", eval_every=2) as study:
        study.run(GridSearch(configs, metric="val_loss", mode="min", steps=6))
    group = zarr.open_group(
        f"{storage.url}/studies/zarr/results.zarr", mode="r", storage_options=storage.options or None
    )
    assert list(group["trial_id"][:]) == [0, 1, 2]
    assert list(group["status"][:]) == ["completed"] * 3
    assert list(group["steps"][:]) == [6] * 3
    curve = group[f"curve/{group.attrs['metrics']['val_loss']}"][:]
    assert curve.shape == (3, 6)
    for row, config in zip(curve, configs):
        alone = run_alone(SyntheticTrainer, config, 6)
        assert list(row[1::2]) == [alone[s]["val_loss"] for s in (1, 3, 5)]  # evaluated every 2
        assert all(v != v for v in row[0::2])  # NaN: not evaluated
    results = open_results(storage.url, "zarr", storage_options=storage.options)
    assert results.curve("val_acc").shape == (3, 6)
    assert json.loads(results.trials["config"][0]) == json.loads(config_dumps(normalize_config(configs[0])))


def test_two_studies_at_once_on_one_storage_share_and_never_corrupt_it(storage):
    configs = list(SPACE)
    errors = []
    written: dict[str, tuple[dict, set]] = {}

    def run(name: str, mine: list) -> None:
        try:
            with study_on(storage, name, checkpoint_every=2, refresh_seconds=0.0) as study:
                study.run(GridSearch(mine, metric="val_loss", mode="min", steps=STEPS))
                for trial in study.coordinator.trials.values():
                    assert trial.metrics == final(trial.config, STEPS)
                nodes = {n.id: config_dumps(n.config) for n in study.plan.nodes.values()}
                written[name] = (nodes, plan_points(study.plan))
        except BaseException as error:  # surfaced below
            errors.append(error)

    threads = [threading.Thread(target=run, args=(f"c{i}", configs[i:] + configs[:i])) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors, errors
    with study_on(storage, "reader") as reader:
        assert reader.incidents == []
        plan = reader.plan
        # the merged plan is the union of what both wrote, nothing lost and nothing invented
        # (studies this fast each create their own roots before seeing the other's: equal-
        # valued siblings, which the plan tolerates and matches by the longest agreement)
        assert set(plan.nodes) == set(written["c0"][0]) | set(written["c1"][0])
        assert plan_points(plan) == written["c0"][1] | written["c1"][1]
        for name, (nodes, _) in written.items():
            for node_id, config in nodes.items():
                assert config_dumps(plan.nodes[node_id].config) == config, name
        for node, step in plan_points(plan):  # every checkpoint either study recorded loads
            reader.store.load(reader.identity, node, step)
        assert plan_points(plan) <= stored_points(reader)
        result = reader.run(GridSearch(configs, metric="val_loss", mode="min", steps=STEPS))
        assert result.report["executed_steps"] == 0  # both studies' work is known


# --------------------------------------------------------------------------- faults


def corrupt(storage, study: Study, point: tuple[str, int], how: str) -> None:
    """Damage the checkpoint at `point` in one of the ways the store must detect."""
    fs, _ = storage.fs()
    directory = study.store.directory(study.identity, *point)
    marker = f"{directory}/COMMIT"
    data = f"{directory}/{json.loads(fs.cat_file(marker))['file']}"
    if how == "missing marker":
        fs.rm_file(marker)
    elif how == "bad checksum":
        raw = bytearray(fs.cat_file(data))
        raw[len(raw) // 2] ^= 0xFF
        fs.pipe_file(data, bytes(raw))
    elif how == "truncated":
        fs.pipe_file(data, fs.cat_file(data)[:100])
    elif how == "malformed marker":
        fs.pipe_file(marker, b'{"format": 1, "file": ')
    elif how in ("empty state", "bad RNG state"):  # committed, intact, not a training state
        state = study.store.load(study.identity, *point)
        study.store.delete(study.identity, *point)
        state = {} if how == "empty state" else {**state, "rng": {**state["rng"], "torch": torch.zeros(3)}}
        study.store.save(study.identity, *point, state)
    fs.invalidate_cache(directory)


@pytest.mark.parametrize(
    "how", ["missing marker", "bad checksum", "truncated", "malformed marker", "empty state", "bad RNG state"]
)
def test_a_corrupt_checkpoint_is_never_loaded_but_detected_and_recomputed(storage, how):
    base = {"lr": dt.Steps([0.1, 0.05], [8]), "batch_size": 128}
    branch = {"lr": dt.Steps([0.1, 0.02], [8]), "batch_size": 128}
    with study_on(storage, "corrupt", checkpoint_every=4) as study:
        study.submit(base, 10).result()
        point = (study.plan.locate(normalize_config(base), 8), 8)
        assert point in plan_points(study.plan)
        corrupt(storage, study, point, how)
        executed = study.report["executed_steps"]
        assert study.submit(branch, 10).result() == final(branch, 10)
        # the branch point was recomputed from the checkpoint at 4, then the branch trained
        assert study.report["executed_steps"] - executed == (8 - 4) + 2
        assert any("corrupt checkpoint" in i and f"{point[0]}, 8" in i for i in study.incidents)
        study.store.load(study.identity, *point)  # recomputed and saved again, intact
        failed = [t for t in study.coordinator.trials.values() if t.status != "completed"]
        assert failed == []  # not a trainer failure


def journal_dir(study: Study) -> str:
    return f"{study.store.root}/{study.identity}/plan"


def test_corrupt_and_foreign_journal_lines_are_reported_with_their_place_and_skipped(storage):
    config = {"lr": dt.Steps([0.1, 0.05], [4]), "batch_size": 128}
    with study_on(storage, "journal", checkpoint_every=2) as study:
        study.submit(config, 6).result()
        identity = study.identity
        directory = journal_dir(study)
        good = plan_points(study.plan)
    fs, _ = storage.fs()
    # the journal file (a segment, on S3) with the most metrics events
    path = max(fs.ls(directory, detail=False), key=lambda p: fs.cat_file(p).count(b'"e":"metrics"'))
    lines = fs.cat_file(path).splitlines(keepends=True)
    metrics_line = max(i for i, line in enumerate(lines) if b'"e":"metrics"' in line)
    flipped = bytearray(lines[metrics_line])
    flipped[flipped.index(b'"step":') + 7] ^= 0x01  # a changed digit: the checksum must catch it
    lines[metrics_line] = bytes(flipped)
    lines.insert(1, b'{"e": "node", "id": "0000000000000000"}\n')  # foreign: no format tag
    forged = {
        "e": "node",
        "id": "ffffffffffffffff",
        "parent": None,
        "start": 0,
        "config": config_to_json(normalize_config({"lr": 0.5})),
    }
    lines.insert(2, encode_line(forged))  # well-formed, but its id does not match its content
    fs.pipe_file(path, b"".join(lines) + b'dj1 0badc0de {"e": ')  # ends in a cut-short line
    fs.invalidate_cache(directory)
    plan = SearchPlan()
    loader = PlanJournal(plan, Journal(fs, directory))
    loader.load()
    incidents = loader.journal.incidents
    assert any(f"{path}:2: not a dagtune journal line" in i for i in incidents)
    assert any(f"{path}:3: invalid search plan event" in i and "does not match" in i for i in incidents)
    assert any(f"{path}:{metrics_line + 3}: checksum mismatch" in i for i in incidents)
    assert any(f"{path}:{len(lines) + 1}: incomplete last line" in i for i in incidents)
    assert len(incidents) == 4
    assert plan_points(plan) == good  # every intact event was applied
    with study_on(storage, "journal") as reopened:  # a study reports them too, and works
        assert reopened.identity == identity
        assert len(reopened.incidents) == 4
        assert reopened.evaluate(config, 6) == final(config, 6)


def test_a_journal_file_of_another_model_is_refused_whole_and_reported(storage):
    config = {"lr": dt.Steps([0.1, 0.05], [4]), "batch_size": 128}
    with study_on(storage, "mine") as mine:
        mine.submit(config, 6).result()
        known = plan_points(mine.plan)
    with study_on(storage, "theirs", kwargs={"dim": 4}) as theirs:  # another model identity
        theirs.submit(config, 6).result()
    foreign = max(storage.fs()[0].ls(journal_dir(theirs), detail=False))  # committed by closing
    fs, _ = storage.fs()
    copied = f"{journal_dir(mine)}/{'f' * 32}.jsonl"
    fs.pipe_file(copied, fs.cat_file(foreign))  # well-formed lines, checksums and all
    bad_field = {"e": "metrics", "node": next(iter(known))[0], "step": "6", "metrics": {"val_loss": 1.0}}
    fs.pipe_file(
        f"{journal_dir(mine)}/{'e' * 32}.jsonl",
        b"".join(
            [encode_line({"h": {"journal": "plan", "identity": mine.identity}}), encode_line(bad_field)]
        ),
    )
    fs.invalidate_cache(journal_dir(mine))
    with study_on(storage, "mine") as again:
        assert plan_points(again.plan) == known  # nothing of the other model came in
        assert any(copied in i and "a file of another journal" in i for i in again.incidents)
        assert any(
            "metrics event field 'step' must be a step from 1 to " in i and "got '6'" in i
            for i in again.incidents
        )
        assert again.evaluate(config, 6) == final(config, 6)
        assert again.report["executed_steps"] == 0


def test_reading_a_study_writes_nothing_and_trial_based_trials_resume_with_their_curves(storage):
    from dagtune.catalog import load_study

    configs = list(SPACE)[:2]
    with study_on(storage, "alone", reuse=False) as study:
        for config in configs:
            study.submit(config, 4).result()
        curves = [t.curve() for t in study.trials]
    fs, _ = storage.fs()
    files = sorted(fs.find(study.store.root))
    stored = load_study(study.store, "alone")
    assert [[(k - 1, m) for k, m in t.curve] for t in stored.trials] == curves  # steps from 0
    fs.invalidate_cache(study.store.root)
    assert sorted(fs.find(study.store.root)) == files  # `dagtune status` and friends only read
    with study_on(storage, "alone", reuse=False) as again:
        assert [t.curve() for t in again.trials] == curves
        assert again.submit(configs[0], 4).result() == curves[0][-1][1]  # the restored trial
        assert again.report["executed_steps"] == 0 and len(again.trials) == 2


def test_journals_of_several_writers_merge_whatever_order_events_arrive_in(storage):
    fs, root = storage.fs()
    directory = f"{root}/journal-merge"
    builder = SearchPlan()
    builder.locate(normalize_config({"lr": 0.1}), 6, create=True)
    child = builder.locate(normalize_config({"lr": dt.Steps([0.1, 0.01], [3])}), 6, create=True)
    events = []
    builder.listeners.append(events.append)
    builder.record_checkpoint(child, 6, CheckpointInfo(10, "ab" * 32))
    root_event, child_event = (
        {"e": "node", "id": n.id, "parent": n.parent, "start": n.start, "config": config_to_json(n.config)}
        for n in builder.nodes.values()
    )
    late, early = Journal(fs, directory), Journal(fs, directory)
    early.append(events[0])  # the child's checkpoint, written first, by a writer that never saw the node
    early.append(child_event)
    early.flush()
    late.append(root_event)
    late.flush()
    fs.pipe_file(f"{directory}/notes.txt", b"not a journal")
    plan = SearchPlan()
    loader = PlanJournal(plan, Journal(fs, directory))
    loader.load()
    assert set(plan.nodes) == set(builder.nodes)
    assert plan.nodes[child].checkpoints == {6: CheckpointInfo(10, "ab" * 32)}
    assert loader.journal.incidents == [f"{directory}/notes.txt: not a journal file of this format; ignored"]


class Exploding(SyntheticTrainer):
    """Raises in every step after `fail_at` when its learning rate drops to 0.01."""

    def __init__(self, fail_at: int = 3, **kwargs):
        super().__init__(**kwargs)
        self.fail_at = fail_at

    def train(self):
        if self.step >= self.fail_at and self.hp["lr"] == 0.01:
            raise RuntimeError("exploded on purpose")
        return super().train()


def test_failed_and_diverged_trials_are_kept_with_their_reason(storage):
    bad = {"lr": dt.Steps([0.1, 0.01], [3])}
    wild = {"lr": dt.Steps([0.1, 80.0], [2])}  # its loss overflows after about 10 steps
    good = {"lr": dt.Steps([0.1, 0.05], [3])}
    with study_on(storage, "faults", trainer=Exploding, max_retries=2) as study:
        errors = []
        handle = study.coordinator.handle
        study.coordinator.handle = lambda event: (
            errors.append((event.node, event.step)) if isinstance(event, TaskFailed) else None,
            handle(event),
        )
        handles = [study.submit(c, n) for c, n in ((bad, 8), (wild, 30), (good, 8))]
        with pytest.raises(TrialError, match="exploded on purpose"):
            handles[0].result()
        assert errors == [(handles[0].trial.node, 4)] * 3  # the first try and two retries
        assert handles[2].result() == final(good, 8)
        handles[1].result()
        assert [h.status for h in handles[1:]] == ["diverged", "completed"]
        wild_trial = handles[1].trial
        assert wild_trial.reported < 30 and not all(map(math.isfinite, wild_trial.metrics.values()))
        assert study.report["executed_steps"] < 30  # stopped where it diverged
    with study_on(storage, "faults", trainer=Exploding) as again:
        restored = again.trials
        assert [t.status for t in restored] == ["failed", "diverged", "completed"]
        assert "exploded on purpose" in restored[0].trial.error and "Traceback" in restored[0].trial.error
    frame = open_results(storage.url, "faults", storage.options).trials
    assert list(frame["status"]) == ["failed", "diverged", "completed"]
    assert "RuntimeError: exploded on purpose" in frame["error"][0]


def study_records(storage, name: str):
    from dagtune.durable import read_records

    fs, root = storage.fs()
    return read_records(Journal(fs, f"{root}/studies/{name}/journal", header=records_header(name)))


@pytest.mark.parametrize("failing", ["results", "plan refresh"])
def test_closing_writes_the_records_and_releases_the_lease_whatever_failed_before(storage, failing):
    study = study_on(storage, "closing")
    handle = study.submit({"lr": 0.1}, 4)
    handle.result()
    fs, root = storage.fs()
    leases = f"{root}/{study.identity}/leases"
    assert fs.find(leases)  # the study holds a lease while it lives

    def fail(*args):
        raise RuntimeError(f"{failing} failed on purpose")

    if failing == "results":
        study._persistence.results.write = fail
    else:
        study._persistence.plan_journal.refresh = fail
    with pytest.raises(RuntimeError, match="failed on purpose"):
        study.close()
    fs.invalidate_cache(leases)
    assert fs.find(leases) == []  # released
    records = study_records(storage, "closing")
    assert records.trials[0].status == "completed"
    assert records.work_total()["executed_steps"] == 4  # what this session trained
    with study_on(storage, "closing") as again:  # and the study resumes
        assert again.trials[0].result() == final({"lr": 0.1}, 4)


# --------------------------------------------------------------------------- garbage collection


def test_gc_keeps_only_what_the_policy_keeps_and_deleted_points_are_recomputed(storage):
    configs = list(SPACE)
    with study_on(storage, "gc", checkpoint_every=2) as study:
        study.run(GridSearch(configs, metric="val_loss", mode="min", steps=STEPS))
        settle(study)
        before = stored_points(study)
        outcome = study.gc(GcPolicy(keep_best=1, keep_latest=False))
        best = min(study.coordinator.trials.values(), key=lambda t: t.metrics["val_loss"])
        assert stored_points(study) == plan_points(study.plan) == {(best.node, STEPS)}
        assert outcome["deleted"] == len(before) - 1
        assert outcome["bytes_after"] < outcome["bytes_before"]
        print(f"gc: {len(before)} checkpoints, {outcome['bytes_before']} B -> 1, {outcome['bytes_after']} B")
        # a later trial branching at a deleted point recomputes it (from scratch here)
        other = next(c for c in configs if config_dumps(normalize_config(c)) != config_dumps(best.config))
        later = {**other, "lr": dt.Steps([0.1, 0.3], [5])}
        executed = study.report["executed_steps"]
        assert study.submit(later, 8).result() == final(later, 8)
        assert study.report["executed_steps"] - executed == 8


def test_gc_with_a_budget_evicts_the_cheapest_to_recompute_and_never_what_runs(storage):
    long = {"lr": 0.1, "batch_size": 128}
    short = {"lr": dt.Steps([0.1, 0.3], [2]), "batch_size": 128}
    with study_on(storage, "budget", checkpoint_every=2, workers=1) as study:
        study.submit(long, 10).result()
        study.submit(short, 4).result()
        settle(study)
        ends = {(study.plan.locate(normalize_config(c), n), n) for c, n in ((long, 10), (short, 4))}
        size = max(study.plan.nodes[n].checkpoints[s].nbytes for n, s in ends)
        # keep_latest wants both trials' ends; a budget of one checkpoint evicts the end of the
        # short trial: 4 steps to recompute against 10
        outcome = study.gc(GcPolicy(keep_best=0, budget_bytes=size))
        assert stored_points(study) == {(study.plan.locate(normalize_config(long), 10), 10)}
        assert outcome["bytes_after"] <= size
        # a running task's points are never deleted, even with nothing allowed
        branch = {"lr": dt.Steps([0.1, 0.01], [10]), "batch_size": 128}
        handle = study.submit(branch, 30)
        while study.coordinator.executed_steps < 10 + 4 + 7:
            study.coordinator.pump()
        protected = study.coordinator.protected_points() & stored_points(study)
        assert protected  # the task's source (long, 10) and the checkpoints it wrote so far
        study.gc(GcPolicy(keep_best=0, keep_latest=False, budget_bytes=0))
        assert protected <= stored_points(study)
        assert handle.result() == final(branch, 30)


def test_gc_with_a_budget_evicts_in_order_of_recompute_cost(storage):
    trials = [
        ({"lr": 0.1, "batch_size": 128}, 10),
        ({"lr": 0.2, "batch_size": 128}, 4),
        ({"lr": 0.3, "batch_size": 128}, 7),
    ]
    with study_on(storage, "budget3", checkpoint_every=2, workers=1) as study:
        for config, steps in trials:
            study.submit(config, steps).result()
        settle(study)
        ends = [(study.plan.locate(normalize_config(c), n), n) for c, n in trials]
        size = max(study.plan.nodes[n].checkpoints[s].nbytes for n, s in ends)
        assert len(stored_points(study)) == 5 + 2 + 4  # every second step and each last step
        # keep_latest wants the three ends; each budget keeps the dearest ones to recompute
        for budget, kept in ((3, {0, 1, 2}), (2, {0, 2}), (1, {0}), (0, set())):
            outcome = study.gc(GcPolicy(keep_best=0, budget_bytes=budget * size))
            assert stored_points(study) == {ends[i] for i in kept}, budget
            assert outcome["bytes_after"] <= budget * size
        # what was evicted is recomputed on demand, from scratch here
        assert study.evaluate(*trials[1]) == final(*trials[1])
        assert study.report["executed_steps"] == 10 + 4 + 7  # known metrics: nothing retrained
        assert study.submit({"lr": dt.Steps([0.2, 0.02], [4]), "batch_size": 128}, 6).result()
        assert study.report["executed_steps"] == 10 + 4 + 7 + 6


def test_gc_of_one_study_never_deletes_what_other_studies_of_the_model_need(storage):
    configs = list(SPACE)
    with study_on(storage, "a", checkpoint_every=2) as a:
        a.run(GridSearch(configs[:2], metric="val_loss", mode="min", steps=STEPS))
        settle(a)
        a_finals = {(t.node, STEPS) for t in a.coordinator.trials.values()}
    # study a is closed: its completed trials' finals are kept for it (they may be extended)
    with study_on(storage, "b", checkpoint_every=2) as b:
        b.run(GridSearch(configs[2:], metric="val_loss", mode="min", steps=STEPS))
        settle(b)
        b.gc(GcPolicy(keep_best=0, keep_latest=False))
        assert a_finals <= stored_points(b)
        assert stored_points(b) == a_finals  # b's own checkpoints went, as its policy says
        # a live study's lease protects what its running task needs
        with study_on(storage, "c", checkpoint_every=2, workers=1) as c:
            branch = {**configs[0], "lr": dt.Steps([0.1, 0.01], [STEPS])}
            handle = c.submit(branch, 2 * STEPS)
            while c.coordinator.executed_steps < 3:
                c.coordinator.pump()
            c._tick(force=True)  # the driver loop's periodic lease renewal
            needed = c.coordinator.protected_points() & stored_points(c)
            assert needed  # the task's source (a's final) and its first checkpoint
            b.gc(GcPolicy(keep_best=0, keep_latest=False, budget_bytes=0))
            assert needed <= stored_points(b)
            assert handle.result() == final(branch, 2 * STEPS)
        fs = storage.fs()[0]
        fs.invalidate_cache(c._persistence.leases.directory)
        assert not fs.exists(c._persistence.leases.path)  # released on close
        assert fs.exists(b._persistence.leases.path)  # b still lives


def test_gc_sweeps_checkpoint_files_no_plan_knows_once_they_are_old_enough(storage):
    with study_on(storage, "orphans", checkpoint_every=2) as study:
        study.submit({"lr": 0.1, "batch_size": 128}, 4).result()
        settle(study)
        known_end = max(plan_points(study.plan), key=lambda p: p[1])
        orphan = ("0123456789abcdef", 3)  # committed by a coordinator that died before journaling
        study.store.save(study.identity, *orphan, {"w": [1.0]})
        fs, _ = storage.fs()
        unfinished = study.store.directory(study.identity, "fedcba9876543210", 5)
        fs.makedirs(unfinished, exist_ok=True)
        fs.pipe_file(f"{unfinished}/state-0000000000000000.pt", b"half a checkpoint")  # never committed
        assert study.gc(GcPolicy(keep_best=0))["swept"] == 0  # too young to be sure
        assert orphan in stored_points(study)
        outcome = study.gc(GcPolicy(keep_best=0, orphan_seconds=0))
        assert outcome["swept"] == 2
        assert stored_points(study) == plan_points(study.plan) == {(known_end[0], 4)}
        fs.invalidate_cache(unfinished)
        assert not fs.exists(unfinished)


def test_automatic_gc_runs_after_each_run(storage):
    with study_on(
        storage, "auto", checkpoint_every=2, gc=GcPolicy(keep_best=2, interval_seconds=None)
    ) as study:
        study.run(GridSearch(list(SPACE), metric="val_loss", mode="min", steps=STEPS))
        ranked = sorted(study.coordinator.trials.values(), key=lambda t: t.metrics["val_loss"])
        kept = {(t.node, STEPS) for t in study.coordinator.trials.values()}  # keep_latest: all finals
        assert {(t.node, STEPS) for t in ranked[:2]} <= kept
        # in virtual time the last tasks have not sent their end yet: their points stay
        protected = study.coordinator.protected_points()
        assert kept <= stored_points(study) <= kept | protected
        assert len(stored_points(study)) < study.report["unique_steps"] // 2  # one per 2 steps were written


# --------------------------------------------------------------------------- credentials


def test_credentials_never_reach_storage_logs_or_results(storage, caplog, capsys):
    if storage.kind != "s3":
        pytest.skip("credentials exist only for the S3 endpoint")
    caplog.set_level(logging.DEBUG)  # every logger, s3fs and botocore included
    with study_on(storage, "secret", checkpoint_every=2) as study:
        result = study.run(GridSearch(list(SPACE)[:2], metric="val_loss", mode="min", steps=4))
        assert SECRET not in repr(study.store) and SECRET not in repr(study)
        assert SECRET not in study._repr_html_() and SECRET not in repr(result.report)
        assert SECRET not in result.trials.to_csv()
    bad = dict(  # nothing listens there; give up at once
        storage.options,
        endpoint_url="http://127.0.0.1:9",
        retries=1,
        config_kwargs={"retries": {"max_attempts": 1}},
    )
    with pytest.raises(Exception) as refused:
        CheckpointStore(storage.url, bad).save("0" * 16, "0" * 16, 1, {"x": 1})
    assert SECRET not in str(refused.value) and SECRET not in repr(refused.value)
    assert caplog.records and SECRET not in caplog.text
    printed = capsys.readouterr()
    assert SECRET not in printed.out and SECRET not in printed.err
    fs, root = storage.fs()
    bucket = root.split("/")[0]
    for path in fs.find(bucket):
        assert SECRET.encode() not in fs.cat_file(path), path


# --------------------------------------------------------------------------- storage a study can't use


@pytest.fixture
def no_cluster(monkeypatch):
    """The embedded cluster must not start: these mistakes are found before it."""

    def refuse(*args, **kwargs):
        raise AssertionError("the embedded cluster was started before the storage was checked")

    monkeypatch.setattr("dagtune.execution.dask.embedded_cluster", refuse)


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("nosuchfs://runs", "storage='nosuchfs://runs' cannot be used: ValueError: Protocol not known"),
        ("{file}", "storage='{file}' cannot be used: FileExistsError"),
    ],
)
def test_a_storage_url_that_cannot_be_used_fails_before_any_cluster_starts(
    tmp_path, no_cluster, url, message
):
    file = tmp_path / "a-file"
    file.write_text("not a directory")
    with pytest.raises(ValueError) as refused:
        Study(SyntheticTrainer, storage=url.format(file=file))
    assert message.format(file=file) in str(refused.value)


def test_memory_storage_is_refused_where_worker_processes_cannot_share_it(no_cluster):
    with pytest.raises(
        ValueError,
        match="storage='memory://runs' is the memory of this process, but the "
        "embedded cluster's workers are processes of their own",
    ):
        Study(SyntheticTrainer, storage="memory://runs")
    store = CheckpointStore(f"memory://shared-{threading.get_ident()}")
    with Study(SyntheticTrainer, executor=SimulatedExecutor(2, store=store)) as study:  # in-process: fine
        assert study.submit({"lr": 0.1}, 3).result() == final({"lr": 0.1}, 3)


@pytest.mark.slow
def test_memory_storage_works_with_workers_in_this_process_and_is_refused_with_others(client):
    from distributed import Client, LocalCluster

    with pytest.raises(ValueError, match=r"2 Dask worker\(s\) run in other processes"):
        Study(SyntheticTrainer, storage="memory://elsewhere", client=client)
    with (
        LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None) as cluster,
        Client(cluster) as here,
        Study(SyntheticTrainer, storage="memory://here", client=here) as study,
    ):
        assert study.submit({"lr": 0.1}, 3).result(timeout=60) == final({"lr": 0.1}, 3)


def test_results_are_read_only_from_inside_the_storage_root(tmp_path):
    with pytest.raises(ValueError, match=r"'\.\./\.\./outside' is not a study name"):
        open_results(str(tmp_path / "runs"), "../../outside")
