"""The package's face is lazy: what reads a store (the command line's status and tree,
`open_results`, the study index, the page) never loads torch, and every public name is still
there by the same name (docs/architecture.md, "Imports inside functions")."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import dagtune as dt
import dagtune.coordinator
from dagtune.algos import GridSearch
from dagtune.checkpoints import CheckpointStore
from dagtune.sim import SimulatedExecutor, SyntheticTrainer

ROOT = Path(__file__).resolve().parent.parent

#: Prints which heavy libraries the process loaded when it exits (after the command's exit too).
REPORT = textwrap.dedent(
    """
    import atexit, sys
    atexit.register(lambda: print("LOADED", sorted(
        m for m in ("torch", "scipy", "sklearn") if m in sys.modules), file=sys.stderr))
    """
)


def loaded_after(code: str, *args: str) -> list[str]:
    """The heavy libraries a fresh interpreter holds after running `code` with `args`."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", REPORT + code, *args], capture_output=True, text=True, env=env, timeout=120
    )
    line = next(line for line in done.stderr.splitlines() if line.startswith("LOADED"))
    return ast.literal_eval(line.removeprefix("LOADED "))


@pytest.fixture(scope="module")
def storage(tmp_path_factory):
    """Storage holding one finished simulated study, "sim"."""
    path = str(tmp_path_factory.mktemp("lazy") / "runs")
    space = dt.Grid({"lr": [dt.Constant(0.1), dt.MultiStep(0.1, [4], 0.1)], "momentum": [0.9, 0.5]})
    with dt.Study(
        SyntheticTrainer, name="sim", storage=path, executor=SimulatedExecutor(2, store=CheckpointStore(path))
    ) as study:
        study.run(GridSearch(space, metric="val_loss", mode="min", steps=6))
    return path


def test_the_faces_that_read_a_store_load_no_torch():
    code = textwrap.dedent(
        """
        import dagtune.errors, dagtune.cli, dagtune.results, dagtune.study_index
        import dagtune.dashboard.snapshot, dagtune.dashboard.server
        import dagtune as dt
        dt.DagtuneError, dt.DagtuneWarning, dt.open_results, dt.StudyResults, dt.CheckpointStore
        dt.TrialsFailedWarning, dt.UnguardedMainError, dt.StudyInUseError, dt.Grid, dt.uniform
        """
    )
    assert loaded_after(code) == []


@pytest.mark.parametrize("command", [["--help"], ["status"], ["status", "--study", "sim"], ["tree"]])
def test_status_and_tree_on_a_stored_study_load_no_torch(storage, command):
    args = command if command == ["--help"] else [command[0], storage, *command[1:]]
    code = "from dagtune.cli import main\nmain(sys.argv[1:])"
    assert loaded_after(code, *args) == []


def test_open_results_loads_no_torch(storage):
    code = "import dagtune as dt\nr = dt.open_results(sys.argv[1], 'sim')\nassert len(r.trials) == 4"
    assert loaded_after(code, storage) == []


def test_every_public_name_is_there_by_the_same_name():
    assert sorted(dt.__all__) == sorted(set(dt.__all__))
    for name in dt.__all__:
        value = getattr(dt, name)
        module = sys.modules[getattr(value, "__module__", None) or value.__name__]
        assert module.__name__.startswith("dagtune")
    assert dt.FusionWarning is sys.modules["dagtune.fusion"].FusionWarning
    assert issubclass(dt.FusionWarning, dt.DagtuneWarning)
    assert dt.Study is sys.modules["dagtune.study"].Study and dt.fusion is sys.modules["dagtune.fusion"]
    assert set(dt.__all__) <= set(dir(dt)) and dt.__version__
    assert dt.config.normalize_config is sys.modules["dagtune.config"].normalize_config  # any submodule
    for face in (dt, dagtune.coordinator):
        with pytest.raises(AttributeError, match="no attribute 'nothing_here'"):
            face.nothing_here  # noqa: B018
    assert set(dagtune.coordinator.__all__) <= set(dir(dagtune.coordinator))
    from dagtune import Trainer, algos

    assert Trainer is dt.Trainer and algos.GridSearch is GridSearch
