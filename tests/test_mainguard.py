"""A study started by a script's top-level code without ``if __name__ == "__main__":``
(`dagtune.mainguard`): refused at once with an error saying what to write, in the script's
process and in a Dask worker that imports the script, instead of a hang or pages of
multiprocessing tracebacks. Real scripts, run as subprocesses with a timeout."""

from __future__ import annotations

import os
import py_compile
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def run(
    tmp_path: Path, code: str, name: str = "script.py", timeout: int = 120
) -> subprocess.CompletedProcess:
    (tmp_path / name).write_text(code)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(
        [sys.executable, name], cwd=tmp_path, capture_output=True, text=True, timeout=timeout, env=env
    )


CHECK = """
    import importlib.util

    spec = importlib.util.spec_from_file_location("mainguard", {path!r})  # alone: no torch to import
    mainguard = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mainguard)


    def start():
        try:
            mainguard.check_main_guard({method!r})
            print("allowed")
        except mainguard.UnguardedMainError as error:
            print("refused:", error)
"""


def check(method: str = "spawn") -> str:
    """A script's head: `start()` does what starting the embedded cluster checks first."""
    return textwrap.dedent(CHECK.format(path=str(ROOT / "dagtune" / "mainguard.py"), method=method))


@pytest.mark.parametrize(
    ("body", "method", "refused_at"),
    [
        ("start()", "spawn", "start()"),
        ("start()", "forkserver", "start()"),
        ("start()", "fork", None),  # fork imports nothing again
        ('if __name__ == "__main__":\n    start()', "spawn", None),
        ('if "__main__" == __name__:\n    start()', "spawn", None),
        ('if __name__ == "__main__":\n    pass\nstart()', "spawn", "start()"),
        ("def main():\n    start()\n\nmain()", "spawn", "main()"),
    ],
)
def test_the_scripts_own_process_is_refused_outside_the_guard(tmp_path, body, method, refused_at):
    script = check(method) + "\n" + body + "\n"
    done = run(tmp_path, script)
    assert done.returncode == 0, done.stderr
    if refused_at is None:
        assert done.stdout.strip() == "allowed"
    else:
        line = script.splitlines().index(refused_at) + 1
        assert done.stdout.startswith(
            f"refused: this study is started by the top-level code of script.py (line {line}), outside "
            '`if __name__ == "__main__":`. Its Dask workers start as new Python processes that import '
            "script.py again"
        ), done.stdout


def test_a_worker_importing_the_script_is_refused(tmp_path):
    """What a spawned worker does: import the main script as ``__mp_main__``."""
    (tmp_path / "script.py").write_text(check() + "\nstart()\n")
    done = run(tmp_path, "import runpy\nrunpy.run_path('script.py', run_name='__mp_main__')\n", "worker.py")
    assert done.stdout.startswith(
        "refused: a study was started while a Dask worker process imported the main script script.py"
    ), done.stdout + done.stderr


def test_a_packages_main_is_not_imported_again_so_it_is_never_refused(tmp_path):
    """``python -m package`` runs the package's ``__main__.py``, which multiprocessing never
    imports again (``python -m perf`` starts its studies that way); ``python -m package.mod``
    is imported again."""
    (tmp_path / "tool").mkdir()
    (tmp_path / "tool" / "__init__.py").write_text("")
    for module, expected in (
        ("__main__", "allowed"),
        ("run", "refused: this study is started by the top-level code of run.py"),
    ):
        (tmp_path / "tool" / f"{module}.py").write_text(check() + "\nstart()\n")
        name = "tool" if module == "__main__" else f"tool.{module}"
        done = subprocess.run(
            [sys.executable, "-m", name], cwd=tmp_path, capture_output=True, text=True, timeout=60
        )
        assert done.stdout.startswith(expected), done.stdout + done.stderr


def test_python_c_is_never_refused(tmp_path):
    code = check() + "\nstart()\n"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert done.stdout.strip() == "allowed", done.stderr


QUICKSTART = """
    import torch
    import dagtune as dt
    from dagtune.algos import GridSearch


    class MyTrainer(dt.Trainer):
        def __init__(self, seed=0):
            self.model = torch.nn.Linear(2, 1)
            self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)

        def setup(self, hp):
            for group in self.optimizer.param_groups:
                group["lr"] = hp["lr"]

        def train(self):
            loss = self.model(torch.randn(8, 2)).pow(2).mean()
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()
            return {"loss": loss.item()}

        def evaluate(self):
            return {"val_loss": self.model.weight.norm().item()}

        def state_dict(self):
            return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}

        def load_state_dict(self, state):
            self.model.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])


    space = dt.Grid({"lr": [0.1, 0.01]})
    with dt.Study(MyTrainer, name="quickstart", storage="./dagtune-runs") as study:
        result = study.run(GridSearch(space, metric="val_loss", mode="min", steps=2))
    print(result.best)
"""


@pytest.mark.slow
def test_the_unguarded_quickstart_fails_at_once_saying_what_to_write(tmp_path):
    """The README's old Quickstart pasted into a file: before, its workers re-ran it and
    died in multiprocessing's bootstrapping errors (or waited forever)."""
    source = textwrap.dedent(QUICKSTART)
    done = run(tmp_path, source, "quickstart.py")
    line = 1 + source.splitlines().index(
        'with dt.Study(MyTrainer, name="quickstart", storage="./dagtune-runs") as study:'
    )
    assert done.returncode == 1
    assert (
        "dagtune.mainguard.UnguardedMainError: this study is started by the top-level code of "
        f'quickstart.py (line {line}), outside `if __name__ == "__main__":`.'
    ) in done.stderr, done.stderr
    assert "bootstrapping" not in done.stderr and "Nanny" not in done.stderr
    assert not (tmp_path / "dagtune-runs" / "studies").exists()  # refused before the study opened


@pytest.mark.slow
def test_a_script_whose_source_cant_be_read_is_refused_by_its_workers(tmp_path):
    """Shipped compiled (no source to read): the script's process can't tell, so its workers,
    importing it, refuse; the run ends instead of waiting for workers that never come."""
    (tmp_path / "quickstart.py").write_text(textwrap.dedent(QUICKSTART))
    py_compile.compile(str(tmp_path / "quickstart.py"), cfile=str(tmp_path / "compiled.pyc"))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, "compiled.pyc"], cwd=tmp_path, capture_output=True, text=True, timeout=180, env=env
    )
    assert done.returncode != 0
    assert (
        "UnguardedMainError: a study was started while a Dask worker process imported the main script"
        in done.stderr
    )
    assert "bootstrapping" not in done.stderr
