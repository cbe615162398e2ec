"""The results writer costs what changed, row by row (issue 24): a write after k trials
changed, wherever they are, stores the same keys in a study of 1,000 trials as in one of
100,000 (counted at the zarr store), the change log it appends to is applied to the base
at a constant amortized cost, a write stopped anywhere leaves the rows before it or after
it, and everything reads back exactly."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import zarr
import zarr.storage
from results_helpers import count_read_keys, count_stored_keys, curve_of, expected_table, read_curve

import dagtune as dt
from dagtune.records import MetricsPoint, Trial
from dagtune.results import FORMAT, ResultsWriter, open_results

pytestmark = pytest.mark.skipif(int(zarr.__version__.split(".")[0]) < 3, reason="counts zarr 3's store")


def _trials(n: int, hyper: bool = True) -> dict[int, Trial]:
    """`n` trials that reported step 1 (a constant learning rate each, with `hyper`)."""
    trials = {}
    for i in range(n):
        trial = Trial(i, {"lr": dt.Constant(0.001 * (i + 1))} if hyper else {}, 4)
        trial.curve, trial.reported = [(1, {"loss": 1.0 / (i + 1)})], 1
        trials[i] = trial
    return trials


def _scattered(n: int, k: int) -> list[int]:
    """`k` trial ids spread evenly over `n` (each in another chunk of rows once n is large)."""
    return [round(j * (n - 1) / (k - 1)) for j in range(k)]


def _advance(trials: dict[int, Trial], ids: list[int], step: int) -> None:
    """Trials `ids` report step `step` (the last of them completes) and two are added."""
    for i in ids:
        trial = trials[i]
        trial.points.append(MetricsPoint.of(step, {"loss": 0.5 / (i + step)}))
        trial.reported = step
    last = trials[ids[-1]]
    last.status, last.metrics = "completed", dict(last.curve[-1][1])
    n, hyper = max(trials) + 1, bool(trials[0].config)
    for i in (n, n + 1):
        trials[i] = Trial(i, {"lr": dt.Constant(0.5)} if hyper else {}, 4)


def _keys_of_a_write(tmp_path, n: int, keys: list[str]) -> list[str]:
    """The keys stored by a write after 10 trials spread over `n` moved on (2 added), each
    with the number of its chunk counted from the end of the table (the new rows' chunk)."""
    writer = ResultsWriter(str(tmp_path / f"{n}" / "results.zarr"), None, study="s", identity="x")
    trials = _trials(n, hyper=False)  # (the hyper-parameters' cells: in the same entry)
    assert writer.write(trials)
    writer.compact()  # (at 100,000 trials the first write applied its log already)
    _advance(trials, _scattered(n, 10), 2)
    keys.clear()
    assert writer.write(trials)
    return sorted(keys)


@pytest.fixture
def stored_keys(monkeypatch) -> list[str]:
    return count_stored_keys(monkeypatch)


def test_a_write_after_scattered_changes_stores_the_same_keys_whatever_the_trial_count(tmp_path, stored_keys):
    """10 trials spread over the whole table move on (and 2 are added): at 1,000 trials and
    at 100,000 the write stores the same four keys: its entry of the change log (the 12 rows
    and 10 points, packed), the step coordinate's chunk and metadata (the steps grew) and the
    group's attributes (the commit, last). No base chunk and no other array is stored."""
    small = _keys_of_a_write(tmp_path, 1000, stored_keys)
    large = _keys_of_a_write(tmp_path, 100_000, stored_keys)
    assert large == small == ["log/c/0", "step/c/0", "step/zarr.json", "zarr.json"]


def test_a_write_after_scattered_changes_reads_back_exactly(tmp_path):
    writer = ResultsWriter(str(tmp_path / "studies" / "s" / "results.zarr"), None, study="s", identity="x")
    trials = _trials(3000)
    writer.write(trials)
    _advance(trials, _scattered(3000, 10), 2)
    writer.write(trials)
    pd.testing.assert_frame_equal(open_results(str(tmp_path), "s").trials, expected_table(trials))
    assert read_curve(tmp_path) == curve_of(trials)


def test_the_log_is_applied_at_a_constant_cost_per_change(tmp_path, stored_keys):
    """Over many writes of scattered changes, the chunks stored (the log's applications to
    the base included) per change do not grow with the table: the log is applied once it
    reaches a fixed fraction of the table, so the table is rewritten once per that many
    changes (a sixteenth here, to apply it often)."""
    per_change = {}
    for n in (1_000, 10_000):
        url = str(tmp_path / f"{n}" / "studies" / "s" / "results.zarr")
        writer = ResultsWriter(url, None, study="s", identity="x", compact_min=0, compact_fraction=1 / 16)
        trials = _trials(n, hyper=False)
        writer.write(trials)
        stored_keys.clear()
        applied, changes, step = 0, 0, 2
        rng = np.random.default_rng(0)
        while applied < 3:
            ids = sorted({int(i) for i in rng.integers(0, n, n // 100)})
            _advance(trials, ids, step)
            step += 1
            writer.write(trials)
            changes += 2 * len(ids) + 2  # rows and points
            applied += writer.logged == 0
        per_change[n] = len([k for k in stored_keys if not k.endswith("zarr.json")]) / changes
        pd.testing.assert_frame_equal(
            open_results(str(tmp_path / f"{n}"), "s").trials, expected_table(trials)
        )
    assert per_change[10_000] <= 1.5 * per_change[1_000]


def test_the_log_reads_the_same_before_and_after_it_is_applied(tmp_path):
    writer = ResultsWriter(str(tmp_path / "studies" / "s" / "results.zarr"), None, study="s", identity="x")
    trials = _trials(3000)
    writer.write(trials)
    for step in (2, 3):
        _advance(trials, _scattered(3000, 7), step)
        trials[1500].status, trials[1500].error = "failed", f"boom {step}"
        writer.write(trials)
    assert writer.logged > 0  # the rows that changed are in the log
    logged = open_results(str(tmp_path), "s")
    frame, curve = logged.trials, logged.curve("loss")
    pd.testing.assert_frame_equal(frame, expected_table(trials))
    assert frame.loc[1500, "error"] == "boom 3" and frame.loc[1499, "error"] == ""
    assert writer.compact() and not writer.compact()
    group = zarr.open_group(str(tmp_path / "studies" / "s" / "results.zarr"), mode="r")
    assert group.attrs["log"] == 0 and group.attrs["format"] == FORMAT
    assert list(group["error"][1499:1501]) == ["", "boom 3"]  # the base arrays: a plain table
    compacted = open_results(str(tmp_path), "s")
    pd.testing.assert_frame_equal(compacted.trials, frame)
    pd.testing.assert_frame_equal(compacted.curve("loss"), curve)
    assert read_curve(tmp_path) == curve_of(trials)


def test_writes_neither_reread_arrays_nor_resize_the_log_each_time(tmp_path, stored_keys, monkeypatch):
    """64 writes (the first, then one trial moving on at each), then writes and compactions:
    the writer opens each array once (no metadata read after it made or opened it) and the
    change log has room that doubles when full, so its metadata is stored 3 times (made with
    room for 16 entries, grown to 32 and 64), not at every write (main stored it at every
    write and read 4 metadata documents per write: the log's and the step coordinate's,
    each looked up, then opened). Everything reads back exactly."""
    read_keys = count_read_keys(monkeypatch)
    url = str(tmp_path / "studies" / "s" / "results.zarr")
    writer = ResultsWriter(url, None, study="s", identity="x", compact_min=10**9)
    trials = _trials(100)
    writer.write(trials)
    first_reads = len(read_keys)
    for step in range(2, 65):
        _advance(trials, [step], step)
        assert writer.write(trials)
    metadata_reads = [k for k in read_keys[first_reads:] if k.endswith("zarr.json")]
    assert metadata_reads == []
    assert stored_keys.count("log/zarr.json") == 3
    pd.testing.assert_frame_equal(open_results(str(tmp_path), "s").trials, expected_table(trials))
    assert read_curve(tmp_path) == curve_of(trials)
    assert writer.compact()  # makes the base arrays
    read_keys.clear()
    for step in range(65, 70):
        _advance(trials, [step], step)
        assert writer.write(trials)
    assert writer.compact()  # applies the log to the arrays it made
    assert [k for k in read_keys if k.endswith("zarr.json")] == []
    pd.testing.assert_frame_equal(open_results(str(tmp_path), "s").trials, expected_table(trials))
    assert read_curve(tmp_path) == curve_of(trials)


def test_nothing_changed_writes_nothing(tmp_path, stored_keys):
    writer = ResultsWriter(str(tmp_path / "results.zarr"), None, study="s", identity="x")
    trials = _trials(10)
    assert writer.write(trials)
    stored_keys.clear()
    assert not writer.write(trials)
    assert stored_keys == []


def test_trials_that_come_late_read_in_trial_order(tmp_path):
    """A trial id below the last one written (restored trials come in late) is appended to
    the table: readers give the rows in trial id order all the same."""
    writer = ResultsWriter(str(tmp_path / "studies" / "s" / "results.zarr"), None, study="s", identity="x")
    trials = _trials(5)
    late = {i: trials.pop(i) for i in (1, 3)}
    writer.write(trials)
    writer.write({**trials, **late})
    stored = open_results(str(tmp_path), "s")
    assert list(stored.trials.index) == [0, 1, 2, 3, 4]
    assert list(stored.curve("loss")[0]) == pytest.approx([1.0 / (i + 1) for i in range(5)])
    writer.compact()
    assert list(open_results(str(tmp_path), "s").curve("loss")[0]) == pytest.approx(
        [1.0 / (i + 1) for i in range(5)]
    )


def test_a_trial_gone_rewrites_the_group(tmp_path):
    writer = ResultsWriter(str(tmp_path / "studies" / "s" / "results.zarr"), None, study="s", identity="x")
    trials = _trials(5)
    writer.write(trials)
    del trials[2]
    trials[5] = Trial(5, {}, 4)
    writer.write(trials)
    assert list(open_results(str(tmp_path), "s").trials.index) == [0, 1, 3, 4, 5]


def _frame_and_curve(path):
    stored = open_results(str(path), "s")
    return stored.trials, stored.curve("loss")


def test_a_write_stopped_anywhere_leaves_the_rows_before_or_after_it(tmp_path, monkeypatch):
    """The store fails after its n-th key of a write (every n): the group reads as
    before the write (nothing committed) or, stopped while the log was being applied, as
    after it; the next write completes it."""
    original = zarr.storage.LocalStore.set
    budget = [None]

    async def failing(self, key, value):
        if budget[0] is not None:
            if budget[0] == 0:
                raise OSError("storage went away")
            budget[0] -= 1
        return await original(self, key, value)

    monkeypatch.setattr(zarr.storage.LocalStore, "set", failing)
    seen = set()
    for stop in range(400):  # every key: both stages
        target = tmp_path / f"{stop}"
        url = str(target / "studies" / "s" / "results.zarr")
        writer = ResultsWriter(url, None, study="s", identity="x", compact_min=0)  # the log applied too
        trials = _trials(100)
        writer.write(trials)
        _advance(trials, _scattered(100, 5), 2)
        writer.write(trials)
        before = _frame_and_curve(target)
        _advance(trials, _scattered(100, 50), 3)  # the log reaches a quarter of the table
        budget[0] = stop
        try:
            writer.write(trials)
        except OSError:
            stopped = True
        else:
            stopped = False
        budget[0] = None
        frame, curve = _frame_and_curve(target)
        if frame.equals(before[0]):
            pd.testing.assert_frame_equal(curve, before[1])
            seen.add("before")
        else:
            pd.testing.assert_frame_equal(frame, expected_table(trials))
            assert read_curve(target) == curve_of(trials)
            seen.add("after")
        writer.write(trials)
        pd.testing.assert_frame_equal(open_results(str(target), "s").trials, expected_table(trials))
        assert read_curve(target) == curve_of(trials)
        if not stopped:
            break
    assert seen == {"before", "after"} and not stopped
