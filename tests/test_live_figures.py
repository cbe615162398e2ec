"""Figures that must not mislead while a study runs and after: the live merge rate (over the
trials that have ended), a best value taken from a running trial, GPU-seconds on a study
without GPUs, reuse when nothing was executed, and `dagtune status` on a study this version
wrote (it records its work from its first moment)."""

from __future__ import annotations

import io

import pytest
from click.testing import CliRunner
from digits import search_space
from rich.console import Console

import dagtune as dt
from dagtune import cli
from dagtune.algos import GridSearch
from dagtune.catalog import load_study, open_storage
from dagtune.cli import main
from dagtune.dashboard.figures import counters_html
from dagtune.dashboard.snapshot import live_snapshot, stored_snapshot
from dagtune.notebook import study_html
from dagtune.progress import ProgressState, read_state
from dagtune.records import Trial
from dagtune.sim import SimulatedExecutor, SyntheticTrainer
from dagtune.summary import best_note, merge_rate_so_far, reuse_text


def test_the_live_merge_rate_is_not_inflated_early_and_ends_at_the_reports():
    """The digits grid (36 trials, merge rate 2.22): shared prefixes are trained first, so the
    steps the pending trials have reached are mostly shared (a rate over them reads 9 early).
    The live figure counts a trial once it ended: it is never above the final one here."""
    study = dt.Study(SyntheticTrainer, executor=SimulatedExecutor(2))
    for config in search_space():
        study.submit(config, 30)
    coordinator = study.coordinator
    inflated, live = [], []
    while coordinator.running or coordinator.plan.active:
        coordinator.pump()
        trials = list(coordinator.trials.values())
        inflated.append(coordinator.report(trials)["merge_rate"])
        live.append(merge_rate_so_far(trials))
    final = coordinator.report()["merge_rate"]
    assert round(final, 2) == 2.22
    assert max(inflated) > 8  # what the views showed before
    assert live[0] == (None, 0)
    assert all(rate is None or rate <= final + 1e-9 for rate, _ in live)
    assert live[-1] == (pytest.approx(final), 36)


def test_the_page_shows_the_rate_so_far_and_a_running_best_says_so():
    study = dt.Study(SyntheticTrainer, executor=SimulatedExecutor(1))
    study._metric = ("val_loss", "min")
    study.submit({"lr": 0.1}, 6)
    study.submit({"lr": dt.Steps([0.1, 0.05], [3])}, 6)
    while study.coordinator.executed_steps < 4:
        study.coordinator.pump()
    snapshot = live_snapshot(study)
    page = counters_html(snapshot)
    assert "merge rate <b>–</b> (no trial ended yet)" in page
    best = snapshot["best"]
    assert (
        best["status"] == "pending"
        and best["note"] == f"trial {best['trial']}, at step {best['steps']}, running"
    )
    assert f"({best['note']})" in page and ", running)" in study_html(study)
    state = read_state(study, "val_loss", "min", 0.0)
    assert (
        state.line()
        .split(", best ")[1]
        .startswith(f"val_loss {state.best:.4g} (trial {best['trial']}, at step ")
    )
    while study.coordinator.running or study.coordinator.plan.active:
        study.coordinator.pump()
    page = counters_html(live_snapshot(study))
    assert "merge rate <b>1.33</b> (2 of 2 trials ended)" in page and ", running" not in page


def test_a_study_without_gpus_counts_worker_seconds(tmp_path):
    for resources, label in ((None, "worker-s"), ({"GPU": 1}, "GPU-s")):
        path = tmp_path / label
        store = dt.CheckpointStore(str(path))
        with dt.Study(
            SyntheticTrainer,
            name="s",
            storage=str(path),
            resources=resources,
            executor=SimulatedExecutor(1, store=store),
        ) as study:
            result = study.run(GridSearch([{"lr": 0.1}], metric="val_loss", steps=3))
            for snapshot in (live_snapshot(study), stored_snapshot(load_study(open_storage(str(path)), "s"))):
                page = counters_html(snapshot)
                assert f"{label}econds <b>" in page and ("GPU-s" in page) == (resources is not None)
        assert result.gpus == (1.0 if resources else 0.0)
        out = CliRunner().invoke(main, ["status", str(path), "--study", "s"], catch_exceptions=False)
        assert f"{label}econds" in out.output


def test_reuse_when_nothing_was_executed_is_a_dash(tmp_path, monkeypatch):
    store = dt.CheckpointStore(str(tmp_path))
    for _ in range(2):  # the second run finds every result known: it executes nothing
        with dt.Study(
            SyntheticTrainer, name="again", storage=str(tmp_path), executor=SimulatedExecutor(1, store=store)
        ) as study:
            result = study.run(GridSearch([{"lr": 0.1}], metric="val_loss", steps=3))
    assert result.report["executed_steps"] == 0 and reuse_text(result.report) == "– (nothing executed)"
    assert reuse_text({"executed_steps": 4, "reuse": 2.5}) == "2.50x"
    console = Console(file=io.StringIO(), width=200)
    monkeypatch.setattr(cli, "_console", lambda: console)
    cli._print_result(result)  # the summary `dagtune run` prints
    text = console.file.getvalue()
    assert "reuse – (nothing executed)" in text and "infx" not in text


def test_status_of_a_study_this_version_wrote_knows_its_work(tmp_path):
    """Open, nothing trained yet (nothing flushed by a tick): the work is known (0 steps);
    the old message is for studies whose sessions never recorded work."""
    store = dt.CheckpointStore(str(tmp_path))
    study = dt.Study(
        SyntheticTrainer, name="fresh", storage=str(tmp_path), executor=SimulatedExecutor(1, store=store)
    )
    try:
        out = CliRunner().invoke(main, ["status", str(tmp_path), "--study", "fresh"], catch_exceptions=False)
        assert "trained: 0 steps executed by this study's sessions, 0.0 worker-seconds" in out.output
        assert "not recorded" not in out.output
    finally:
        study.close()


def test_the_progress_line_names_failures_and_a_running_best():
    state = ProgressState(
        "s", 4, 2, 10, 20, 0.5, "val_loss", 3.0, failed=1, best_note="trial 2, at step 5, running"
    )
    assert state.line() == (
        "dagtune s: 2/4 trials finished (1 failed), 10 steps trained, 10 saved by reuse, "
        "best val_loss 0.5 (trial 2, at step 5, running), 3 s"
    )
    trial = Trial(3, {}, 10, status="stopped", reported=4)
    assert best_note(trial) == "trial 3, stopped at step 4"
