"""The README's "After a study" section runs as pasted: its scripts in fresh processes (the
study on the embedded cluster, as a user runs it), then its ``dagtune export`` lines, with
their words as pasted, through the ``dagtune`` command's entry point (`dagtune.cli.main`) in
this process: a fresh process each would only add a Python start and torch's import."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from dagtune.cli import main

ROOT = Path(__file__).resolve().parent.parent


def section_blocks(title: str) -> list[tuple[str, str]]:
    """``(language, code)`` of every fenced block of the README section `title`."""
    text = (ROOT / "README.md").read_text()
    start = text.index(f"\n## {title}\n")
    end = text.index("\n## ", start + 1)
    return re.findall(r"```(\w+)\n(.*?)```", text[start:end], flags=re.S)


def run(args: list[str], cwd: Path, timeout: float = 540) -> str:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{args} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.mark.slow
def test_the_after_a_study_section_runs_as_pasted(tmp_path, monkeypatch):
    pytest.importorskip("tensorboard")
    pytest.importorskip("pytorch_lightning")
    blocks = section_blocks("After a study")
    python = [code for language, code in blocks if language == "python"]
    shell = [code for language, code in blocks if language == "bash"]
    assert len(python) == 3 and len(shell) == 1
    for name, code in zip(("after_study.py", "analyse.py", "lit.py"), python):
        (tmp_path / name).write_text(code)
    out = run([sys.executable, "after_study.py"], tmp_path)
    assert "val_acc" in out and "lr/schedule" in out
    assert (tmp_path / "tensorboard" / "after" / "trial-0").is_dir()
    assert (tmp_path / "csv" / "after" / "progress.csv").is_file()
    best = torch.load(tmp_path / "best.pt", weights_only=True)
    run([sys.executable, "analyse.py"], tmp_path)
    monkeypatch.chdir(tmp_path)  # the lines' relative paths, as in the user's terminal
    for line in shell[0].splitlines():
        command = line.split("#")[0].split()
        assert command[0] == "dagtune"
        done = CliRunner().invoke(main, command[1:])
        assert done.exit_code == 0, f"{line} failed:\n{done.output}\n{done.exception!r}"
    exported = torch.load(tmp_path / "best.pt", weights_only=True)  # the export wrote it again
    assert exported.keys() == best.keys() and all(
        torch.equal(a, b) for a, b in zip(exported["model"].values(), best["model"].values())
    )
    assert torch.load(tmp_path / "t3.pt", weights_only=True).keys() == best.keys()
    out = run([sys.executable, "lit.py"], tmp_path)
    assert "val_acc" in out
