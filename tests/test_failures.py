"""Failed trials in sight: `Result.failed`, a warning at the end of `Study.run`, the failed
trials and their error lines in `dagtune run` (which then exits 1), in `dagtune status` (a
column of their own) and on the page. The trainer is PyTorch's MNIST example ported to
dagtune, whose ``train()`` raises at its third step (`user_trainers.FailsAtStep`)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner
from user_trainers import DivergesAtHighLr, FailsAtStep, MnistStyle

import dagtune as dt
from dagtune.algos import GridSearch
from dagtune.catalog import load_study, open_storage
from dagtune.cli import main
from dagtune.dashboard.figures import counters_html
from dagtune.dashboard.snapshot import result_snapshot, stored_snapshot
from dagtune.notices import TrialsDivergedWarning, TrialsFailedWarning
from dagtune.progress import read_state
from dagtune.sim import SimulatedExecutor
from dagtune.summary import error_line

ERROR = "RuntimeError: CUDA out of memory (pretend) at step 2"


def failing_study(path) -> tuple[dt.Study, dt.Result, list]:
    """Three trials whose trainer raises at their third step (two of them share the first),
    run to the end; the study, its result and the warnings it ended with."""
    store = dt.CheckpointStore(str(path))
    study = dt.Study(FailsAtStep, name="fails", storage=str(path), executor=SimulatedExecutor(2, store=store))
    space = [{"lr": 0.05}, {"lr": dt.Steps([0.05, 0.01], [1])}, {"lr": 0.02}]
    with pytest.warns(TrialsFailedWarning) as caught:
        result = study.run(GridSearch(space, metric="val_loss", mode="min", steps=4))
    study.close()
    return study, result, caught


def test_a_run_ends_with_a_warning_and_gives_the_failed_trials(tmp_path):
    _, result, caught = failing_study(tmp_path)
    assert [t.id for t in result.failed] == [0, 1, 2] and all(t.status == "failed" for t in result.failed)
    assert all("Traceback" in t.error and t.error.rstrip().endswith(ERROR) for t in result.failed)
    assert all(t.steps == 2 for t in result.failed)  # what each reached before failing
    (warning,) = [
        w for w in caught if w.category is TrialsFailedWarning
    ]  # once, whatever else a loaded machine warns of
    assert str(warning.message) == (
        f"3 of 3 trials failed; the first, trial 0: {ERROR} (Result.failed has them, with their tracebacks)"
    )
    assert warning.filename == __file__  # it points at the caller's line


def test_a_run_without_failures_warns_about_nothing(recwarn):
    study = dt.Study(MnistStyle, executor=SimulatedExecutor(1))
    result = study.run(GridSearch([{"lr": 0.05}], metric="val_loss", mode="min", steps=2))
    assert result.failed == [] and not [w for w in recwarn if w.category is TrialsFailedWarning]


DIVERGING = [{"lr": 0.05}, {"lr": 5.0}, {"lr": 0.02}]


def test_a_run_with_diverged_trials_warns_and_names_them(recwarn):
    """A NaN or infinite metric ends its trial as diverged: the run says so (a trial cut
    short by a metric nobody looked at must not pass silently)."""
    study = dt.Study(DivergesAtHighLr, executor=SimulatedExecutor(2))
    with pytest.warns(TrialsDivergedWarning) as caught:
        result = study.run(GridSearch(DIVERGING, metric="val_loss", mode="min", steps=3))
    assert [t.id for t in result.diverged] == [1] and result.diverged[0].status == "diverged"
    assert result.failed == [] and not [w for w in recwarn if w.category is TrialsFailedWarning]
    (warning,) = [w for w in caught if w.category is TrialsDivergedWarning]
    assert str(warning.message) == (
        "1 of 3 trials diverged (a NaN or infinite metric ends its trial): the first, trial 1, "
        "after 1 step: loss=nan (Result.diverged has them)"
    )
    assert warning.filename == __file__  # it points at the caller's line


def test_a_run_without_divergence_warns_about_nothing(recwarn):
    study = dt.Study(DivergesAtHighLr, executor=SimulatedExecutor(1))
    result = study.run(GridSearch([{"lr": 0.05}], metric="val_loss", mode="min", steps=2))
    assert result.diverged == [] and not [w for w in recwarn if w.category is TrialsDivergedWarning]


DIVERGING_SCRIPT = textwrap.dedent(
    """
    from user_trainers import DivergesAtHighLr

    from dagtune.algos import GridSearch
    from dagtune.launch import StudySetup
    from dagtune.sim import SimulatedExecutor

    def study_setup():
        space = [{"lr": 0.05}, {"lr": 5.0}, {"lr": 0.02}]
        return StudySetup(trainer=DivergesAtHighLr, algorithm=GridSearch(space, "val_loss", "min", steps=3),
                          name="nan", options={"executor": SimulatedExecutor(2)})
    """
)


def test_dagtune_run_lists_the_diverged_trials_and_exits_0(tmp_path, recwarn):
    """Diverging is a result of the search, not a failure (exit 0), but `dagtune run` names
    the trials it cut short and why (once: not again as a Python warning)."""
    (tmp_path / "nan.py").write_text(DIVERGING_SCRIPT)
    out = CliRunner().invoke(main, ["run", str(tmp_path / "nan.py"), "--storage", str(tmp_path / "runs")])
    assert out.exit_code == 0, out.output
    assert "1 of 3 trials diverged (a NaN or infinite metric ends its trial):" in out.output
    assert "trial 1 after 1 step: loss=nan" in out.output
    assert not [w for w in recwarn if w.category is TrialsDivergedWarning]


FAILING_SCRIPT = textwrap.dedent(
    """
    from user_trainers import FailsAtStep

    from dagtune.algos import GridSearch
    from dagtune.launch import StudySetup
    from dagtune.sim import SimulatedExecutor

    def study_setup():
        space = [{"lr": 0.05}, {"lr": 0.02}]
        return StudySetup(trainer=FailsAtStep, algorithm=GridSearch(space, "val_loss", "min", steps=4),
                          name="fails", options={"executor": SimulatedExecutor(2), "max_retries": 0})
    """
)


def test_dagtune_run_says_its_best_trial_failed(tmp_path, recwarn):
    """With every trial failed, the best is the best a failed trial reached: the run's
    headline says it failed, as the progress line does. The failures are listed once, not
    again as a Python warning pointing into dagtune's command."""
    (tmp_path / "fails.py").write_text(FAILING_SCRIPT)
    out = CliRunner().invoke(main, ["run", str(tmp_path / "fails.py"), "--storage", str(tmp_path / "runs")])
    assert out.exit_code == 1, out.output
    assert not [w for w in recwarn if w.category is TrialsFailedWarning]
    assert "after 2 steps (failed)" in " ".join(out.output.split()), out.output


def test_status_has_a_failed_column_and_the_error_lines(tmp_path):
    failing_study(tmp_path)
    out = CliRunner().invoke(main, ["status", str(tmp_path)], catch_exceptions=False)
    assert out.exit_code == 0, out.output
    header = next(line for line in out.output.splitlines() if "stopped/diverged" in line)
    row = next(line for line in out.output.splitlines() if "│ fails" in line)
    cells = [cell.strip() for cell in row.split("│")[1:-1]]
    names = [cell.strip() for cell in header.split("┃")[1:-1]]
    assert dict(zip(names, cells))["failed"] == "3" and dict(zip(names, cells))["stopped/diverged"] == "0"
    text = " ".join(out.output.split())
    assert (
        f"fails: 3 failed trials (the first below; `dagtune status {tmp_path} --study fails` lists them)"
        in text
    )
    assert f"trial 0: {ERROR}" in text and "trial 1:" not in text
    out = CliRunner().invoke(main, ["status", str(tmp_path), "--study", "fails"], catch_exceptions=False)
    assert all(f"trial {i}: {ERROR}" in out.output for i in range(3))


def test_the_page_and_the_progress_line_show_failures(tmp_path):
    study, result, _ = failing_study(tmp_path)
    for snapshot in (
        stored_snapshot(load_study(open_storage(str(tmp_path)), "fails")),
        result_snapshot(result),
    ):
        assert snapshot["failures"] == {"count": 3, "first": [0, ERROR]}
        page = counters_html(snapshot)
        assert '<b style="color:#c0392b">3 failed</b>' in page and "0 diverged" in page
        assert f"first failed trial: trial 0: {ERROR}" in page
    assert "3/3 trials finished (3 failed)" in read_state(study, "val_loss", "min", 0.0).line()


def test_the_error_line_of_a_traceback_is_its_exception():
    chained = textwrap.dedent(
        """\
        Traceback (most recent call last):
          File "x.py", line 1, in f
            g()
        KeyError: 'a'

        The above exception was the direct cause of the following exception:

        Traceback (most recent call last):
          File "x.py", line 3, in h
            raise ValueError("bad\\nvalue")
        ValueError: bad
        value
        """
    )
    assert error_line(chained) == "ValueError: bad"
    assert (
        error_line("KilledWorker: ('k', 2)\nThe Dask workers running this stage died")
        == "KilledWorker: ('k', 2)"
    )
    assert error_line(None) == "" and error_line("") == ""


SCRIPT = textwrap.dedent(
    """
    import dagtune as dt
    from dagtune.algos import GridSearch
    from dagtune.launch import StudySetup
    from user_trainers import FailsAtStep

    def study_setup():
        space = [{"lr": 0.05}, {"lr": dt.Steps([0.05, 0.01], [1])}]
        return StudySetup(trainer=FailsAtStep, algorithm=GridSearch(space, "val_loss", "min", steps=4),
                          name="fails", options={"max_retries": 0})
    """
)


@pytest.mark.slow
def test_dagtune_run_lists_the_failed_trials_and_exits_1(tmp_path):
    (tmp_path / "fails.py").write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": f"{Path(__file__).parent}:{os.environ.get('PYTHONPATH', '')}"}
    command = [
        sys.executable,
        "-m",
        "dagtune.cli",
        "run",
        "fails.py",
        "--workers",
        "1",
        "--storage",
        str(tmp_path / "runs"),
    ]
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 1, done.stdout + done.stderr[-3000:]
    assert "2 of 2 trials failed:" in done.stdout
    assert f"trial 0: {ERROR}" in done.stdout and f"trial 1: {ERROR}" in done.stdout
    assert "2/2 trials finished (2 failed)" in done.stderr
