"""The README's Python snippets, as pasted.

The Quickstart is a complete script: it runs as ``python quickstart.py`` (its study on the
embedded cluster, under the ``if __name__ == "__main__":`` guard), and the snippets after it
that start a study continue that script (its imports, `MyTrainer` and `space`). Snippets
that need infrastructure this machine does not have (a scheduler at ``tcp://login:8786``, a
Slurm cluster) are parsed and checked for the guard. Every snippet must be one of the kinds
below, so a new one gets a test."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import dagtune as dt
from dagtune.algos import GridSearch
from dagtune.sim import SimulatedExecutor

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
BLOCKS = re.findall(r"```python\n(.*?)```", README, flags=re.DOTALL)
QUICKSTART = BLOCKS[0]
GUARD = 'if __name__ == "__main__":'
#: snippets that need what this machine does not have, by a line they contain
ELSEWHERE = ('Client("tcp://login:8786")', "cluster = slurm(")


def section(title: str) -> str:
    """The text of the README section `title`, up to the next section."""
    start = README.index(f"\n## {title}\n")
    return README[start : README.index("\n## ", start + 1)]


#: the "After a study" section's scripts run as their own files in tests/test_readme_after.py
AFTER_A_STUDY = section("After a study")


def prelude(script: str) -> str:
    """The Quickstart's code before its guard: imports, the trainer, the space."""
    return script[: script.index(GUARD)]


def quickstart() -> dict:
    """The names the Quickstart's script defines before its guard."""
    namespace: dict = {"__name__": "readme_quickstart"}
    exec(compile(prelude(QUICKSTART), "README.md (Quickstart)", "exec"), namespace)
    return namespace


def kind(block: str) -> str:
    if block is QUICKSTART:
        return "quickstart"
    if any(marker in block for marker in ELSEWHERE):
        return "elsewhere"
    if f"```python\n{block}```" in AFTER_A_STUDY:
        return "after a study"
    if "Study(" in block:
        return "continues the quickstart"
    if "dt.open_results(" in block:
        return "reads the quickstart's storage"
    return "runs alone"


def study_calls_outside_the_guard(block: str) -> list[int]:
    """Lines of the block that open a study outside ``if __name__ == "__main__":``."""
    tree = ast.parse(block)
    guarded = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test) in (
            "__name__ == '__main__'",
            '__name__ == "__main__"',
        ):
            guarded.update(id(inner) for statement in node.body for inner in ast.walk(statement))
    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and ast.unparse(node.func).endswith("Study") and id(node) not in guarded
    ]


def run_script(tmp_path: Path, name: str, code: str) -> subprocess.CompletedProcess:
    (tmp_path / name).write_text(code)
    path = os.pathsep.join([str(ROOT / "examples"), str(ROOT), os.environ.get("PYTHONPATH", "")])
    return subprocess.run(
        [sys.executable, name],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": path},
    )


# --------------------------------------------------------------------------- fast


def test_every_snippet_parses_and_every_study_is_started_under_the_guard():
    assert len(BLOCKS) >= 6
    for block in BLOCKS:
        ast.parse(block)
        if "Study(" in block:
            assert GUARD in block, block
            assert study_calls_outside_the_guard(block) == [], block
    assert [kind(b) for b in BLOCKS].count("quickstart") == 1
    assert [kind(b) for b in BLOCKS].count("elsewhere") == len(ELSEWHERE)


def test_the_quickstart_trainer_is_correct_and_warns_about_nothing():
    """The Quickstart's trainer and space, in this process: run alone (its checks on), and
    its grid on the simulated executor, bit for bit the same, with no warning."""
    namespace = quickstart()
    trainer, space = namespace["MyTrainer"], namespace["space"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        study = dt.Study(trainer, executor=SimulatedExecutor(2))
        result = study.run(GridSearch(space, metric="val_acc", mode="max", steps=12))
    assert not result.failed and len(result._trials) == 6
    assert result.report["executed_steps"] == result.report["unique_steps"] < result.report["trial_steps"]
    for trial in result._trials[:2]:
        assert trial.metrics == dt.run_alone(trainer, trial.config, 12)[-1]


def test_the_snippets_that_run_alone():
    for block in BLOCKS:
        if kind(block) == "runs alone":
            exec(compile(block, "README.md", "exec"), {"dt": dt})


# --------------------------------------------------------------------------- as scripts


@pytest.mark.slow
def test_the_quickstart_runs_as_a_script_and_its_storage_reads_back(tmp_path, monkeypatch):
    done = run_script(tmp_path, "quickstart.py", QUICKSTART)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    first, *rest = done.stdout.splitlines()
    space = quickstart()["space"]
    assert float(first) == pytest.approx(dt.merge_rate((config, 12) for config in space))
    assert any(line.startswith("TrialResult(config=") for line in rest)
    assert "Warning" not in done.stderr, done.stderr[-3000:]
    monkeypatch.chdir(tmp_path)
    for block in BLOCKS:
        if kind(block) == "reads the quickstart's storage":
            namespace = {"dt": dt}
            exec(compile(block, "README.md", "exec"), namespace)
            assert len(namespace["results"].trials) == 6


@pytest.mark.slow
@pytest.mark.parametrize("index", [i for i, b in enumerate(BLOCKS) if kind(b) == "continues the quickstart"])
def test_the_snippets_that_start_a_study_run_in_the_quickstarts_script(tmp_path, index):
    done = run_script(tmp_path, "continued.py", prelude(QUICKSTART) + "\n" + BLOCKS[index])
    assert done.returncode == 0, BLOCKS[index] + done.stdout[-2000:] + done.stderr[-3000:]
    assert "Warning" not in done.stderr, done.stderr[-3000:]


def test_the_algorithm_table_names_real_arguments_and_each_budget():
    """Each `Name(...)` of the "Tuning algorithms" table names only arguments the class
    takes, and the first of each row its step budget (`steps` or `max_steps`) by the name
    the class takes (`RandomSearch(..., n, seed)` continues `GridSearch`'s)."""
    import inspect

    from dagtune import algos

    table = section("Tuning algorithms").split("| algorithm |", 1)[1].split("\n\n", 1)[0]
    rows = [re.findall(r"`(\w+)\(([^`]*)\)`", row.split(" | ")[0]) for row in table.splitlines()[2:]]
    assert sum(len(calls) for calls in rows) == 10, rows
    for calls in rows:
        for index, (name, arguments) in enumerate(calls):
            parameters = inspect.signature(getattr(algos, name)).parameters
            named = [a.split("=")[0].strip() for a in arguments.split(",")]
            named = [a for a in named if a != "..."]
            assert set(named) <= set(parameters), (name, sorted(set(named) - set(parameters)))
            budget = "steps" if "steps" in parameters else "max_steps"
            assert index or budget in named, f"{name}(...) in the README does not name its budget {budget!r}"
