"""Memory in proportion to what was trained, not to what was requested.

The API accepts ``steps=10**12``. A trial asking that much and stopped after a few steps
must cost its few steps everywhere it is shown or read back: `dagtune status` and
`dagtune tree`, the dashboard page served from storage, a resumed study, the results
written to storage. Here the trial asks 10**7 steps, so that a regression fails the bound
instead of exhausting the machine. Each is measured with tracemalloc (after a first call, so imports and
caches are not counted) against a bound of a few MiB that a list or array with one entry per
requested (or reached) step would exceed by orders of magnitude.
"""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
import zarr
from click.testing import CliRunner

import dagtune as dt
from dagtune import catalog
from dagtune.algos import Algorithm, Stop, Submit
from dagtune.checkpoints import CheckpointStore
from dagtune.cli import main
from dagtune.dashboard.figures import StudyView
from dagtune.dashboard.snapshot import stored_snapshot
from dagtune.records import Trial
from dagtune.results import ResultsWriter
from dagtune.sim import SimulatedExecutor, SyntheticTrainer

HUGE = 10**7  # a list or array per requested step would take 80 MB; 10**12 would exhaust the machine
BOUND = 4 * 2**20  # bytes


class StopEarly(Algorithm):
    """A trial of `HUGE` steps stopped at its third result, next to a trial of four steps."""

    def start(self, ctx):
        return [Submit({"lr": 0.1}, HUGE), Submit({"lr": 0.05}, 4)]

    def on_result(self, trial, step, metrics):
        if trial.steps == HUGE and step >= 3:
            return [Stop(trial.id)]
        return None


@pytest.fixture(scope="module")
def storage(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("huge") / "runs")
    with dt.Study(
        SyntheticTrainer,
        name="huge",
        storage=path,
        executor=SimulatedExecutor(2, store=CheckpointStore(path)),
    ) as study:
        study.run(StopEarly(metric="val_loss", mode="min"))
        assert [(t.status, len(t.curve())) for t in study.trials] == [("stopped", 3), ("completed", 4)]
    return path


def peak(call) -> tuple[int, object]:
    """Bytes `call` allocates at its peak (measured on a second call) and its result."""
    call()
    tracemalloc.start()
    try:
        result = call()
        return tracemalloc.get_traced_memory()[1], result
    finally:
        tracemalloc.stop()


def test_status_and_tree_cost_the_trained_steps(storage):
    used, out = peak(
        lambda: CliRunner().invoke(main, ["status", storage, "--study", "huge"], catch_exceptions=False)
    )
    assert out.exit_code == 0 and "7 trial steps need 7 unique steps" in out.output
    assert used < BOUND
    used, out = peak(lambda: CliRunner().invoke(main, ["tree", storage], catch_exceptions=False))
    assert out.exit_code == 0 and f"3–{HUGE}×1" in out.output  # the stopped trial's request, shown
    assert used < BOUND


def test_the_page_from_storage_costs_the_trained_steps(storage):
    def page():
        study = catalog.load_study(catalog.open_storage(storage), "huge")
        snapshot = stored_snapshot(study)
        StudyView().update(snapshot)
        return study, snapshot

    used, (study, snapshot) = peak(page)
    assert used < BOUND
    assert [len(steps) for steps in snapshot["curves"]["steps"]] == [3, 4]
    assert [(t.status, t.reported, len(t.curve)) for t in study.trials] == [
        ("stopped", 3, 3),
        ("completed", 4, 4),
    ]


def test_a_resumed_study_costs_the_trained_steps(storage):
    def resume():
        with dt.Study(
            SyntheticTrainer,
            name="huge",
            storage=storage,
            executor=SimulatedExecutor(2, store=CheckpointStore(storage)),
        ) as study:
            return [(t.status, t.trial.reported, len(t.curve())) for t in study.trials]

    used, trials = peak(resume)
    assert trials == [("stopped", 3, 3), ("completed", 4, 4)]
    assert used < BOUND


def test_results_cost_the_points_recorded(tmp_path):
    """A trial that reached step 2,000,000 with two evaluations: the writer's memory follows
    the two points (a dense row of that trial alone would be 16 MB), writing them to the
    points log and applying the log to the curve arrays."""
    far = Trial(0, {"lr": dt.Constant(0.1)}, 2_000_000, status="completed")
    far.curve = [(1_000, {"loss": 0.5}), (2_000_000, {"loss": 0.25})]
    far.metrics, far.reported = {"loss": 0.25}, 2_000_000
    near = Trial(1, {"lr": dt.Constant(0.05)}, 3, status="completed")
    near.curve = [(s, {"loss": 1.0 / s}) for s in (1, 2, 3)]
    near.metrics, near.reported = {"loss": 1 / 3}, 3
    ResultsWriter(str(tmp_path / "warm.zarr"), None, study="warm", identity="x").write({1: near})
    url = str(tmp_path / "results.zarr")
    writer = ResultsWriter(url, None, study="far", identity="x")
    tracemalloc.start()
    try:
        writer.write({0: far, 1: near})
        assert writer.compact()  # the points logged applied to the curve arrays: as much memory
        used = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert used < BOUND
    curve = zarr.open_group(url, mode="r")["curve/loss"]
    assert curve.shape == (2, 2_000_000)
    assert curve[0, 999] == 0.5 and curve[0, 1_999_999] == 0.25 and np.isnan(curve[0, 1_000])
    assert list(curve[1, :4]) == pytest.approx([1.0, 0.5, 1 / 3, np.nan], nan_ok=True)
    steps = zarr.open_group(url, mode="r")["step"]
    assert steps.shape == (2_000_000,) and steps[0] == 0 and steps[-1] == 1_999_999  # steps count from 0
