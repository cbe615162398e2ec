"""`dagtune status`, `tree` and `gc` on storage they can't read, or that is not dagtune's: one
``Error:`` line naming what can't be read and a ``Hint:``, exit code 2, no traceback.

The commands run as the console would run them (``python -m dagtune.cli``). Unreadable is made
for real: ``chmod 000`` and, as root (whom permissions don't stop), the command runs without
the capabilities that let root read anything (``setpriv``), so the kernel refuses it with
``PermissionError``; a directory where a file belongs and a symbolic link that loops are other
real ways a read fails, as root or not.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

import dagtune as dt
from dagtune.algos import GridSearch
from dagtune.catalog import load_study, open_storage
from dagtune.checkpoints import CheckpointStore
from dagtune.cli import main
from dagtune.sim import SimulatedExecutor, SyntheticTrainer
from dagtune.study_lease import StudyLease

ROOT = Path(__file__).resolve().parent.parent
SPACE = dt.Grid({"lr": [dt.Constant(0.1), dt.MultiStep(0.1, [4], 0.1)]})
DROP_ROOTS_POWERS = ["setpriv", "--bounding-set=-dac_override,-dac_read_search", "--inh-caps=-all", "--"]


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    """Storage holding one finished study, "sim"."""
    path = tmp_path_factory.mktemp("unreadable") / "runs"
    store = CheckpointStore(str(path))
    with dt.Study(SyntheticTrainer, name="sim", executor=SimulatedExecutor(2, store=store)) as study:
        study.run(GridSearch(SPACE, metric="val_loss", mode="min", steps=8))
    return path


@pytest.fixture
def runs(base, tmp_path) -> Path:
    """A copy of the base storage for one test to break."""
    copy = tmp_path / "runs"
    shutil.copytree(base, copy, symlinks=True)
    yield copy
    for path in [copy, *copy.rglob("*")]:  # give back what a test took away, so it can be removed
        if not path.is_symlink():
            path.chmod(0o755)


def cli(*args: str) -> subprocess.CompletedProcess:
    """``python -m dagtune.cli ARGS``, as a user without root's power to read anything."""
    command = [sys.executable, "-m", "dagtune.cli", *args]
    if os.geteuid() == 0:
        command = [*DROP_ROOTS_POWERS, *command]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)


@pytest.fixture(scope="module", autouse=True)
def reads_can_be_refused(tmp_path_factory):
    """Skip (with the reason) where a read can't be refused for real: root without setpriv or
    without the right to drop its capabilities."""
    if os.geteuid() != 0:
        return
    probe = tmp_path_factory.mktemp("probe") / "secret"
    probe.write_text("x")
    probe.chmod(0)
    try:
        refused = subprocess.run([*DROP_ROOTS_POWERS, "cat", str(probe)], capture_output=True).returncode != 0
    except FileNotFoundError:
        refused = False
    if not refused:
        pytest.skip("running as root, and setpriv can't drop the capability to read any file here")


def assert_one_error(result: subprocess.CompletedProcess, *parts: str) -> None:
    output = result.stdout + result.stderr
    assert result.returncode == 2, output
    assert "Traceback" not in output, output
    lines = output.strip().splitlines()
    errors = [i for i, line in enumerate(lines) if line.startswith("Error: ")]
    assert len(errors) == 1, output
    for part in parts:
        assert part in lines[errors[0]], output
    assert lines[errors[0] + 1].startswith("Hint: "), output


def journal_file(runs: Path) -> Path:
    (path,) = (runs / "studies" / "sim" / "journal").glob("*.jsonl")
    return path


def plan_file(runs: Path) -> Path:
    identity = load_study(open_storage(str(runs)), "sim").identity
    (path,) = (runs / identity / "plan").glob("*.jsonl")
    return path


BREAKS = {
    "journal": (journal_file, "the records of study 'sim'"),
    "plan": (plan_file, "the search plan of model"),
    "studies": (lambda runs: runs / "studies", "the list of studies (studies/)"),
}


@pytest.mark.slow
@pytest.mark.parametrize("command", ["status", "tree", "gc"])
@pytest.mark.parametrize("broken", sorted(BREAKS))
def test_a_file_that_cannot_be_read_is_one_error_line_and_a_hint(runs, command, broken):
    locate, what = BREAKS[broken]
    path = locate(runs)
    (runs / "studies" / "sim" / "index.json.gz").unlink()  # else status and tree read the study's index
    path.chmod(0)
    result = cli(command, str(runs))
    assert_one_error(result, what, "PermissionError", str(runs))
    assert (
        "Hint: dagtune reads every file under STORAGE: check its permissions" in result.stdout + result.stderr
    )


@pytest.mark.slow
def test_an_index_that_cannot_be_read_is_passed_over_for_the_journals(runs):
    expected = cli("status", str(runs))
    (runs / "studies" / "sim" / "index.json.gz").chmod(0)
    result = cli("status", str(runs))
    assert result.returncode == 0 and result.stdout == expected.stdout, result.stderr
    assert "can't be read" in result.stderr and "PermissionError" in result.stderr


@pytest.mark.slow
@pytest.mark.parametrize("command", ["status", "tree", "gc"])
def test_a_directory_where_a_journal_file_belongs_is_one_error_line(runs, command):
    path = journal_file(runs)
    path.unlink()
    path.mkdir()
    result = cli(command, str(runs))
    assert_one_error(result, "the records of study 'sim'", "IsADirectoryError", path.name)


@pytest.mark.slow
def test_a_looping_link_where_the_studies_belong_is_one_error_line_and_debug_shows_the_traceback(runs):
    studies = runs / "studies"
    shutil.rmtree(studies)
    studies.symlink_to(studies)  # a link to itself: every read of it fails (ELOOP)
    result = cli("status", str(runs))
    assert_one_error(result, "the list of studies (studies/)", "Too many levels of symbolic links")
    debug = cli("--debug", "status", str(runs))
    assert debug.returncode != 0 and "Traceback" in debug.stderr and "OSError" in debug.stderr


def test_a_folder_that_is_not_dagtune_storage_says_so(tmp_path):
    folder = tmp_path / "project"
    (folder / "studies" / "x").mkdir(parents=True)  # a folder of the user's own named studies
    (folder / "studies" / "x" / "notes.txt").write_text("my notes")
    (folder / "README.md").write_text("hello")
    for args in (["status", str(folder)], ["status", str(folder), "--study", "x"], ["gc", str(folder)]):
        out = CliRunner().invoke(main, args)
        assert out.exit_code == 2, out.output
        lines = out.output.strip().splitlines()
        assert len(lines) == 2, out.output
        assert lines[0].startswith(f"Error: {folder} is not dagtune storage: it holds no study records")
        assert "README.md, studies" in lines[0] and "no study 'x'" not in out.output
        assert lines[1].startswith("Hint: give the directory or URL a study wrote to")


def test_a_study_folder_without_readable_records_says_so(runs):
    for path in journal_file(runs).parent.iterdir():
        path.write_text("this is not a journal line\n")
    out = CliRunner().invoke(main, ["status", str(runs), "--study", "sim"])
    assert out.exit_code == 2, out.output
    error = next(line for line in out.output.splitlines() if line.startswith("Error: "))
    assert "studies/sim/journal in" in error and "holds no study records dagtune can read" in error
    assert "not a dagtune journal line" in error and "no study 'sim'" not in error


@pytest.mark.slow
def test_run_on_a_study_open_in_another_process_is_one_error_line_or_waits(tmp_path, caplog):
    script = tmp_path / "tiny.py"
    script.write_text(
        "import dagtune as dt\n"
        "from dagtune.algos import GridSearch\n"
        "from dagtune.launch import StudySetup\n"
        "from dagtune.sim import SyntheticTrainer\n\n"
        "def study_setup():\n"
        "    algorithm = GridSearch(dt.Grid({'lr': [0.1]}), metric='val_loss', mode='min', steps=2)\n"
        "    return StudySetup(trainer=SyntheticTrainer, algorithm=algorithm, name='tiny')\n"
    )
    holder = subprocess.Popen(  # another process has the study open
        [
            sys.executable,
            "-c",
            "import sys, time\n"
            "from dagtune.checkpoints import CheckpointStore\n"
            "from dagtune.study_lease import StudyLease\n"
            "lease = StudyLease(CheckpointStore(sys.argv[1]), 'tiny').acquire()\n"
            "print(lease.session, flush=True)\n"
            "time.sleep(120)\n",
            str(tmp_path / "runs"),
        ],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])},
    )
    try:
        session = holder.stdout.readline().strip()
        out = CliRunner().invoke(main, ["run", str(script), "--storage", str(tmp_path / "runs")])
        error = [line for line in out.output.splitlines() if line.startswith("Error: ")]
        assert out.exit_code == 2 and len(error) == 1, out.output
        assert "study 'tiny'" in error[0] and "is open for writing in another process" in error[0]
        assert f"pid {holder.pid}" in error[0] and f"session {session[:12]}" in error[0]
        assert "Hint: stop that process, or wait for it with --wait-for-lease SECONDS" in out.output
        assert "Traceback" not in out.output

        # --wait-for-lease waits: the holder ends once the run said it waits, and the run goes on
        caplog.set_level(logging.WARNING, logger="dagtune")

        def end_the_holder_once_waited_for() -> None:
            deadline = time.monotonic() + 120
            while "waiting up to" not in caplog.text and time.monotonic() < deadline:
                time.sleep(0.05)
            holder.kill()
            holder.wait()  # reaped, as its shell would: a zombie's pid still names its process

        threading.Thread(target=end_the_holder_once_waited_for, daemon=True).start()
        out = CliRunner().invoke(
            main,
            [
                "run",
                str(script),
                "--storage",
                str(tmp_path / "runs"),
                "--workers",
                "1",
                "--wait-for-lease",
                "300",
            ],
        )
        assert out.exit_code == 0, out.output
        assert f"study 'tiny' is open in session {session[:12]}" in caplog.text
        assert "waiting up to 300 s for it (wait_for_lease)" in caplog.text
    finally:
        holder.kill()
        holder.wait(30)


def test_status_of_a_study_says_which_process_has_it_open(runs):
    held = StudyLease(CheckpointStore(str(runs)), "sim").acquire()
    try:
        out = CliRunner().invoke(main, ["status", str(runs), "--study", "sim"])
        assert out.exit_code == 0, out.output
        assert (
            f"writer: open in session {held.session[:12]} on host {os.uname().nodename}, pid {os.getpid()}"
            in (out.output.replace("\n", " "))
        )
    finally:
        held.release()
    out = CliRunner().invoke(main, ["status", str(runs), "--study", "sim"])
    assert f"writer: none (last closed by session {held.session[:12]}" in out.output.replace("\n", " ")
