"""The dagtune command: storage views on a simulated study (fast), one-line errors for user
mistakes, and `dagtune run` for real as a console script on the embedded cluster (slow)."""

from __future__ import annotations

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


def test_setups_load_from_functions_and_dicts(tmp_path):
    from dagtune.launch import load_setup

    (tmp_path / "good.py").write_text(SCRIPT)
    setup = load_setup(str(tmp_path / "good.py"))
    assert setup.name == "tiny" and setup.trainer is SyntheticTrainer
    assert load_setup(f"{tmp_path / 'good.py'}:as_dict").algorithm.metric == "val_loss"


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
