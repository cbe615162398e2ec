"""`examples/fusion.py` end to end on the test cluster: its fused study (and the same study
unfused), and the same setup through ``dagtune run --fuse``."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner
from fusion import DigitsMLP, main, search_space

import dagtune as dt
from dagtune.cli import main as cli

pytestmark = pytest.mark.slow

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "fusion.py"


def test_the_example_fuses_its_grid_exactly(client, tmp_path, capsys):
    address = client.scheduler.address
    results = main(["--epochs", "4", "--compare", "--storage", str(tmp_path), "--scheduler", address])
    out = capsys.readouterr().out
    assert "fused: best val_acc" in out and "unfused: best val_acc" in out
    fused, unfused = results["fused"], results["unfused"]
    for result in (fused, unfused):
        report = result.report
        assert report["trials"] == 24
        assert (
            report["executed_steps"]
            == report["unique_steps"]
            == dt.unique_steps((c, 4) for c in search_space())
        )
    configs = list(search_space())  # the grid submits them in order: trial i is configs[i]
    for trial_id, curve in fused.curves.items():
        assert [m for _, m in curve] == dt.run_alone(DigitsMLP, configs[trial_id], 4, fused=True)
    # against unfused training: equal within rounding (the products sum in another order)
    assert fused.curves.keys() == unfused.curves.keys()
    for trial_id, curve in fused.curves.items():
        for (step, metrics), (other_step, other) in zip(curve, unfused.curves[trial_id], strict=True):
            assert step == other_step and metrics == pytest.approx(other, rel=1e-5, abs=1e-6)
    assert "largest difference of a final metric, fused against unfused:" in out


def test_dagtune_run_fuses_the_examples_setup(client, tmp_path):
    args = ["run", f"{EXAMPLE}:study_setup", "--scheduler", client.scheduler.address, "--fuse", "4"]
    out = CliRunner().invoke(cli, [*args, "--storage", str(tmp_path)])
    assert out.exit_code == 0, out.output
    unique = dt.unique_steps((c, 10) for c in search_space())
    assert f"24 trials: trained {unique} steps for 240 trial steps" in out.output
