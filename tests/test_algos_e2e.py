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
from dagtune.algos._bayes import BayesOpt  # noqa: E402
from dagtune.algos._halving import ASHA, Hyperband  # noqa: E402
from dagtune.algos._median import MedianStopping  # noqa: E402
from dagtune.algos._pbt import PBT, Exploit  # noqa: E402
from dagtune.algos._retune import Retune  # noqa: E402
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


def late_stop_overrun(study, trials) -> int:
    """The steps trained that no trial reached, checked to be only the late arrival of stops.

    A stop reaches the worker a little late: the worker reads its directives right after
    sending a step's results, before the coordinator has seen them, so a stopped trial's own
    stage trains on for a step, or a few if the coordinator answers slower than a step takes
    (a digits step takes a few hundredths of a second). Every trained point has metrics in
    the search plan (``eval_every=1``), so the points trained are known exactly. Checked: no
    point was trained twice (executed steps = points trained); every point a trial reached was
    trained (their count is the unique steps); and every other point lies on a stopped trial's
    own path, in one run straight after the step it was stopped at. Returns how many."""
    report = study.coordinator.report(trials)
    plan = study.plan
    trained = {(node, step) for node in plan.nodes for step in plan.nodes[node].metrics}
    reached = set()
    for trial in trials:
        upto = trial.steps if trial.status == "completed" else trial.reported
        reached |= {(n, s) for n, start, end in trial.segments for s in range(start + 1, min(end, upto) + 1)}
    assert report["executed_steps"] == len(trained)  # nothing was trained twice
    assert reached <= trained and len(reached) == report["unique_steps"]
    extra = trained - reached
    for trial in trials:
        if trial.status != "stopped":
            continue
        path = [(n, s) for n, start, end in trial.segments for s in range(start + 1, end + 1)]
        run = [p for p in path[trial.reported :] if p in extra]
        assert run == path[trial.reported : trial.reported + len(run)]  # contiguous after the stop
        extra -= set(run)
    assert not extra  # nothing else was trained
    return report["executed_steps"] - report["unique_steps"]


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
    study, result = run(client, tmp_path, "median", algo)
    report = result.report
    stopped = [t for t in algo.trials if t.status == "stopped"]
    assert stopped and all(t.reported < 6 for t in stopped)
    # a stop reaches the worker a moment late: its own stage may train on a step or a few;
    # nothing else is trained beyond the unique steps (see `late_stop_overrun`)
    overrun = late_stop_overrun(study, algo.trials)
    print(f"median: {len(stopped)} stopped; {overrun} steps trained after a stop")
    assert report["unique_steps"] <= report["executed_steps"] == report["unique_steps"] + overrun
    assert overrun <= sum(6 - t.reported for t in stopped)
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


def test_bayesopt_with_asha_stopping_on_digits(client, tmp_path):
    space = dt.Random(
        {
            "lr": dt.loguniform(0.003, 0.3),
            "momentum": dt.uniform(0.0, 0.9),
            "batch_size": 64,
            "weight_decay": 0.0,
        }
    )
    algo = BayesOpt(
        space, "val_acc", "max", steps=6, n=8, n_initial=4, early_stopping="asha", min_steps=2, seed=0
    )
    study, result = run(client, tmp_path, "bayes", algo)
    report = result.report
    stopped = [t for t in algo.trials if t.status == "stopped"]
    assert len(algo.trials) == 8 and stopped and all(t.reported == 2 for t in stopped)  # at the rung
    assert all(t.steps == 6 for t in algo.trials if t.status == "completed")
    # its configs share no prefix, and stops arrive a moment late (as for MedianStopping)
    overrun = late_stop_overrun(study, algo.trials)
    assert report["executed_steps"] == report["unique_steps"] + overrun == report["trial_steps"] + overrun
    assert result.best.steps == 6 and result.best.metrics["val_acc"] > 0.85
    assert_matches_training_alone(algo.trials[result.best.id])


def test_retune_on_digits(client, tmp_path):
    space = {"lr": dt.loguniform(0.003, 0.3), "momentum": dt.uniform(0.0, 0.9)}
    initial = {"lr": 0.05, "momentum": 0.9, "batch_size": 64, "weight_decay": 0.0}
    algo = Retune(
        space,
        "val_loss",
        "min",
        max_steps=16,
        initial=initial,
        branches=2,
        trial_steps=4,
        max_trial_steps=8,
        windows=4,
        max_settings=4,
        seed=0,
    )
    _, result = run(client, tmp_path, "retune", algo)
    report = result.report
    assert report["executed_steps"] == report["unique_steps"] < report["trial_steps"]  # branches share
    assert len(algo.rounds) >= 2 and all(len(r.branches) >= 3 for r in algo.rounds)
    for later in algo.rounds[1:]:  # every re-tuning continues the schedule up to its fork
        assert later.fork > 0
        assert all(config_first_difference(b.config, later.base, 0, 16) >= later.fork for b in later.branches)
    winner = algo.winner
    assert result.best.id == winner.id and winner.steps == 16 and winner.config == algo.schedule
    assert winner.metrics["val_acc"] > 0.9
    assert_matches_training_alone(winner)  # the discovered schedule, trained alone, gives the same
