"""A small grid study run as its own process by `test_durability_kill.py`: killed with
SIGKILL mid-study, then run again to finish.

usage: python durable_study_script.py STORAGE OPTIONS_JSON OUT_JSON STEP_LOG
"""

from __future__ import annotations

import json
import sys

from distributed import Client, LocalCluster
from durable_helpers import SlowTrainer

import dagtune as dt
from dagtune.algos import GridSearch
from dagtune.config import config_dumps

STEPS = 10
CHECKPOINT_EVERY = 2
WORKERS = 2
SPACE = dt.Grid(
    {
        "lr": [dt.Constant(0.1), dt.MultiStep(0.1, [4], 0.1), dt.Exponential(0.1, 0.9)],
        "batch_size": [128, dt.Steps([128, 256], [6])],
    }
)


def main(storage: str, options: dict, out: str, log: str) -> None:
    with (
        LocalCluster(
            n_workers=WORKERS,
            threads_per_worker=1,
            processes=False,  # in-process workers (inproc://, no network), killed with us
            dashboard_address="127.0.0.1:0",
        ) as cluster,
        Client(cluster) as client,
        dt.Study(
            SlowTrainer,
            {"delay": 0.1, "log": log},
            name="killed",
            storage=storage,
            storage_options=options,
            client=client,
            checkpoint_every=CHECKPOINT_EVERY,
            check_resume=0,  # the test counts the trainer's steps; the check trains steps of its own
        ) as study,
    ):
        result = study.run(GridSearch(SPACE, metric="val_loss", mode="min", steps=STEPS), timeout=300)
        trials = result.trials
        summary = {
            "metrics": {config_dumps(t.config): t.metrics for t in study.coordinator.trials.values()},
            "ids": [int(i) for i in trials.index],
            "status": list(trials["status"]),
            "report": result.report,
        }
    with open(out, "w") as file:
        json.dump(summary, file)


if __name__ == "__main__":
    main(sys.argv[1], json.loads(sys.argv[2]), sys.argv[3], sys.argv[4])
