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
    from dagtune.mainguard import UnguardedMainError, check_main_guard

    def start():
        try:
            check_main_guard({method!r})
            print("allowed")
        except UnguardedMainError as error:
            print("refused:", error)
"""


@pytest.mark.parametrize(
    ("body", "method", "expected"),
    [
        ("start()", "spawn", "refused: this study is started by the top-level code of script.py (line 11)"),
        (
            "start()",
            "forkserver",
            "refused: this study is started by the top-level code of script.py (line 11)",
        ),
        ("start()", "fork", "allowed"),  # fork imports nothing again
        ('if __name__ == "__main__":\n    start()', "spawn", "allowed"),
        ('if "__main__" == __name__:\n    start()', "spawn", "allowed"),
        (
            'if __name__ == "__main__":\n    pass\nstart()',
            "spawn",
            "refused: this study is started by the top-level code of script.py (line 13)",
        ),
        (
            "def main():\n    start()\n\nmain()",
            "spawn",
            "refused: this study is started by the top-level code of script.py (line 14)",
        ),
    ],
)
def test_the_scripts_own_process_is_refused_outside_the_guard(tmp_path, body, method, expected):
    done = run(tmp_path, textwrap.dedent(CHECK.format(method=method)) + "\n" + body + "\n")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().startswith(expected), done.stdout


def test_a_worker_importing_the_script_is_refused(tmp_path):
    """What a spawned worker does: import the main script as ``__mp_main__``."""
    (tmp_path / "script.py").write_text(textwrap.dedent(CHECK.format(method="spawn")) + "\nstart()\n")
    done = run(tmp_path, "import runpy\nrunpy.run_path('script.py', run_name='__mp_main__')\n", "worker.py")
    assert done.stdout.startswith(
        "refused: a study was started while a Dask worker process imported the main script script.py"
    ), done.stdout + done.stderr


def test_notebooks_and_python_c_are_never_refused(tmp_path):
    code = textwrap.dedent(CHECK.format(method="spawn")) + "\nstart()\n"
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
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
