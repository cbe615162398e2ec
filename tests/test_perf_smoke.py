"""`python -m perf --smoke` still runs every benchmark and writes its report."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_perf_smoke_runs_every_benchmark(tmp_path):
    completed = subprocess.run(
        [sys.executable, "-m", "perf", "--smoke", "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    results = json.loads((tmp_path / "results.json").read_text())
    assert set(results["benchmarks"]) == {
        "paper",
        "multistudy",
        "raytune",
        "planner_bench",
        "dispatch",
        "checkpoint_io",
        "fusion",
        "surrogate",
        "scale",
        "resume_check",
        "all_three",
        "stored_reads",
    }
    paper = results["benchmarks"]["paper"]["studies"]
    assert all(
        s["runs"]["dagtune critical path"]["executed_steps"]
        <= s["runs"]["trial-based FIFO"]["executed_steps"]
        for s in paper
    )
    scale = results["benchmarks"]["scale"]["rows"]
    assert all(r["executed"] == r["unique"] for r in scale)
    assert {r["planner"] for r in scale} == {"incremental", "rebuild"}
    report = (tmp_path / "RESULTS.md").read_text()
    assert "## 1. The paper's single studies" in report and "## 8. Hyper-parameter transfer" in report
