"""The dagtune command: storage views on a simulated study (fast), one-line errors for user
mistakes, and `dagtune run` for real as a console script on the embedded cluster (slow)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap

import pytest
from click.testing import CliRunner

import dagtune as dt
from dagtune.algos import GridSearch
from dagtune.checkpoints import CheckpointStore
from dagtune.cli import main
from dagtune.progress import ProgressState, watch
from dagtune.sim import SimulatedExecutor, SyntheticTrainer

SPACE = dt.Grid(
    {
        "lr": [dt.Constant(0.1), dt.MultiStep(0.1, [4], 0.1)],
        "momentum": [0.9, dt.Steps([0.9, 0.5], [3])],
    }
)

SCRIPT = textwrap.dedent(
    """
    import dagtune as dt
    from dagtune.algos import GridSearch
    from dagtune.launch import StudySetup
    from dagtune.sim import SyntheticTrainer

    SPACE = dt.Grid({"lr": [dt.Constant(0.1), dt.MultiStep(0.1, [4], 0.1)],
                     "momentum": [0.9, dt.Steps([0.9, 0.5], [3])]})

    def study_setup():
        algorithm = GridSearch(SPACE, metric="val_loss", mode="min", steps=8)
        return StudySetup(trainer=SyntheticTrainer, algorithm=algorithm, name="tiny")

    def as_dict():
        return {"trainer": SyntheticTrainer, "algorithm": GridSearch(SPACE, metric="val_loss", steps=8)}

    def wrong():
        return 42

    def explode():
        data = {}
        return data["no such dataset"]
    """
)

SLOW_SCRIPT = textwrap.dedent(
    """
    import time

    import dagtune as dt
    from dagtune.algos import GridSearch
    from dagtune.launch import StudySetup
    from dagtune.sim import SyntheticTrainer


    class Sleepy(SyntheticTrainer):
        def train(self):
            time.sleep(0.2)
            return super().train()


    def study_setup():
        space = dt.Grid({"lr": [0.1, 0.05]})
        return StudySetup(trainer=Sleepy, algorithm=GridSearch(space, metric="val_loss", steps=40), name="slow")
    """
)


@pytest.fixture(scope="module")
def storage(tmp_path_factory):
    """Storage holding one finished simulated study, "sim"."""
    path = tmp_path_factory.mktemp("cli") / "runs"
    store = CheckpointStore(str(path))
    with dt.Study(
        SyntheticTrainer, name="sim", storage=str(path), executor=SimulatedExecutor(2, store=store)
    ) as study:
        study.run(GridSearch(SPACE, metric="val_loss", mode="min", steps=8))
    return str(path)


def invoke(*args: str):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def test_status_lists_studies_and_the_best_trials(storage):
    out = invoke("status", storage)
    assert out.exit_code == 0 and "sim" in out.output and "val_acc" in out.output  # the default metric
    detail = invoke("status", storage, "--study", "sim", "--metric", "val_loss", "--mode", "min")
    assert detail.exit_code == 0
    assert "32 trial steps need 21 unique steps" in detail.output
    assert "best 4 trials by val_loss" in detail.output and "0.9→0.5@3" in detail.output


def test_tree_shows_shared_prefixes_and_branches(storage):
    out = invoke("tree", storage)
    assert out.exit_code == 0
    assert "0–3×4" in out.output  # steps 0-3 are shared by all four trials
    assert out.output.count("→ #") == 4  # every trial ends somewhere in the tree


def test_gc_dry_run_then_for_real(storage, tmp_path):
    import shutil

    copy = str(tmp_path / "copy")
    shutil.copytree(storage, copy)
    dry = invoke("gc", copy, "--keep-best", "0", "--dry-run")
    assert dry.exit_code == 0 and "dry run" in dry.output
    done = invoke("gc", copy, "--keep-best", "0")
    assert done.exit_code == 0
    again = invoke("gc", copy, "--keep-best", "0", "--dry-run")
    row = next(line for line in again.output.splitlines() if "│" in line and any(c.isdigit() for c in line))
    assert row.split("│")[2].strip() == "0"  # nothing left to delete


@pytest.mark.parametrize(
    ("args", "message", "hint"),
    [
        (
            ["status", "/nonexistent/runs"],
            "storage '/nonexistent/runs' does not exist",
            "Hint: give a directory",
        ),
        (["tree", "nosuchproto://x"], "Protocol not known: nosuchproto", "Hint:"),
        (["run", "missing.py"], "no script 'missing.py'", "Hint:"),
        (["run", "no_such_module_xyz:setup"], "cannot import 'no_such_module_xyz'", "Hint:"),
        (["run", "justaname"], "neither a .py script nor module:function", "Hint: e.g."),
        (
            ["status", "/nonexistent/runs", "--study", "../etc"],
            "--study '../etc' is not a study name",
            "Hint: `dagtune status STORAGE` lists",
        ),
        (["tree", ".", "--study", "a b"], "--study 'a b' is not a study name", "Hint:"),
        (["dashboard", ".", "--study", "[x]"], "--study '[x]' is not a study name", "Hint:"),
        (
            ["dashboard", ".", "--allow-origin", "host"],
            "--allow-origin 'host' is not HOST:PORT",
            "Hint: e.g.",
        ),
        (["run", "x.py", "--resources", "GPU"], "--resources 'GPU' is not NAME=AMOUNT", "Hint: e.g."),
        (["run", "x.py", "--fuse", "0"], "--fuse '0' is not a positive count of trials", "Hint: e.g."),
    ],
)
def test_user_mistakes_are_one_line_and_a_hint(args, message, hint):
    out = CliRunner().invoke(main, args)
    assert out.exit_code == 2, out.output
    lines = out.output.strip().splitlines()
    assert len(lines) == 2 and message in lines[0] and lines[1].startswith(hint), out.output
    assert "Traceback" not in out.output


def test_bad_scripts_say_where(tmp_path, storage):
    (tmp_path / "broken.py").write_text("x = 1\ndef study_setup(:\n")
    (tmp_path / "raises.py").write_text("import math\nraise RuntimeError('no data here')\n")
    (tmp_path / "good.py").write_text(SCRIPT)
    cases = {
        str(tmp_path / "broken.py"): "broken.py:2: SyntaxError",
        str(tmp_path / "raises.py"): "raises.py:2: importing the script raised RuntimeError: no data here",
        f"{tmp_path / 'good.py'}:nothing": "has no function 'nothing'",
        f"{tmp_path / 'good.py'}:wrong": "wrong() returned int, not a StudySetup",
    }
    for target, message in cases.items():
        out = CliRunner().invoke(main, ["run", target, "--storage", storage])
        assert out.exit_code == 2 and message in out.output and "Hint:" in out.output, out.output
    debug = CliRunner().invoke(main, ["--debug", "run", str(tmp_path / "raises.py")])
    assert isinstance(debug.exception.__cause__, RuntimeError)  # --debug: the traceback, chained


def one_error(out, message: str, hint: str = "Hint:") -> None:
    """The command failed with one Error line, then one Hint line, and no traceback (other
    output, e.g. progress lines, may come before)."""
    assert out.exit_code == 2, out.output
    lines = out.output.strip().splitlines()
    errors = [i for i, line in enumerate(lines) if line.startswith("Error: ")]
    assert len(errors) == 1 and message in lines[errors[0]], out.output
    assert lines[errors[0] + 1].startswith(hint), out.output
    assert "Traceback" not in out.output


def test_mistakes_in_the_setup_code_are_one_line(tmp_path, monkeypatch, storage):
    (tmp_path / "good.py").write_text(SCRIPT)
    line = SCRIPT.splitlines().index('    return data["no such dataset"]') + 1
    out = CliRunner().invoke(main, ["run", f"{tmp_path / 'good.py'}:explode", "--storage", storage])
    one_error(out, f"good.py:{line}: explode() raised KeyError: 'no such dataset'", "Hint: add --debug")
    debug = CliRunner().invoke(main, ["--debug", "run", f"{tmp_path / 'good.py'}:explode"])
    assert isinstance(debug.exception.__cause__, KeyError)  # --debug: the whole traceback, chained

    package = tmp_path / "pkg"
    package.mkdir()
    (package / "sick.py").write_text("import os\nraise ValueError('bad config file')\n")
    (package / "needy.py").write_text("import no_such_dependency_xyz\n")
    monkeypatch.syspath_prepend(str(package))
    out = CliRunner().invoke(main, ["run", "sick:study_setup"])
    one_error(out, "sick.py:2: importing it raised ValueError: bad config file")
    out = CliRunner().invoke(main, ["run", "needy:study_setup"])
    one_error(
        out, "needy.py:1: importing it raised ModuleNotFoundError: No module named 'no_such_dependency_xyz'"
    )
    debug = CliRunner().invoke(main, ["--debug", "run", "sick:study_setup"])
    assert isinstance(debug.exception.__cause__, ValueError)


def test_bad_storage_and_conflicting_options_on_run(tmp_path):
    (tmp_path / "good.py").write_text(SCRIPT)
    out = CliRunner().invoke(main, ["run", str(tmp_path / "good.py"), "--storage", "nosuchproto://x"])
    one_error(out, "cannot use storage 'nosuchproto://x'", "Hint: give a writable directory")
    out = CliRunner().invoke(
        main, ["run", str(tmp_path / "good.py"), "--scheduler", "tcp://127.0.0.1:1", "--workers", "2"]
    )
    one_error(out, "--workers sizes the local cluster; it can't be used with --scheduler", "Hint: drop one")
    out = CliRunner().invoke(main, ["run", str(tmp_path / "good.py"), "--fuse"])
    one_error(
        out,
        "--fuse: fuse=True needs a dagtune.FusibleTrainer; SyntheticTrainer is not one",
        "Hint: drop --fuse",
    )


@pytest.fixture
def scheduler_only():
    """An in-process Dask scheduler with no worker at all."""
    from distributed import LocalCluster

    with LocalCluster(
        n_workers=0, processes=False, protocol="tcp://", host="127.0.0.1", dashboard_address="127.0.0.1:0"
    ) as cluster:
        yield cluster.scheduler_address


def test_a_scheduler_without_workers_is_one_line(tmp_path, scheduler_only):
    import dask

    (tmp_path / "good.py").write_text(SCRIPT)
    args = [
        "run",
        str(tmp_path / "good.py"),
        "--scheduler",
        scheduler_only,
        "--storage",
        str(tmp_path / "runs"),
    ]
    with dask.config.set({"dagtune.worker-wait": "1s"}):
        out = CliRunner().invoke(main, [*args, "--resources", "GPU=1"])
        one_error(
            out,
            f"no Dask worker joined the scheduler at {scheduler_only} within 1 s",
            "Hint: start workers with `dask worker ADDRESS --resources GPU=1`",
        )
        debug = CliRunner().invoke(main, ["--debug", *args])
    assert isinstance(debug.exception, TimeoutError)


@pytest.mark.slow
def test_an_expired_timeout_is_one_line(tmp_path):
    from distributed import LocalCluster

    (tmp_path / "slow.py").write_text(SLOW_SCRIPT)
    runs = str(tmp_path / "runs")
    with LocalCluster(
        n_workers=1,
        threads_per_worker=1,
        processes=False,
        protocol="tcp://",
        host="127.0.0.1",
        dashboard_address="127.0.0.1:0",
    ) as cluster:
        args = ["run", str(tmp_path / "slow.py"), "--scheduler", cluster.scheduler_address, "--storage", runs]
        out = CliRunner().invoke(main, [*args, "--timeout", "1"])
    one_error(
        out, "the study did not finish within --timeout 1 s (0/2 trials completed)", "Hint: raise --timeout"
    )
    assert f"what was trained is kept in {runs}" in out.output


def test_setups_load_from_functions_and_dicts(tmp_path):
    from dagtune.launch import load_setup

    (tmp_path / "good.py").write_text(SCRIPT)
    setup = load_setup(str(tmp_path / "good.py"))
    assert setup.name == "tiny" and setup.trainer is SyntheticTrainer
    assert load_setup(f"{tmp_path / 'good.py'}:as_dict").algorithm.metric == "val_loss"


def test_markup_in_hyper_parameter_values_is_shown_literally(tmp_path):
    path = str(tmp_path / "runs")
    space = dt.Grid({"opt": ["[/]", "[bold]x", "plain"], "lr": [0.1]})
    with dt.Study(
        SyntheticTrainer,
        name="marks",
        storage=path,
        executor=SimulatedExecutor(2, store=CheckpointStore(path)),
    ) as study:
        study.run(GridSearch(space, metric="val_loss", mode="min", steps=4))
    tree = invoke("tree", path)
    assert tree.exit_code == 0 and "opt='[/]'" in tree.output and "opt='[bold]x'" in tree.output
    status = invoke("status", path, "--study", "marks")
    # a constant's plain value in the table of best trials, escaped: not taken for markup
    assert status.exit_code == 0 and "│ [/]" in status.output and "│ [bold]x" in status.output


def test_status_shows_what_the_study_executed_or_why_it_is_unknown(storage, tmp_path):
    out = invoke("status", storage, "--study", "sim")
    assert "trained: 21 steps executed by this study's sessions" in " ".join(out.output.split())
    # a study whose sessions recorded no work (as dagtune wrote them before these records)
    old = tmp_path / "old"
    shutil.copytree(storage, old)
    for journal in (old / "studies" / "sim" / "journal").iterdir():
        lines = journal.read_bytes().splitlines(keepends=True)
        journal.write_bytes(b"".join(line for line in lines if b'"r":"work"' not in line))
    out = invoke("status", str(old), "--study", "sim")
    assert "executed steps and GPU-seconds were not recorded" in " ".join(out.output.split())


def test_log_lines_have_a_heartbeat_while_steps_move():
    import io

    from dagtune.progress import _Lines

    now = [0.0]
    stream = io.StringIO()
    lines = _Lines(stream, every=10.0, heartbeat=30.0, clock=lambda: now[0])

    def at(t: float, finished: int, trained: int) -> int:
        now[0] = t
        lines.show(ProgressState("s", 4, finished, trained, 40, None, None, t))
        return len(stream.getvalue().splitlines())

    assert at(0, 0, 0) == 1  # the first line
    assert at(5, 0, 3) == 1  # steps moved, no trial finished: quiet for now
    assert at(29, 0, 9) == 1
    assert at(31, 0, 10) == 2  # the heartbeat, 30 s after the last line
    assert at(70, 0, 10) == 2  # nothing moved: no heartbeat
    assert at(75, 1, 12) == 3  # a trial finished (10 s since the last line)
    assert at(80, 2, 14) == 3  # another one, too soon after
    assert at(86, 2, 14) == 4  # ... shown once 10 s have passed
    assert "2/4 trials finished, 14 steps trained" in stream.getvalue().splitlines()[-1]


def test_the_bar_in_a_terminal():
    import io

    from rich.console import Console

    from dagtune.progress import _Bar, _display

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    bar = _display(None, "terminal", Terminal(), 10.0, 30.0)
    assert isinstance(bar, _Bar)
    bar.close()
    console = Console(file=io.StringIO(), force_terminal=True, record=True, width=140)
    bar = _Bar(console.file, console=console)
    bar.show(ProgressState("digits", 4, 1, 10, 25, None, "val_acc", 1.0))
    bar.show(ProgressState("digits", 4, 3, 21, 32, 0.9312, "val_acc", 2.0), final=True)
    bar.close()
    text = console.export_text()
    assert "digits" in text and "3/4" in text and "trials" in text
    assert "21 steps trained, 11 saved by reuse" in text and "best val_acc 0.9312" in text
    assert "\x1b[" in console.file.getvalue()  # drawn for a terminal


def test_progress_degrades_to_log_lines_off_a_terminal(tmp_path):
    import io

    stream = io.StringIO()
    store = CheckpointStore(str(tmp_path))
    study = dt.Study(
        SyntheticTrainer, name="p", storage=str(tmp_path), executor=SimulatedExecutor(2, store=store)
    )
    inner = io.StringIO()
    with (
        watch(study, "val_loss", "min", show="terminal", stream=stream, interval=0.05),
        watch(study, show="terminal", stream=inner, interval=0.05),  # nested: shows nothing
    ):
        study.run(GridSearch(SPACE, metric="val_loss", mode="min", steps=8))
    assert inner.getvalue() == ""
    last = stream.getvalue().strip().splitlines()[-1]
    assert last.startswith(
        "dagtune p: 4/4 trials finished, 21 steps trained, 11 saved by reuse, best val_loss "
    )
    assert "\x1b[" not in stream.getvalue()  # no terminal control codes
    state = ProgressState("s", 3, 1, 10, 25, None, None, 1.0)
    assert state.saved == 15 and "best" not in state.line()


@pytest.mark.slow
def test_run_a_script_from_the_command_line(tmp_path):
    (tmp_path / "tiny.py").write_text(SCRIPT)
    runs = tmp_path / "runs"
    command = [
        sys.executable,
        "-m",
        "dagtune.cli",
        "run",
        "tiny.py",
        "--workers",
        "1",
        "--storage",
        str(runs),
    ]
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "dagtune tiny: 4/4 trials finished, 21 steps trained, 11 saved by reuse" in done.stderr
    assert "4 trials: trained 21 steps for 32 trial steps" in done.stdout
    status = invoke("status", str(runs), "--study", "tiny")
    assert status.exit_code == 0 and "32 trial steps need 21 unique steps" in status.output


@pytest.mark.slow
def test_dashboard_command_serves_the_page(storage):
    import urllib.request

    command = [sys.executable, "-m", "dagtune.cli", "dashboard", storage, "--port", "0", "--refresh", "0.5"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        first = process.stdout.readline()
        assert first.startswith("dagtune dashboard: http://127.0.0.1:"), first + process.stdout.read()
        url = first.split()[2]
        assert url.endswith("/dagtune")
        with urllib.request.urlopen(url, timeout=30) as response:
            page = response.read().decode()
        assert response.status == 200 and "Bokeh" in page and "dagtune" in page
    finally:
        process.terminate()
        process.wait(timeout=30)
    assert process.returncode is not None


def websocket_status(host: str, port: int, origin: str) -> str:
    """How the page's websocket answers a browser at `origin` (``"open"`` or the HTTP error)."""
    import asyncio

    from tornado.httpclient import HTTPClientError, HTTPRequest
    from tornado.websocket import websocket_connect

    async def attempt() -> str:
        request = HTTPRequest(f"ws://{host}:{port}/dagtune/ws", headers={"Origin": f"http://{origin}"})
        try:
            (await websocket_connect(request)).close()
        except HTTPClientError as error:
            return f"HTTP {error.code}"
        return "open"

    return asyncio.run(attempt())


@pytest.mark.slow
def test_the_page_on_every_interface_accepts_browsers_at_this_machines_addresses(storage):
    import socket

    import psutil

    from dagtune.dashboard.server import websocket_origins

    outside = sorted(
        entry.address
        for entries in psutil.net_if_addrs().values()
        for entry in entries
        if entry.family == socket.AF_INET and not entry.address.startswith("127.")
    )
    if not outside:
        pytest.skip("this machine has no IPv4 address but loopback")
    assert websocket_origins("127.0.0.1", 8790) == ["127.0.0.1:8790", "localhost:8790"]  # the default
    command = [
        sys.executable,
        "-m",
        "dagtune.cli",
        "dashboard",
        storage,
        "--address",
        "0.0.0.0",
        "--port",
        "0",
    ]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        first = process.stdout.readline()
        assert first.startswith("dagtune dashboard: http://0.0.0.0:"), first + process.stdout.read()
        port = int(first.split()[2].split(":")[2].split("/")[0])
        assert f"http://{outside[0]}:{port}/dagtune" in process.stdout.readline()
        for origin in (outside[0], socket.gethostname(), "localhost"):  # what a browser may use
            assert websocket_status(outside[0], port, f"{origin}:{port}") == "open", origin
        assert websocket_status("127.0.0.1", port, f"evil.example:{port}") == "HTTP 403"
    finally:
        process.terminate()
        process.wait(timeout=30)


def _listed_values(output: str, title: str) -> list[float]:
    """The metric column of the ``best N trials by METRIC`` table in `output`, top to bottom."""
    lines = output[output.index(title) :].splitlines()
    rows = [line.split("│") for line in lines if line.startswith("│")]
    return [float(cells[4]) for cells in rows]


@pytest.mark.parametrize(
    "args, title, mode",
    [
        ((), "trials by val_acc", "max"),  # from the study's index
        (("--metric", "val_loss", "--mode", "min"), "trials by val_loss", "min"),  # from the journals
        (("--metric", "val_loss", "--mode", "max"), "trials by val_loss", "max"),
    ],
)
def test_status_lists_the_best_trials_best_first(storage, args, title, mode):
    """`status --study` lists its best trials in the order of the metric, not of trial ids."""
    out = invoke("status", storage, "--study", "sim", "--top", "3", *args)
    assert out.exit_code == 0, out.output
    values = _listed_values(out.output, title)
    assert len(values) == 3
    assert values == sorted(values, reverse=mode == "max"), out.output


def test_status_refuses_a_metric_no_trial_reported_and_a_negative_top(storage):
    out = CliRunner().invoke(main, ["status", storage, "--study", "sim", "--metric", "val_accuracy"])
    assert out.exit_code == 2, out.output
    assert (
        "Error: no trial of study 'sim' reported 'val_accuracy' (its metrics: loss, val_acc, val_loss)"
        in (out.output)
    )
    out = CliRunner().invoke(main, ["status", storage, "--study", "sim", "--top", "-1"])
    assert out.exit_code == 2 and "--top" in out.output
