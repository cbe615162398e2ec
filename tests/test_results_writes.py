"""The results writer costs what changed (issue 24): a write after a few trials changed
stores the same number of zarr chunks in a study of 3,000 trials as in one of 30,000 (the
hyper-parameters' cells included), counted at the zarr store, and what it stores reads back
exactly."""

from __future__ import annotations

import numpy as np
import pytest
import zarr
import zarr.storage

import dagtune as dt
from dagtune.records import Trial
from dagtune.results import ResultsWriter, open_results

pytestmark = pytest.mark.skipif(int(zarr.__version__.split(".")[0]) < 3, reason="counts zarr 3's store")


def _trials(n: int) -> dict[int, Trial]:
    trials = {}
    for i in range(n):
        trial = Trial(i, {"lr": dt.Constant(0.001 * (i + 1))}, 4)
        trial.curve, trial.reported = [(1, {"loss": 1.0 / (i + 1)})], 1
        trials[i] = trial
    return trials


def _advance(trials: dict[int, Trial]) -> None:
    """Three trials move on (one point each, the last one completes) and two are added: the
    first and last trials and one in the middle, so (from 2,048 trials) three chunks of rows
    are touched."""
    n = len(trials)
    for i in (0, n // 2, n - 1):
        trial = trials[i]
        trial.curve.append((2, {"loss": 0.5 / (i + 1)}))
        trial.reported = 2
    trials[n - 1].status, trials[n - 1].metrics = "completed", {"loss": 0.5 / n}
    for i in (n, n + 1):
        trials[i] = Trial(i, {"lr": dt.Constant(0.5)}, 4)


@pytest.fixture
def stored_keys(monkeypatch):
    """The keys the zarr store is asked to set, by metadata and chunk."""
    keys: list[str] = []
    original = zarr.storage.LocalStore.set

    async def counting(self, key, value):
        keys.append(key)
        return await original(self, key, value)

    monkeypatch.setattr(zarr.storage.LocalStore, "set", counting)
    return keys


def _chunks_of_a_write(tmp_path, n: int, keys: list[str]) -> list[str]:
    writer = ResultsWriter(
        str(tmp_path / f"{n}" / "studies" / "s" / "results.zarr"), None, study="s", identity="x"
    )
    trials = _trials(n)
    assert writer.write(trials)
    _advance(trials)
    keys.clear()
    assert writer.write(trials)
    return sorted(k for k in keys if not k.endswith("zarr.json"))  # metadata: one per array


def test_a_write_stores_the_chunks_that_changed_whatever_the_trial_count(tmp_path, stored_keys):
    small = _chunks_of_a_write(tmp_path, 3000, stored_keys)
    large = _chunks_of_a_write(tmp_path, 30000, stored_keys)
    # 10 per-trial arrays x 3 chunks of rows, the curve's chunks of the 4 points, 1 of steps
    assert len(large) == len(small) <= 10 * 3 + 4 + 1
    assert [k for k in large if k.startswith("hyper/")] == [  # lr's cells: its last value moves on
        "hyper/lr/constant/c/29",
        "hyper/lr/first/c/29",
        "hyper/lr/last/c/0",
        "hyper/lr/last/c/14",
        "hyper/lr/last/c/29",
        "hyper/lr/schedule/c/29",
    ]

    results = open_results(str(tmp_path / "30000"), "s")
    frame = results.trials
    assert len(frame) == 30002 and list(frame.index[-3:]) == [29999, 30000, 30001]
    assert frame.loc[29999, "status"] == "completed" and frame.loc[29999, "loss"] == 0.5 / 30000
    assert frame.loc[15000, "status"] == "pending" and frame.loc[15000, "steps"] == 2
    curve = results.curve("loss")
    assert curve.loc[15000, 1] == 0.5 / 15001 and curve.loc[15001, 0] == 1 / 15002
    assert np.isnan(curve.loc[15001, 1]) and np.isnan(curve.loc[30000, 0])


def test_ids_configs_and_errors_are_written_only_where_they_changed(tmp_path, stored_keys):
    """A trial's id and config never change: their chunks (and those of its hyper-parameter
    cells but the value at its last step) are stored for the rows added (the last chunk
    here), not for the trials that moved on; its error where it changed."""
    writer = ResultsWriter(str(tmp_path / "studies" / "s" / "results.zarr"), None, study="s", identity="x")
    trials = _trials(3000)
    assert writer.write(trials)
    _advance(trials)
    trials[1500].status, trials[1500].error = "failed", "boom"
    stored_keys.clear()
    assert writer.write(trials)
    chunks = sorted(k for k in stored_keys if not k.endswith("zarr.json"))
    assert [k for k in chunks if k.startswith(("trial_id/", "config/", "error/", "hyper/lr/"))] == [
        "config/c/2",
        "error/c/1",
        "hyper/lr/constant/c/2",
        "hyper/lr/first/c/2",
        "hyper/lr/last/c/0",
        "hyper/lr/last/c/1",
        "hyper/lr/last/c/2",
        "hyper/lr/schedule/c/2",
        "trial_id/c/2",
    ]
    assert len([k for k in chunks if k.startswith(("status/", "steps/"))]) == 6  # 3 chunks each
    frame = open_results(str(tmp_path), "s").trials
    assert frame.loc[1500, "error"] == "boom" and frame.loc[1499, "error"] == ""
    assert frame.loc[3001, "lr"] == 0.5 and frame.loc[2999, "lr"] == pytest.approx(3.0)


def test_nothing_changed_writes_nothing(tmp_path, stored_keys):
    writer = ResultsWriter(str(tmp_path / "results.zarr"), None, study="s", identity="x")
    trials = _trials(10)
    assert writer.write(trials)
    stored_keys.clear()
    assert not writer.write(trials)
    assert stored_keys == []


def test_rows_that_moved_are_written_again_in_trial_order(tmp_path):
    """A trial id below the last one written (restored trials come in late) reorders the
    rows: the group is rewritten whole, still one row per trial in id order."""
    writer = ResultsWriter(str(tmp_path / "studies" / "s" / "results.zarr"), None, study="s", identity="x")
    trials = _trials(5)
    late = {i: trials.pop(i) for i in (1, 3)}
    writer.write(trials)
    writer.write({**trials, **late})
    results = open_results(str(tmp_path), "s")
    assert list(results.trials.index) == [0, 1, 2, 3, 4]
    assert list(results.curve("loss")[0]) == pytest.approx([1.0 / (i + 1) for i in range(5)])


def test_a_write_that_failed_halfway_is_done_whole_the_next_time(tmp_path, monkeypatch):
    """Rows added by a write that failed after storing some chunks (a storage error) get
    their ids, configs and cells when the write is tried again; the cells of the rows kept
    are read back, not worked out again."""
    import dagtune.results as results

    writer = ResultsWriter(str(tmp_path / "studies" / "s" / "results.zarr"), None, study="s", identity="x")
    trials = _trials(1500)
    assert writer.write(trials)
    _advance(trials)
    put = results._put_rows

    def failing(group, name, *args):
        if name == "config":
            raise OSError("storage went away")
        return put(group, name, *args)

    monkeypatch.setattr(results, "_put_rows", failing)
    with pytest.raises(OSError):
        writer.write(trials)
    monkeypatch.setattr(results, "_put_rows", put)
    assert writer.write(trials)
    frame = open_results(str(tmp_path), "s").trials
    assert list(frame.index) == list(range(1502)) and frame.loc[1501, "lr"] == 0.5
    assert frame.loc[1024, "lr"] == pytest.approx(1.025) and frame.loc[750, "steps"] == 2
