"""A results write visits the trials that changed, not the table (issue 24): the study's
ledger marks the trials that change as events arrive (`TrialLedger.changes`) and the writer
compares only those; a resumed study's first write stores only what differs from what storage
holds, and its group ends as one written from scratch; groups of format 4 still read."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import zarr
import zarr.storage
from results_helpers import count_stored_keys, curve_of, expected_table, read_curve

import dagtune as dt
from dagtune.algos import ASHA, GridSearch
from dagtune.checkpoints import CheckpointStore
from dagtune.config import config_to_json, normalize_config
from dagtune.durable import records_header
from dagtune.plan import Journal
from dagtune.records import MetricsPoint, Trial
from dagtune.results import FORMAT, ResultsWriter, open_results
from dagtune.sim import SimulatedExecutor, SyntheticTrainer

pytestmark = pytest.mark.skipif(int(zarr.__version__.split(".")[0]) < 3, reason="counts zarr 3's store")


def _trials(n: int) -> dict[int, Trial]:
    trials = {}
    for i in range(n):
        trial = Trial(i, {"lr": dt.Constant(0.001 * (i + 1))}, 4)
        trial.curve, trial.reported = [(1, {"loss": 1.0 / (i + 1)})], 1
        trials[i] = trial
    return trials


def _move(trials: dict[int, Trial], ids: list[int], step: int) -> None:
    for i in ids:
        trials[i].points.append(MetricsPoint.of(step, {"loss": 0.5 / (i + step)}))
        trials[i].reported = step


def _scattered(n: int, k: int) -> list[int]:
    return [round(j * (n - 1) / (k - 1)) for j in range(k)]


@pytest.fixture
def stored_keys(monkeypatch) -> list[str]:
    return count_stored_keys(monkeypatch)


def test_a_write_visits_the_trials_that_changed_whatever_the_trial_count(tmp_path):
    """Told which trials changed, a write compares those (10 moved on, 2 added) and no
    other: as many at 1,000 trials as at 10,000, and the group reads back exactly."""
    visited = {}
    for n in (1_000, 10_000):
        writer = ResultsWriter(
            str(tmp_path / f"{n}" / "studies" / "s" / "results.zarr"), None, study="s", identity="x"
        )
        trials = _trials(n)
        writer.write(trials)
        ids = _scattered(n, 10)
        _move(trials, ids, 2)
        trials[n], trials[n + 1] = Trial(n, {"lr": dt.Constant(0.5)}, 4), Trial(n + 1, {}, 4)
        assert writer.write(trials, {*ids, n, n + 1})
        visited[n] = writer.visited
        pd.testing.assert_frame_equal(
            open_results(str(tmp_path / f"{n}"), "s").trials, expected_table(trials)
        )
        assert read_curve(tmp_path / f"{n}") == curve_of(trials)
    assert visited == {1_000: 12, 10_000: 12}


@pytest.fixture
def checked_writes(monkeypatch) -> list[tuple[int, int]]:
    """Every results write told which trials changed is followed by one comparing every
    trial, which must find nothing left to write (a change the study did not mark); the
    list grows by (trials visited, trials) per such write."""
    checked: list[tuple[int, int]] = []
    original = ResultsWriter.write

    def write(self, trials, changed=None):
        wrote = original(self, trials, changed)
        if changed is not None:
            checked.append((self.visited, len(trials)))
            assert not original(self, trials), "a trial changed that the study did not mark"
        return wrote

    monkeypatch.setattr(ResultsWriter, "write", write)
    return checked


def test_a_study_marks_every_change_of_what_its_results_show(tmp_path, checked_writes):
    """An ASHA search (promotions, stops, ends) on the durable path writes its results at
    every tick from the trials it marked as changed: after each such write, comparing every
    trial finds nothing left to write, and most writes visit a few of the trials."""
    checked = checked_writes
    space = dt.Random({"lr": dt.loguniform(0.01, 0.3), "momentum": dt.uniform(0.0, 0.6)}, n=30, seed=1)
    store = CheckpointStore(str(tmp_path))
    with dt.Study(
        SyntheticTrainer, name="s", storage=str(tmp_path), executor=SimulatedExecutor(8, store=store)
    ) as study:
        study._persistence.results_seconds = 0.0  # a results write at every tick
        study.run(ASHA(space, "val_loss", "min", max_steps=9, eta=3))
        trials = dict(study.coordinator.trials)
    assert len(checked) > 10 and sum(v < n / 2 for v, n in checked) > len(checked) / 2
    pd.testing.assert_frame_equal(open_results(str(tmp_path), "s").trials, expected_table(trials))


def _study(path, workers: int = 8, **options) -> dt.Study:
    return dt.Study(
        SyntheticTrainer,
        name="s",
        storage=str(path),
        executor=SimulatedExecutor(workers, store=CheckpointStore(str(path))),
        **options,
    )


def test_a_write_after_one_trial_changed_compares_and_stores_only_it_at_50_and_500_trials(
    tmp_path, stored_keys
):
    """On the durable path, once every trial is written, a trial extended is the one trial
    the next write compares and stores (one row in the change log): the same store writes
    at 50 trials as at 500."""
    written = {}
    for n in (50, 500):
        space = dt.Grid({"lr": [0.001 * (i + 1) for i in range(n)]})
        with _study(tmp_path / f"{n}", workers=64) as study:
            study.run(GridSearch(space, metric="val_loss", mode="min", steps=2), progress=False)
            persistence, coordinator = study._persistence, study.coordinator
            with study._lock:  # the study's loop waits: nothing else changes meanwhile
                persistence.results_seconds = 0.0
                persistence.tick(coordinator, force=True)  # every trial compared and written
                before, stored_keys[:] = persistence.results.logged, []
                coordinator.ledger.extend(n // 2, 3)
                persistence.tick(coordinator)
                assert persistence.results.visited == 1
                assert persistence.results.logged - before == 1  # its row; no point is new
                written[n] = sorted(key.rsplit("/c/", 1)[0] for key in stored_keys)  # array, not chunk
                persistence.results_seconds = 3600.0  # the extended trial trains on, unwritten
            assert any(ids is persistence._changed for ids in coordinator.ledger.changes)
        assert all(ids is not persistence._changed for ids in coordinator.ledger.changes)  # closed
    assert written == {50: ["log", "zarr.json"], 500: ["log", "zarr.json"]}  # one entry, committed


def test_a_resumed_study_ends_with_the_results_of_one_written_from_scratch(tmp_path, checked_writes):
    """A study opened again restores its trials (one pending, one failed outside the trainer:
    retried), its algorithm adopts them (their results replayed) and trains on; every write
    told which trials changed leaves nothing for a write comparing every trial, and its
    results group reads as one written from scratch for the same trials."""
    space = dt.Random({"lr": dt.loguniform(0.01, 0.3)}, n=12, seed=3)
    with _study(tmp_path) as first:
        first._persistence.results_seconds = 0.0
        first.run(ASHA(space, "val_loss", "min", max_steps=3, eta=3), progress=False)
        added = len(first.coordinator.trials)
    journal = Journal(
        CheckpointStore(str(tmp_path)).fs, f"{tmp_path}/studies/s/journal", header=records_header("s")
    )
    for i, lr in ((added, 0.05), (added + 1, 0.07)):
        config = config_to_json(normalize_config({"lr": lr}))
        journal.append({"r": "submit", "trial": i, "config": config, "steps": 4})
    failed = {"status": "failed", "steps": 0, "metrics": None, "error": "lost", "cause": "workers"}
    journal.append({"r": "end", "trial": added + 1, **failed}, sync=True)
    with _study(tmp_path) as second:
        second._persistence.results_seconds = 0.0
        assert {second.trials[i].status for i in (added, added + 1)} == {"pending"}
        second.run(ASHA(space, "val_loss", "min", max_steps=9, eta=3), progress=False)
        for i in (added, added + 1):
            second.trials[i].result()
        trials = dict(second.coordinator.trials)
    assert {trials[i].status for i in (added, added + 1)} == {"completed"}
    assert any(visited < n for visited, n in checked_writes)
    fresh = ResultsWriter(
        str(tmp_path / "fresh" / "studies" / "s" / "results.zarr"), None, study="s", identity="x"
    )
    fresh.write(trials)
    fresh.compact()
    resumed, scratch = open_results(str(tmp_path), "s"), open_results(str(tmp_path / "fresh"), "s")
    pd.testing.assert_frame_equal(resumed.trials, scratch.trials)
    pd.testing.assert_frame_equal(resumed.curve("val_loss"), scratch.curve("val_loss"))
    pd.testing.assert_frame_equal(resumed.trials, expected_table(trials))


def test_a_resumed_group_is_written_by_what_differs_from_it(tmp_path, stored_keys):
    """A new writer (a resumed study) takes the group as stored: its first write, with one
    trial added, one moved on and one stored point the restored trial lacks, stores one log
    entry and the attributes, no base array (nor the log's metadata: it has room for more
    entries than it holds), and reads back exactly (the point gone)."""
    url = str(tmp_path / "studies" / "s" / "results.zarr")
    trials = _trials(5_000)
    first = ResultsWriter(url, None, study="s", identity="x")
    first.write(trials)
    _move(trials, [7, 4_000], 2)
    first.write(trials)
    first.compact()
    _move(trials, [9], 2)
    first.write(trials)  # in the log
    trials[7].points.pop()  # the restored trial lacks a point stored (its journal ended before it)
    trials[7].reported = 1
    _move(trials, [1234], 2)
    trials[5_000] = Trial(5_000, {"lr": dt.Constant(0.5)}, 4)
    stored_keys.clear()
    resumed = ResultsWriter(url, None, study="s", identity="x")
    assert resumed.write(trials)
    assert sorted(stored_keys) == ["log/c/1", "zarr.json"]
    pd.testing.assert_frame_equal(open_results(str(tmp_path), "s").trials, expected_table(trials))
    assert read_curve(tmp_path) == curve_of(trials)
    stored_keys.clear()
    assert not ResultsWriter(url, None, study="s", identity="x").write(trials)  # nothing differs
    assert stored_keys == []


def _format_4_group(url: str, trials: dict[int, Trial]) -> None:
    """The group dagtune wrote in format 4 for `trials` (base rows for all but the last,
    whose row is in the change log with trial 0's new status, and a logged point)."""
    group = zarr.open_group(url, mode="w")
    ids = sorted(trials)
    base = {i: trials[i] for i in ids}
    text = np.dtypes.StringDType()

    def put(name, values, dtype):
        group.create_array(name, shape=(len(values),), dtype=dtype, chunks=(1024,))[:] = np.array(
            values, dtype=dtype
        )

    put("trial_id", ids, "int64")
    put("config", [dt.config.config_dumps(t.config) for t in base.values()], text)
    put("status", ["pending"] * len(ids), text)
    put("steps", [1] * len(ids), "int64")
    put("error", [""] * len(ids), text)
    put("final/loss", [np.nan] * len(ids), "float64")
    curve = group.create_array(
        "curve/loss", shape=(len(ids), 2), dtype="float64", chunks=(64, 256), fill_value=np.nan
    )
    curve[:, 0] = [t.curve[0][1]["loss"] for t in base.values()]
    group.create_array("step", shape=(2,), dtype="int64", chunks=(1024,))[:] = [0, 1]
    put("log/trial_id", [0], "int64")
    put("log/status", [trials[0].status], text)
    put("log/steps", [trials[0].reached], "int64")
    put("log/error", [""], text)
    put("log/final/loss", [trials[0].metrics["loss"]], "float64")
    put("log/curve/loss/trial_id", [0], "int64")
    put("log/curve/loss/step", [1], "int64")
    put("log/curve/loss/value", [trials[0].curve[1][1]["loss"]], "float64")
    group.attrs.put(
        {
            "format": "dagtune-results/4",
            "study": "s",
            "identity": "x",
            "metrics": {"loss": "loss"},
            "hyperparameters": {},
            "rows": len(ids),
            "steps": 2,
            "log": {"rows": 1, "points": {"loss": 1}},
        }
    )


def test_a_group_of_format_4_reads_the_same_and_a_resumed_study_writes_it_in_this_format(tmp_path):
    trials = {i: Trial(i, {}, 2) for i in range(3)}
    for i, trial in trials.items():
        trial.curve, trial.reported = [(1, {"loss": 1.0 / (i + 1)})], 1
    _move(trials, [0], 2)
    trials[0].status, trials[0].metrics = "completed", dict(trials[0].curve[-1][1])
    url = str(tmp_path / "studies" / "s" / "results.zarr")
    _format_4_group(url, trials)
    pd.testing.assert_frame_equal(open_results(str(tmp_path), "s").trials, expected_table(trials))
    assert read_curve(tmp_path) == curve_of(trials)
    trials[3] = Trial(3, {}, 2)
    ResultsWriter(url, None, study="s", identity="x").write(trials)
    assert zarr.open_group(url, mode="r").attrs["format"] == FORMAT
    pd.testing.assert_frame_equal(open_results(str(tmp_path), "s").trials, expected_table(trials))
    assert read_curve(tmp_path) == curve_of(trials)


def test_a_resumed_write_that_failed_is_completed_by_the_next_one_whatever_it_is_told(tmp_path, monkeypatch):
    """The first write of a resumed study fails in storage after taking the group: the next
    write, told of no change, still stores the rows that differ from the group."""
    url = str(tmp_path / "studies" / "s" / "results.zarr")
    trials = _trials(50)
    ResultsWriter(url, None, study="s", identity="x").write(trials)
    _move(trials, [3, 30], 2)
    original = zarr.storage.LocalStore.set

    async def failing(self, key, value):
        raise OSError("storage went away")

    resumed = ResultsWriter(url, None, study="s", identity="x")
    monkeypatch.setattr(zarr.storage.LocalStore, "set", failing)
    with pytest.raises(OSError):
        resumed.write(trials)
    monkeypatch.setattr(zarr.storage.LocalStore, "set", original)
    assert resumed.write(trials, set())
    pd.testing.assert_frame_equal(open_results(str(tmp_path), "s").trials, expected_table(trials))
    assert read_curve(tmp_path) == curve_of(trials)


def test_a_reader_that_stops_watching_leaves_the_other_readers_sets():
    """The results writes and a study's kept view each watch the ledger's changes with a set
    of their own; one that stops watching takes its own set away, not an equal one (two empty
    sets are equal), and the other goes on seeing every change."""
    with dt.Study(SyntheticTrainer, executor=SimulatedExecutor(1)) as study:
        ledger = study.coordinator.ledger
        first, second = ledger.watch_changes(), ledger.watch_changes()
        assert first == second and first is not second
        ledger.unwatch_changes(second)
        trial = study.submit({"lr": 0.1, "batch_size": 64}, 2).trial
        assert trial.id in first and not second
        ledger.unwatch_changes(first)
        assert all(ids is not first for ids in ledger.changes)
