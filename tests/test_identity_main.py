"""A trainer class of a user's script has one model identity however the script is started
(``python script.py``, ``python -m``, ``dagtune run script.py``, ``from script import X``),
studies an earlier dagtune recorded under ``__main__.X`` still reopen from the script, and a
class of another module with the same name is still another model (`dagtune.identity`)."""

from __future__ import annotations

import importlib.machinery
import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
from click.testing import CliRunner

import dagtune as dt
import dagtune.durable
from dagtune.algos import GridSearch
from dagtune.checkpoints import CheckpointStore
from dagtune.cli import main
from dagtune.identity import legacy_name, main_module_name, model_identity, trainer_name
from dagtune.restore import import_trainer
from dagtune.sim import SimulatedExecutor, SyntheticTrainer

ROOT = Path(__file__).resolve().parent.parent

#: a user's script: run as ``python mainident_quad.py STORAGE`` it runs study "s" on the
#: simulated executor and prints what it trained; ``dagtune run`` takes its `study_setup`
SCRIPT = '''
import json
import sys

import dagtune as dt
from dagtune.algos import GridSearch
from dagtune.checkpoints import CheckpointStore
from dagtune.launch import StudySetup
from dagtune.sim import SimulatedExecutor, SyntheticTrainer


class Quad(SyntheticTrainer):
    """The script's own trainer."""


def algorithm():
    return GridSearch(dt.Grid({"lr": [0.1, 0.2]}), metric="val_loss", mode="min", steps=4)


def study_setup():
    return StudySetup(trainer=Quad, algorithm=algorithm(), name="s")


def run(storage):
    executor = SimulatedExecutor(2, store=CheckpointStore(storage))
    with dt.Study(Quad, name="s", executor=executor, storage=storage) as study:
        trained = study.run(algorithm(), progress=False).report["executed_steps"]
    found = type(dt.open_results(storage, "s").load_trainer(0))  # imported by its recorded name
    return {"identity": study.identity, "trained": trained, "found": found is Quad}


if __name__ == "__main__":
    print(json.dumps(run(sys.argv[1])))
'''

#: another script of the user's, reopening the study with the class imported from the first
IMPORTER = """
import json
import sys

from mainident_quad import run

print(json.dumps(run(sys.argv[1])))
"""


def python(directory: Path, *args: str) -> dict:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    done = subprocess.run(
        [sys.executable, *args], cwd=directory, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture
def scripts(tmp_path: Path) -> Path:
    (tmp_path / "mainident_quad.py").write_text(SCRIPT)
    (tmp_path / "mainident_again.py").write_text(IMPORTER)
    return tmp_path


def opened_trainers(storage: str, name: str) -> list[str]:
    store = CheckpointStore(storage)
    journal = dagtune.durable.Journal(
        store.fs, f"{store.root}/studies/{name}/journal", header=dagtune.durable.records_header(name)
    )
    return [opened.trainer for opened in dagtune.durable.read_records(journal).opened]


# --------------------------------------------------------------------------- naming


def as_main(monkeypatch, file: str | None = None, spec: str | None = None) -> None:
    """Make ``__main__`` a script run from `file`, a module run with ``-m spec``, or (neither)
    an interactive session's."""
    module = types.ModuleType("__main__")
    module.__spec__ = None if spec is None else importlib.machinery.ModuleSpec(spec, None)
    if file is not None:
        module.__file__ = file
    monkeypatch.setitem(sys.modules, "__main__", module)


class Mained(SyntheticTrainer):
    """A trainer that says it was defined in ``__main__``."""


Mained.__module__ = "__main__"


@pytest.mark.parametrize(
    "file, spec, module",
    [
        ("/work/after_study.py", None, "after_study"),  # python after_study.py
        ("/work/pkg/mod.py", "pkg.mod", "pkg.mod"),  # python -m pkg.mod
        ("/work/pkg/__main__.py", "pkg.__main__", "pkg.__main__"),  # python -m pkg
        (None, None, None),  # a notebook, an interactive session, python -c
        ("/usr/bin/ipython", None, None),  # IPython's own launcher: no .py file
        ("/work/app/__main__.py", None, None),  # python app/ (a directory run as a script)
    ],
)
def test_a_main_class_is_named_by_the_module_its_file_imports_as(monkeypatch, file, spec, module):
    as_main(monkeypatch, file, spec)
    assert main_module_name() == module
    assert trainer_name(Mained) == f"{module or '__main__'}.Mained"
    assert legacy_name(Mained) == (None if module is None else "__main__.Mained")
    assert (
        legacy_name(SyntheticTrainer) is None
        and trainer_name(SyntheticTrainer) == "dagtune.sim.SyntheticTrainer"
    )


def test_the_script_running_finds_its_own_class_by_its_recorded_name(monkeypatch):
    as_main(monkeypatch, "/nowhere/mainident_nowhere.py")
    sys.modules["__main__"].Mained = Mained
    assert import_trainer("mainident_nowhere.Mained") is Mained  # not a second import of the file


# --------------------------------------------------------------------------- one identity


def test_a_script_run_then_imported_resumes_its_study_and_trains_nothing(scripts):
    first = python(scripts, "mainident_quad.py", "runs")
    assert first["trained"] == 8 and first["found"]
    again = python(scripts, "mainident_again.py", "runs")  # from mainident_quad import ...
    assert again == {**first, "trained": 0}
    storage = str(scripts / "runs")
    assert opened_trainers(storage, "s") == ["mainident_quad.Quad"] * 2


def test_dagtune_run_resumes_a_study_its_script_ran_and_trains_nothing(scripts, monkeypatch):
    from distributed import LocalCluster

    first = python(scripts, "mainident_quad.py", "runs")
    monkeypatch.syspath_prepend(str(scripts))
    with LocalCluster(n_workers=1, processes=False, dashboard_address="127.0.0.1:0") as cluster:
        args = ["run", str(scripts / "mainident_quad.py"), "--scheduler", cluster.scheduler_address]
        done = CliRunner().invoke(main, [*args, "--storage", str(scripts / "runs")])
    sys.modules.pop("mainident_quad", None)
    assert done.exit_code == 0, done.output
    assert "2 trials: trained 0 steps for 8 trial steps" in done.output
    assert opened_trainers(str(scripts / "runs"), "s") == ["mainident_quad.Quad"] * 2
    assert first["trained"] == 8


# --------------------------------------------------------------------------- legacy studies


def study(storage: str, trainer: type = Mained, name: str = "legacy", **options) -> dt.Study:
    executor = SimulatedExecutor(2, store=CheckpointStore(storage))
    return dt.Study(trainer, name=name, executor=executor, storage=storage, **options)


def trained(opened: dt.Study) -> int:
    grid = GridSearch(dt.Grid({"lr": [0.1, 0.2]}), metric="val_loss", mode="min", steps=4)
    return opened.run(grid, progress=False).report["executed_steps"]


def test_a_study_recorded_under_main_reopens_from_its_script(tmp_path, monkeypatch):
    """Recorded as an earlier dagtune recorded a script's class (``__main__.Mained``, as a
    notebook's class still is), the study reopens from the script run from its file (now
    ``mainident_legacy.Mained``): under its recorded identity, twice (the journals read whole,
    then its resume state), training nothing, and its sessions go on recording the name it
    has; a new study of the class is the file's module's."""
    storage = str(tmp_path / "runs")
    as_main(monkeypatch)  # no file: the name every __main__ class had
    with study(storage) as first:
        assert trained(first) == 8
    legacy = model_identity(Mained, {}, 0, name="__main__.Mained")
    assert first.identity == legacy
    as_main(monkeypatch, str(tmp_path / "mainident_legacy.py"))
    states = []
    real = dagtune.durable.read_state

    def read_state(store, name, identity, records, plan):
        resumed = real(store, name, identity, records, plan)
        states.append((identity, resumed is not None))
        return resumed

    monkeypatch.setattr(dagtune.durable, "read_state", read_state)
    for _ in range(2):
        with study(storage) as again:
            assert again.identity == legacy and trained(again) == 0
            assert [t.status for t in again.trials] == ["completed", "completed"]
    new = model_identity(Mained, {}, 0)
    assert new != legacy and trainer_name(Mained) == "mainident_legacy.Mained"
    assert states == [(new, False), (legacy, False), (new, False), (legacy, True)]
    assert opened_trainers(storage, "legacy") == ["__main__.Mained"] * 3
    with study(storage, name="fresh") as fresh:
        assert fresh.identity == new


def test_a_legacy_study_opened_with_the_class_imported_says_only_the_module_differs(tmp_path, monkeypatch):
    storage = str(tmp_path / "runs")
    as_main(monkeypatch)
    with study(storage) as first:
        first.submit({"lr": 0.1}, 2).result()
    imported = type("Mained", (SyntheticTrainer,), {"__module__": "mainident_imported"})
    with pytest.raises(ValueError) as refused:
        study(storage, imported)
    message = str(refused.value)
    assert message.startswith(
        f"study 'legacy' in {storage} was recorded with trainer __main__.Mained, this one is "
        "mainident_imported.Mained: the same class name, trainer arguments, seed and version; only "
        "the module differs"
    )
    assert "run that script with `python SCRIPT.py`" in message


def test_another_class_of_the_same_name_or_other_arguments_is_still_another_model(tmp_path, monkeypatch):
    storage = str(tmp_path / "runs")
    as_main(monkeypatch, str(tmp_path / "mainident_script.py"))
    with study(storage) as first:
        first.submit({"lr": 0.1}, 2).result()
    other = type("Mained", (SyntheticTrainer,), {"__module__": "mainident_other"})
    with pytest.raises(ValueError, match=r"recorded with trainer mainident_script\.Mained, this one is "):
        study(storage, other)  # refused, and told where the recorded class lives
    with pytest.raises(ValueError, match="from module mainident_script"):
        study(storage, other)
    with pytest.raises(ValueError, match="belongs to another model"):
        study(storage, Mained, trainer_kwargs={"dim": 4})
    as_main(monkeypatch)  # the same class from a session without a file: __main__.Mained
    with pytest.raises(ValueError, match=r"from module mainident_script \(`from mainident_script import"):
        study(storage)
    other_main = type("Mained", (SyntheticTrainer,), {"__module__": "__main__"})
    as_main(monkeypatch, str(tmp_path / "mainident_elsewhere.py"))  # another script's Mained
    with pytest.raises(ValueError, match="only the module differs"):
        study(storage, other_main)
