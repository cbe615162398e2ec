"""ASHA over configs that share a warm-up (issue 24; `perf/RESULTS.md` section 9t): does a
trial cost more when there are more configs?

Every config starts with the same step (lr 0.001, batch size 32: a warm-up), then differs
(20 learning rates x as many batch sizes as needed). ASHA (27 steps, eta 3) on the
simulator (16 workers, no storage) announces every config it has not submitted yet
(`Algorithm.prospects`), and each segment a task runs looks for where those would branch
off it (`dagtune.coordinator._branches`). Printed per trial, for each count of configs: the
coordinator's CPU and the config comparisons made for announced configs.

    PYTHONPATH=$PWD python -m perf.asha_warmup 200 800 3200

Not a section of `python -m perf`: a diagnostic that prints its figures.
"""

from __future__ import annotations

import sys
import time

import dagtune as dt
import dagtune.coordinator._branches as branches
from dagtune.algos import ASHA
from dagtune.sim import SimulatedExecutor, SyntheticTrainer


def configs(n: int) -> list[dict]:
    """`n` configs sharing their first step."""
    return [
        {"lr": dt.Steps([0.001, 0.01 * (1 + i % 20)], [1]), "batch_size": dt.Steps([32, 64 + i // 20], [1])}
        for i in range(n)
    ]


def measure(n: int) -> tuple[float, float]:
    """Milliseconds of CPU and announced-config comparisons per trial of ASHA over `n` configs."""
    compare, calls = branches.config_first_difference, 0

    def counted(*args):
        nonlocal calls
        calls += 1
        return compare(*args)

    branches.config_first_difference = counted
    try:
        study = dt.Study(SyntheticTrainer, executor=SimulatedExecutor(16))
        began = time.process_time()
        study.run(ASHA(configs(n), "val_loss", "min", max_steps=27, eta=3))
        used = time.process_time() - began
        study.close()
    finally:
        branches.config_first_difference = compare
    return 1000 * used / n, calls / n


def main(counts: list[int]) -> None:
    for n in counts:
        ms, comparisons = measure(n)
        print(
            f"{n} configs: {ms:.2f} ms of CPU and {comparisons:.0f} announced-config comparisons per trial",
            flush=True,
        )


if __name__ == "__main__":
    main([int(arg) for arg in sys.argv[1:]] or [200, 800, 3200])
