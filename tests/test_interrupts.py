"""Interrupting a study for real, then running it again: ``dagtune run`` cut by SIGINT to its
process group (what a terminal's Ctrl-C sends), SIGTERM to the group (a batch system ending
the job) and SIGKILL to the group (a crash, a kernel restart), at several points of the
run, unfused and fused; then the same command again. The result must be the uninterrupted
run's, bit for bit: the same trials, learning curves and best. Also: an interrupted
``Study.run`` continues in the same process, and what storage says after an interrupt
(trial records, results, ``dagtune status``) agrees.

The study is `interrupt_setup.py`: six schedules of a small MLP, 12 steps, a checkpoint
every 2, paced so that a run lasts seconds after the cluster starts.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner
from durable_helpers import SlowTrainer
from interrupt_setup import SPACE, STEPS

import dagtune as dt
from dagtune.algos import GridSearch
from dagtune.catalog import load_study, open_storage
from dagtune.cli import main
from dagtune.config import config_dumps
from dagtune.records import PENDING
from dagtune.study import Study, run_alone
from dagtune.study_lease import writer_status

pytestmark = pytest.mark.slow

HERE = os.path.dirname(os.path.abspath(__file__))
SETUP = os.path.join(HERE, "interrupt_setup.py")
NAME = "cut"
METRICS = ("loss", "val_loss", "val_acc")


def command(storage: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "dagtune.cli", "run", SETUP, "--storage", storage, "--workers", "2", *extra]


def commits(storage: str) -> int:
    """Checkpoints committed in `storage` so far."""
    return len(glob.glob(os.path.join(storage, "*", "checkpoints", "*", "*", "COMMIT")))


def run_to_the_end(storage: str, *extra: str) -> str:
    done = subprocess.run(command(storage, *extra), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    return done.stdout


def run_and_cut(
    storage: str, number: int, when, *extra: str, again: float | None = None
) -> tuple[int, list[str]]:
    """Start the run as a process group of its own, send it signal `number` once
    ``when(storage, lines)`` holds (and, with `again`, once more that many seconds later, if
    it still runs), and return its exit code and output lines."""
    process = subprocess.Popen(
        command(storage, *extra),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(process.stdout), daemon=True)
    reader.start()
    deadline = time.monotonic() + 300
    try:
        while not when(storage, lines):
            assert process.poll() is None, "the run ended before the cut:\n" + "".join(lines)[-4000:]
            assert time.monotonic() < deadline, "the cut never came:\n" + "".join(lines)[-4000:]
            time.sleep(0.02)
        os.killpg(process.pid, number)
        if again is not None:
            time.sleep(again)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, number)
        code = process.wait(timeout=180)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    reader.join(timeout=30)
    return code, [line.rstrip("\n") for line in lines]


def after_commits(count: int):
    def when(storage: str, lines: list[str]) -> bool:
        return commits(storage) >= count

    when.__name__ = f"after_{count}_commits"
    return when


def after_more_commits(count: int):
    """Once the run has committed `count` checkpoints more than storage held when it started."""
    start: list[int] = []

    def when(storage: str, lines: list[str]) -> bool:
        if not start:
            start.append(commits(storage))
        return commits(storage) >= start[0] + count

    when.__name__ = f"after_{count}_more_commits"
    return when


def best_lines(stdout: str) -> list[str]:
    """The best trial as `dagtune run` prints it: its metric, steps and schedule."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if "best:" in line)
    end = next(i for i, line in enumerate(lines) if " trials: trained " in line)
    return lines[start:end]


def assert_same_results(storage: str, reference: str) -> None:
    """Trials (statuses, steps, configs, final metrics) and every learning curve, bit for bit."""
    ours, theirs = dt.open_results(storage, NAME), dt.open_results(reference, NAME)
    pd.testing.assert_frame_equal(ours.trials, theirs.trials, check_exact=True)
    for metric in METRICS:
        curve, expected = ours.curve(metric), theirs.curve(metric)
        assert curve.shape == expected.shape == (len(SPACE), STEPS)
        assert np.array_equal(curve.to_numpy(), expected.to_numpy(), equal_nan=False), metric


def assert_storage_agrees(storage: str) -> None:
    """After an interrupt, the trial records (what `dagtune status` reads) and the results
    store say the same of every trial, and the unfinished ones are pending."""
    stored = load_study(open_storage(storage), NAME)
    records = {trial.id: trial.status for trial in stored.trials}
    results = dt.open_results(storage, NAME).trials["status"].to_dict()
    assert records == results
    assert PENDING in records.values() and "stopped" not in records.values()
    # `dagtune status` through the command's entry point in this process (a fresh process
    # would only add a Python start)
    status = CliRunner().invoke(main, ["status", storage, "--study", NAME])
    assert status.exit_code == 0, status.output
    pending = sum(1 for value in records.values() if value == PENDING)
    row = next(line for line in status.stdout.splitlines() if f" {NAME} " in line)
    assert str(pending) in row.split()  # the pending column


def assert_one_line(lines: list[str], signal_name: str, storage: str, fuse: tuple[str, ...]) -> None:
    """Only progress, then the one line that says what is kept and the command that resumes."""
    said = [line for line in lines if line.strip() and not line.startswith("dagtune")]
    assert len(said) == 1, "\n".join(lines)
    assert said[0].startswith(f"Interrupted ({signal_name}): ") and f"kept in {storage}" in said[0]
    assert said[0].endswith(
        shlex.join(["dagtune", "run", SETUP, "--storage", storage, "--workers", "2", *fuse])
    )


class Uninterrupted:
    """The uninterrupted run of the study, started in the background (while a case cuts its
    own runs, which wait mostly on the paced steps) and waited for by `result`."""

    def __init__(self, storage: str, fuse: tuple[str, ...]):
        self.storage = storage
        self.process = subprocess.Popen(
            command(storage, *fuse), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        self.output: str | None = None

    def result(self) -> tuple[str, str]:
        """Its storage and output, once it ended (it must end well)."""
        if self.output is None:
            stdout, stderr = self.process.communicate(timeout=600)
            assert self.process.returncode == 0, stdout[-2000:] + stderr[-4000:]
            self.output = stdout
        return self.storage, self.output

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.communicate()


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> Iterator[Callable[[tuple[str, ...]], Uninterrupted]]:
    """The uninterrupted runs, unfused and fused, each started on first use."""
    runs: dict[str, Uninterrupted] = {}

    def get(fuse: tuple[str, ...]) -> Uninterrupted:
        key = " ".join(fuse)
        if key not in runs:
            runs[key] = Uninterrupted(str(tmp_path_factory.mktemp("uninterrupted") / "runs"), fuse)
        return runs[key]

    yield get
    for run in runs.values():
        run.stop()


# Each case is one storage cut once or more, each time by `dagtune run`'s own command run
# again, then run to the end. SIGKILL early and SIGTERM midway share one storage: the run
# after the kill is the one SIGTERM cuts, so the kill's rerun and the SIGTERM case cost one
# run less than two cases would, and the final run continues after both. Ctrl-C is cut once,
# fused: the same handler as unfused (the one line, storage agreeing), and an early cut
# unfused is the SIGKILL cut's, so an unfused Ctrl-C run would add minutes and prove nothing
# more. The SIGTERM cut comes 4 commits after its run starts, of the study's 20.
CUTS = [
    pytest.param(
        ((signal.SIGKILL, after_commits(6)), (signal.SIGTERM, after_more_commits(4))),
        (),
        id="sigkill-of-everything-then-sigterm-midway",
    ),
    pytest.param(((signal.SIGINT, after_commits(5)),), ("--fuse", "6"), id="ctrl-c-fused"),
]


@pytest.mark.parametrize(("cuts", "fuse"), CUTS)
def test_cut_then_the_same_command_again_gives_the_uninterrupted_result(tmp_path, uninterrupted, cuts, fuse):
    started = uninterrupted(fuse)  # runs while this case cuts its own
    storage = str(tmp_path / "runs")
    for number, when in cuts:
        code, lines = run_and_cut(storage, number, when, *fuse)
        if number == signal.SIGKILL:
            assert code == -signal.SIGKILL
        else:
            assert code == 128 + number, "\n".join(lines)
            assert_one_line(lines, "Ctrl-C" if number == signal.SIGINT else "SIGTERM", storage, fuse)
            assert not any("Traceback" in line for line in lines)
            assert_storage_agrees(storage)  # a killed process leaves results as they were last written
    output = run_to_the_end(storage, *fuse)
    reference, reference_output = started.result()
    assert_same_results(storage, reference)
    assert best_lines(output) == best_lines(reference_output)


def test_ctrl_c_twice_lets_the_study_close_and_the_same_command_continues(tmp_path, uninterrupted):
    """Ctrl-C pressed again while the study closes (an impatient user) is ignored with one
    notice: the close is not cut short (no traceback from Dask's exit handlers, the lease
    released), and the same command again gives the uninterrupted result."""
    started = uninterrupted(())
    storage = str(tmp_path / "runs")
    code, lines = run_and_cut(storage, signal.SIGINT, after_commits(5), again=0.1)
    assert code == 128 + signal.SIGINT, "\n".join(lines)
    assert_one_line(lines, "Ctrl-C", storage, ())
    assert not any("Traceback" in line for line in lines), "\n".join(lines)
    assert sum("dagtune: closing the study" in line for line in lines) == 1, "\n".join(lines)
    assert writer_status(open_storage(storage), NAME).startswith("none (last closed by session")
    assert_storage_agrees(storage)
    output = run_to_the_end(storage)
    reference, reference_output = started.result()
    assert_same_results(storage, reference)
    assert best_lines(output) == best_lines(reference_output)


class CutShortError(Exception):
    """What cuts `CutGrid`'s run short (as Ctrl-C would: the run raises it)."""


class CutGrid(GridSearch):
    """`GridSearch` whose run is cut short at its `results`-th result."""

    def __init__(self, *args, results: int, **kwargs):
        super().__init__(*args, **kwargs)
        self.left = results

    def on_result(self, trial, step, metrics):
        self.left -= 1
        if self.left == 0:
            raise CutShortError()
        return super().on_result(trial, step, metrics)


def test_an_interrupted_run_leaves_its_trials_pending_and_the_same_run_continues_them(client, tmp_path):
    """In one process: a run cut short (its algorithm raising, as Ctrl-C, a timeout or a
    bug do) stops training its trials but keeps them pending, in storage too; running the
    same algorithm again continues each from its latest checkpoint."""
    space = dt.Grid({"lr": [dt.Constant(0.1), dt.MultiStep(0.1, [6], 0.1)], "batch_size": [128, 256]})
    steps = 12
    storage = str(tmp_path / "runs")
    with Study(
        SlowTrainer, {"delay": 0.1}, name="again", storage=storage, client=client, checkpoint_every=2
    ) as study:
        with pytest.raises(CutShortError):
            study.run(CutGrid(space, metric="val_loss", mode="min", steps=steps, results=6))
        statuses = {t.id: t.status for t in study.trials}
        assert set(statuses.values()) == {PENDING}  # none reached 12 steps in 6 results
        with study._lock:
            assert not study.coordinator.plan.active  # nothing trains for them meanwhile
        records = load_study(open_storage(storage), "again")
        assert {t.id: t.status for t in records.trials} == statuses

        def resume_points() -> set:
            with study._lock:
                return {study.plan.latest_checkpoint(t.trial.node, t.trial.steps) for t in study.trials}

        before = resume_points()
        assert before != {None}  # they trained past a checkpoint
        study.gc(dt.GcPolicy(keep_best=0, keep_latest=False, budget_bytes=0, orphan_seconds=None))
        assert resume_points() == before  # collection keeps where they resume
        result = study.run(GridSearch(space, metric="val_loss", mode="min", steps=steps))
        trials = {config_dumps(t.config): t for t in study.coordinator.trials.values()}
    assert len(trials) == len(space) == len(result.trials)  # the same trials, none added
    for config in space:
        alone = run_alone(SlowTrainer, config, steps, trainer_kwargs={"delay": 0.0})
        trial = trials[config_dumps(dt.config.normalize_config(config))]
        assert trial.status == "completed"
        assert [metrics for _, metrics in trial.curve] == alone


def after_the_last_trial(storage: str, lines: list[str]) -> bool:
    """Once `dagtune run` printed its last progress line: the run has returned, the study closes."""
    return any(f"{len(SPACE)}/{len(SPACE)} trials finished" in line for line in lines)


def test_ctrl_c_after_the_study_finished_shows_its_result(tmp_path, uninterrupted):
    """Ctrl-C that comes once every trial has finished (twice: the second while the study
    closes) does not make a finished study an interrupted one: one notice says so, the study
    closes completely (lease released, every result written), the command shows the best and
    exits 0, and the same command again reports the same finished study."""
    started = uninterrupted(())
    storage = str(tmp_path / "runs")
    code, lines = run_and_cut(storage, signal.SIGINT, after_the_last_trial, again=0.1)
    output = "\n".join(lines)
    assert code == 0, output
    assert not any(line.startswith("Interrupted") or "Traceback" in line for line in lines), output
    assert sum("Ctrl-C after the study had finished" in line for line in lines) == 1, output
    assert writer_status(open_storage(storage), NAME).startswith("none (last closed by session")
    reference, reference_output = started.result()
    assert_same_results(storage, reference)
    assert best_lines(output) == best_lines(reference_output)
    again = run_to_the_end(storage)
    assert best_lines(again) == best_lines(reference_output)
    assert " trained 0 steps " in again
