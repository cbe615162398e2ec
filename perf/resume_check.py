"""The resume check's cost: the same work with `check_resume=1` (the default) and `check_resume=0`.

At each worker's first checkpoint of a model, the check builds a second trainer, loads the
checkpoint into it and trains one step beside the trainer that saved it (where the path ends
at that checkpoint, the trainer trains that step too and is not kept in memory afterwards),
then compares digests of their states. Its cost is one trainer build, one checkpoint load,
one or two steps and a few state digests per worker and model, whatever the study's length.

Measured side by side, alternating which setting goes first, in CPU seconds (on a machine
other work shares, wall time varies by tens of percent from run to run; the CPU time a
process spends varies far less): `run_alone` of the digits CNN written by hand
(`examples/digits_trainer.py`; its check runs after the first step, in memory), the median
of 7 runs each (1 run of 2 epochs in smoke mode); and the first 12 configs of the digits grid of
`examples/digits.py` (162 unique epochs of 30-epoch trials; 4 configs of 2 epochs in smoke mode) as a
study on the embedded cluster of 2 workers, each setting on fresh storage, the median of 3
rounds (1 in smoke mode): the CPU seconds of the two worker processes over the run (training,
checkpoints, the check, Dask's own work), and the wall time for reference.
"""

from __future__ import annotations

import contextlib
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import dagtune as dt
from dagtune.algos import GridSearch
from perf.smoke import shared_client

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _trainers() -> tuple[type, type, Any]:
    if str(EXAMPLES) not in sys.path:
        sys.path.insert(0, str(EXAMPLES))
    from digits import DigitsTrainer, search_space
    from digits_trainer import HandWrittenDigitsTrainer

    return HandWrittenDigitsTrainer, DigitsTrainer, search_space


def _alone(trainer: type, config: dict, steps: int, check: int) -> float:
    """CPU seconds of one `run_alone`."""
    began = time.process_time()
    dt.run_alone(trainer, config, steps, check_resume=check)
    return time.process_time() - began


def _study(trainer: type, space: list, steps: int, check: int, client: Any = None) -> dict[str, float]:
    """One study on a fresh embedded cluster (or `client`'s, in smoke mode) and fresh storage:
    its workers' CPU seconds over the run, its wall time and the steps it executed."""
    workers = None if client is not None else 2
    with tempfile.TemporaryDirectory() as storage:
        with dt.Study(
            trainer, name="resume-check", storage=storage, workers=workers, client=client, check_resume=check
        ) as study:
            study.client.run(_warm_up)  # torch imported in the workers: not part of the run
            before = study.client.run(time.process_time)
            began = time.perf_counter()
            report = study.run(GridSearch(space, metric="val_acc", mode="max", steps=steps)).report
            wall = time.perf_counter() - began
            after = study.client.run(time.process_time)
        return {
            "cpu": sum(after[w] - before[w] for w in before),
            "wall": wall,
            "executed": report["executed_steps"],
        }


def _warm_up() -> None:
    import dagtune.runner  # noqa: F401 (imports torch)


def benchmark(mode: str = "quick") -> dict[str, Any]:
    hand_written, fusible, search_space = _trainers()
    config = {
        "lr": dt.MultiStep(0.05, [15, 22], 0.1),
        "batch_size": 64,
        "momentum": 0.9,
        "weight_decay": 5e-4,
    }
    steps = {"smoke": 2, "quick": 30, "full": 30}[mode]
    repeats = {"smoke": 1, "quick": 7, "full": 9}[mode]
    _alone(hand_written, config, 2, 0)  # warm up: imports, the data set's cache
    alone: dict[int, list[float]] = {1: [], 0: []}
    for i in range(repeats):
        for check in (1, 0) if i % 2 == 0 else (0, 1):
            alone[check].append(_alone(hand_written, config, steps, check))
    space = list(search_space())
    trials, epochs = {"smoke": (4, 2), "quick": (12, 30), "full": (36, 30)}[mode]
    rounds = {"smoke": 1, "quick": 3, "full": 3}[mode]
    studies: dict[int, list[dict[str, float]]] = {1: [], 0: []}
    with contextlib.ExitStack() as stack:
        # smoke mode only checks the benchmark runs: its two studies share one cluster
        client = stack.enter_context(shared_client(2)) if mode == "smoke" else None
        for i in range(rounds):
            for check in (1, 0) if i % 2 == 0 else (0, 1):
                studies[check].append(_study(fusible, space[:trials], epochs, check, client))
    median = {check: statistics.median(times) for check, times in alone.items()}
    study = {
        check: {
            "cpu": statistics.median(r["cpu"] for r in runs),
            "wall": statistics.median(r["wall"] for r in runs),
            "executed": runs[0]["executed"],
        }
        for check, runs in studies.items()
    }
    return {
        "alone_steps": steps,
        "alone_seconds": {str(k): v for k, v in median.items()},
        "alone_runs": {str(k): v for k, v in alone.items()},
        "alone_ratio": median[1] / median[0],
        "alone_extra_seconds": median[1] - median[0],
        "study_trials": trials,
        "study_epochs": epochs,
        "study": {str(k): v for k, v in study.items()},
        "study_runs": {str(k): v for k, v in studies.items()},
        "study_wall_ratio": study[1]["wall"] / study[0]["wall"],
        "study_cpu_ratio": study[1]["cpu"] / study[0]["cpu"],
        "study_extra_cpu_seconds": study[1]["cpu"] - study[0]["cpu"],
    }


def markdown(result: dict[str, Any]) -> str:
    from perf.table import table

    alone, study = result["alone_seconds"], result["study"]
    grid = f"{result['study_trials']} configs of the digits grid x {result['study_epochs']} epochs, 2 workers"
    rows = [
        {
            "what": f"run_alone, digits CNN, {result['alone_steps']} epochs: CPU s (median)",
            "on": alone["1"],
            "off": alone["0"],
            "ratio": result["alone_ratio"],
        },
        {
            "what": f"study ({grid}): workers' CPU s (median)",
            "on": study["1"]["cpu"],
            "off": study["0"]["cpu"],
            "ratio": result["study_cpu_ratio"],
        },
        {
            "what": "the same studies' wall time (median)",
            "on": study["1"]["wall"],
            "off": study["0"]["wall"],
            "ratio": result["study_wall_ratio"],
        },
    ]
    columns = [("what", "what"), ("on", "check_resume=1"), ("off", "check_resume=0"), ("ratio", "ratio")]
    spread = ", ".join(
        f"{'on' if key == '1' else 'off'}: {min(v):.2f}-{max(v):.2f}"
        for key, v in result["alone_runs"].items()
    )
    return (
        f"{table(rows, columns)}\n\nThe check costs {result['alone_extra_seconds']:+.2f} CPU s in `run_alone` "
        f"({result['alone_ratio']:.3f}x over {result['alone_steps']} epochs; the runs spread over {spread}) and "
        f"{result['study_extra_cpu_seconds']:+.1f} CPU s of the workers in the study "
        f"({result['study_cpu_ratio']:.3f}x); both studies executed {study['1']['executed']} steps. It is a "
        "fixed cost per worker and model: the longer the study, the smaller the ratio."
    )
