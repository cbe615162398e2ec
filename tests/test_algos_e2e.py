"""Each algorithm family end to end on a real Dask LocalCluster, tuning the digits CNN.

The worker processes must import the trainer's module (`digits`) to unpickle the tasks: they
are spawned with the parent's sys.path, so `examples/` goes on it here, before the cluster
starts (conftest does the same; this keeps the module runnable on its own).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

EXAMPLES = str(Path(__file__).resolve().parents[1] / "examples")
if EXAMPLES not in sys.path:
    sys.path.insert(0, EXAMPLES)

import pytest  # noqa: E402
from digits import DigitsTrainer  # noqa: E402

import dagtune as dt  # noqa: E402
from dagtune.algos._halving import ASHA, Hyperband  # noqa: E402
from dagtune.algos._median import MedianStopping  # noqa: E402
from dagtune.algos._pbt import PBT, Exploit  # noqa: E402
from dagtune.config import config_first_difference  # noqa: E402
from dagtune.study import Study, run_alone  # noqa: E402

pytestmark = pytest.mark.slow

KWARGS = {"hidden": 8}

# schedules branching only at rung steps (1, 3) and at step 0: promotions never recompute
SPACE = dt.Grid(
    {
        "lr": [dt.Constant(0.05), dt.Constant(0.1), dt.MultiStep(0.1, [3], 0.3), dt.Constant(0.005)],
        "momentum": [0.9, dt.Steps([0.5, 0.9], [1])],
        "batch_size": [64],
        "weight_decay": [0.0],
    }
)


def run(client, tmp_path, name, algorithm):
    started = time.perf_counter()
    with Study(DigitsTrainer, KWARGS, name=name, storage=tmp_path, client=client) as study:
        result = study.run(algorithm, timeout=120)
    report = result.report
    print(
        f"{name}: {report['trials']} trials, trial/unique/executed steps "
        f"{report['trial_steps']}/{report['unique_steps']}/{report['executed_steps']}, "
        f"best val_acc {result.best.metrics['val_acc']:.3f}, {time.perf_counter() - started:.1f} s"
    )
    return study, result


def assert_matches_training_alone(trial):
    alone = run_alone(DigitsTrainer, trial.config, trial.steps, KWARGS)
    assert [metrics for _, metrics in trial.curve] == alone


def test_asha_on_digits(client, tmp_path):
    algo = ASHA(SPACE, "val_acc", "max", max_steps=9, min_steps=1, eta=3)
    _, result = run(client, tmp_path, "asha", algo)
    report = result.report
    assert report["executed_steps"] == report["unique_steps"] < report["trial_steps"]
    # promotions are asynchronous: how many reach rung 3 depends on the order results arrive
    # (the top third of 3..8 results so far), but every config starts and one reaches the top
    reached = [sum(t.steps >= r for t in algo.trials) for r in (1, 3, 9)]
    assert reached[0] == 8 and 1 <= reached[1] <= 3 and reached[2] >= 1
    assert result.best.steps == 9 and result.best.metrics["val_acc"] > 0.85
    assert_matches_training_alone(algo.trials[result.best.id])


def test_hyperband_on_digits(client, tmp_path):
    algo = Hyperband(SPACE, "val_acc", "max", max_steps=6, min_steps=2, eta=3)  # brackets: 3 x 2..6, 2 x 6
    _, result = run(client, tmp_path, "hyperband", algo)
    assert result.report["executed_steps"] == result.report["unique_steps"]
    assert [(t.tag, t.steps) for t in algo.trials].count((0, 6)) == 1
    assert result.best.metrics["val_acc"] > 0.85


def test_median_stopping_on_digits(client, tmp_path):
    algo = MedianStopping(SPACE, "val_acc", "max", max_steps=6, grace=2, min_samples=2)
    _, result = run(client, tmp_path, "median", algo)
    report = result.report
    stopped = [t for t in algo.trials if t.status == "stopped"]
    assert stopped and all(t.reported < 6 for t in stopped)
    # a worker learns of a stop a moment late, so a stopped trial's own stage may run a step or
    # two past it; nothing else is trained beyond the unique steps
    overrun = sum(6 - t.reported for t in stopped)
    assert report["unique_steps"] <= report["executed_steps"] <= report["unique_steps"] + overrun
    assert report["executed_steps"] < dt.unique_steps((c, 6) for c in SPACE)  # stopping saved work
    for trial in algo.trials:
        if trial.status == "completed":
            assert trial.steps == 6
    assert result.best.metrics["val_acc"] > 0.85


def test_pbt_on_digits(client, tmp_path):
    algo = PBT(
        SPACE,
        "val_acc",
        "max",
        max_steps=6,
        interval=2,
        population=4,
        mutate=["lr"],
        resample_probability=0.0,
        seed=0,
    )
    study, result = run(client, tmp_path, "pbt", algo)
    assert result.report["executed_steps"] == result.report["unique_steps"]
    exploits = [t for t in algo.trials if isinstance(t.tag, Exploit)]
    assert len(exploits) == 2 * 1  # one of 4 members replaced at steps 2 and 4
    for trial in exploits:
        donor = algo.trials[trial.tag.donor]
        branch = config_first_difference(trial.config, donor.config, 0, trial.steps)
        assert branch == trial.tag.step
        assert any(study.plan.nodes[n].start == branch for n in study.plan.path(trial.node))
    assert result.best.steps == 6 and result.best.metrics["val_acc"] > 0.85
    assert_matches_training_alone(max(exploits, key=lambda t: t.steps))
