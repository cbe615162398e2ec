"""The resume check's cost: the same work with `check_resume=1` (the default) and `check_resume=0`.

At each worker's first checkpoint of a model, the check builds a second trainer, loads the
checkpoint into it and trains one step beside the trainer that saved it (where the path ends
at that checkpoint, the trainer trains that step too and is not kept in memory afterwards),
then compares digests of their states. Its cost is one trainer build, one checkpoint load,
one or two steps and a few state digests per worker and model, whatever the study's length.

Measured side by side, alternating which setting goes first: `run_alone` of the digits CNN
written by hand (`examples/digits_trainer.py`; its check runs after the first step, in
memory), best of 5 (3 in smoke mode); and the digits grid of `examples/digits.py` (36 trials
of 30 epochs in quick mode, 12 of 6 in smoke mode) as a study on the embedded cluster of 2
workers, each setting on fresh storage, 2 rounds (1 in smoke mode). For the study, wall time
and worker-seconds (`report["gpu_seconds"]`: the seconds stages held their workers) are both
given; worker-seconds are the less noisy measure of the work added on a busy machine.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import dagtune as dt
from dagtune.algos import GridSearch

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _trainers() -> tuple[type, type, Any]:
    if str(EXAMPLES) not in sys.path:
        sys.path.insert(0, str(EXAMPLES))
    from digits import DigitsTrainer, search_space
    from digits_trainer import HandWrittenDigitsTrainer

    return HandWrittenDigitsTrainer, DigitsTrainer, search_space


def _alone(trainer: type, config: dict, steps: int, check: int) -> float:
    began = time.perf_counter()
    dt.run_alone(trainer, config, steps, check_resume=check)
    return time.perf_counter() - began


def _study(trainer: type, space: list, steps: int, check: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as storage:
        began = time.perf_counter()
        with dt.Study(trainer, name="resume-check", storage=storage, workers=2, check_resume=check) as study:
            report = study.run(GridSearch(space, metric="val_acc", mode="max", steps=steps)).report
        return {
            "wall": time.perf_counter() - began,
            "worker_seconds": report["gpu_seconds"],
            "executed": report["executed_steps"],
        }


def benchmark(mode: str = "quick") -> dict[str, Any]:
    hand_written, fusible, search_space = _trainers()
    config = {
        "lr": dt.MultiStep(0.05, [15, 22], 0.1),
        "batch_size": 64,
        "momentum": 0.9,
        "weight_decay": 5e-4,
    }
    steps = {"smoke": 6, "quick": 30, "full": 30}[mode]
    repeats = {"smoke": 3, "quick": 5, "full": 7}[mode]
    _alone(hand_written, config, 2, 0)  # warm up: imports, the data set's cache
    alone: dict[int, list[float]] = {1: [], 0: []}
    for i in range(repeats):
        for check in (1, 0) if i % 2 == 0 else (0, 1):
            alone[check].append(_alone(hand_written, config, steps, check))
    space = list(search_space())
    trials, epochs = {"smoke": (12, 6), "quick": (36, 30), "full": (36, 30)}[mode]
    rounds = {"smoke": 1, "quick": 2, "full": 3}[mode]
    studies: dict[int, list[dict[str, float]]] = {1: [], 0: []}
    for i in range(rounds):
        for check in (1, 0) if i % 2 == 0 else (0, 1):
            studies[check].append(_study(fusible, space[:trials], epochs, check))
    best = {check: min(times) for check, times in alone.items()}
    study = {
        check: {
            "wall": min(r["wall"] for r in runs),
            "worker_seconds": min(r["worker_seconds"] for r in runs),
            "executed": runs[0]["executed"],
        }
        for check, runs in studies.items()
    }
    return {
        "alone_steps": steps,
        "alone_seconds": {str(k): v for k, v in best.items()},
        "alone_ratio": best[1] / best[0],
        "alone_extra_seconds": best[1] - best[0],
        "study_trials": trials,
        "study_epochs": epochs,
        "study": {str(k): v for k, v in study.items()},
        "study_wall_ratio": study[1]["wall"] / study[0]["wall"],
        "study_worker_ratio": study[1]["worker_seconds"] / study[0]["worker_seconds"],
        "study_extra_worker_seconds": study[1]["worker_seconds"] - study[0]["worker_seconds"],
    }


def markdown(result: dict[str, Any]) -> str:
    from perf.table import table

    alone, study = result["alone_seconds"], result["study"]
    rows = [
        {
            "what": f"run_alone, digits CNN, {result['alone_steps']} epochs (best of runs)",
            "on": alone["1"],
            "off": alone["0"],
            "ratio": result["alone_ratio"],
        },
        {
            "what": f"study wall time, digits grid ({result['study_trials']} trials x {result['study_epochs']} epochs, 2 workers)",
            "on": study["1"]["wall"],
            "off": study["0"]["wall"],
            "ratio": result["study_wall_ratio"],
        },
        {
            "what": "study worker-seconds (the same studies)",
            "on": study["1"]["worker_seconds"],
            "off": study["0"]["worker_seconds"],
            "ratio": result["study_worker_ratio"],
        },
    ]
    columns = [
        ("what", "what"),
        ("on", "check_resume=1 (s)"),
        ("off", "check_resume=0 (s)"),
        ("ratio", "ratio"),
    ]
    return (
        f"{table(rows, columns)}\n\nThe check costs {result['alone_extra_seconds']:.2f} s in `run_alone` "
        f"(a {result['alone_ratio']:.3f}x ratio over {result['alone_steps']} epochs) and "
        f"{result['study_extra_worker_seconds']:.1f} worker-seconds in the study "
        f"({result['study_worker_ratio']:.3f}x its worker-seconds, {result['study_wall_ratio']:.3f}x its wall "
        f"time); both studies executed {study['1']['executed']} steps. A fixed cost per worker and model: "
        "the longer the study, the smaller the ratio."
    )
