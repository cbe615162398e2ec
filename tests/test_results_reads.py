"""Reading a study's trials frame back reads each per-trial array in few chunks (issue 24):
zarr costs a fixed overhead per chunk read (hand-offs to its threads), which at 1024 rows a
chunk was half the CPU of `open_results(...).trials` on a 100,000-trial store. Counted at
the zarr store, not timed."""

from __future__ import annotations

import math

import pandas as pd
import pytest
import zarr
from results_helpers import count_read_keys, expected_table

import dagtune as dt
from dagtune.records import Trial
from dagtune.results import ResultsWriter, open_results
from dagtune.results._format import CHUNK_ROWS

pytestmark = pytest.mark.skipif(int(zarr.__version__.split(".")[0]) < 3, reason="counts zarr 3's store")


def _trials(n: int) -> dict[int, Trial]:
    """`n` trials: a hyper-parameter constant for all and one that changes at step 2, every
    other one reported step 1 and completed (the others pending)."""
    trials = {}
    for i in range(n):
        config = {"lr": dt.Steps([0.1, 0.001 * (i % 100 + 1)], [2]), "momentum": dt.Constant(0.9)}
        trial = Trial(i, config, 4)
        if i % 2:
            trial.curve, trial.reported = [(1, {"loss": 1.0 / (i + 1)})], 1
            trial.status, trial.metrics = "completed", {"loss": 1.0 / (i + 1)}
        trials[i] = trial
    return trials


def test_the_trials_frame_reads_each_per_trial_array_in_few_chunks(tmp_path, monkeypatch):
    """A study of 12,288 trials: its trials frame reads 2 chunks of each per-trial array it
    shows (trial ids, status, steps, error, config, the final loss, 4 cells of `lr` and 3 of
    `momentum`): 8192 rows a chunk (at 1024 it read 12 each), and no array read twice."""
    n = 12_288
    trials = _trials(n)
    writer = ResultsWriter(str(tmp_path / "studies" / "s" / "results.zarr"), None, study="s", identity="x")
    writer.write(trials)
    writer.compact()  # as a study's close leaves it: the rows in the base arrays
    keys = count_read_keys(monkeypatch)
    frame = open_results(str(tmp_path), "s").trials
    chunks = [key for key in keys if "/c/" in key]
    arrays = {key.split("/c/")[0] for key in chunks}
    assert arrays == {
        "trial_id", "status", "steps", "error", "config", "final/loss",
        "hyper/lr/schedule", "hyper/lr/first", "hyper/lr/constant", "hyper/lr/last",
        "hyper/momentum/schedule", "hyper/momentum/first", "hyper/momentum/constant",
    }  # fmt: skip
    assert len(chunks) == len(arrays) * math.ceil(n / CHUNK_ROWS) == 13 * 2
    pd.testing.assert_frame_equal(frame, expected_table(trials))
