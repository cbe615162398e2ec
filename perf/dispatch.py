"""Dispatch overhead: what dagtune adds on top of Dask per stage.

A trainer that does nothing, so every second is overhead. Three measurements on the same
2-worker LocalCluster: raw Dask (all no-op tasks submitted at once), dagtune with one
independent one-step trial per stage (just-in-time submission: a finished stage's event
travels back before the next is submitted), and dagtune with chained stages (each trial
branches from the previous one's end, so consecutive stages continue in memory).
"""

from __future__ import annotations

import tempfile
import time
from typing import Any

import dagtune as dt

WORKERS = 2


class NoopTrainer(dt.Trainer):
    """Trains nothing: a step costs only dagtune's and Dask's own work."""

    def __init__(self):
        self.step = 0

    def setup(self, hp: dict) -> None:
        pass

    def train(self) -> dict:
        self.step += 1
        return {}

    def evaluate(self) -> dict:
        return {"step": float(self.step)}

    def state_dict(self) -> dict:
        return {"step": self.step}

    def load_state_dict(self, state: dict) -> None:
        self.step = state["step"]


def _noop(i: int) -> int:
    return i


def benchmark(mode: str = "quick") -> dict[str, Any]:
    from distributed import Client, LocalCluster

    from dagtune.cluster import glibc_thresholds

    n = {"smoke": 20, "quick": 300, "full": 1000}[mode]
    rows = []
    with (
        glibc_thresholds(),  # as in dagtune's embedded cluster (keeps os.environ clean too)
        LocalCluster(
            n_workers=WORKERS,
            threads_per_worker=1,
            host="127.0.0.1",
            dashboard_address="127.0.0.1:0",
            silence_logs=40,
        ) as cluster,
        Client(cluster) as client,
    ):
        client.run(lambda: __import__("dagtune.runner"))  # import torch in the workers first
        began = time.perf_counter()
        client.gather(client.map(_noop, range(n), pure=False))
        raw = time.perf_counter() - began
        rows.append({"what": "raw Dask tasks (all submitted at once)", "stages": n, "seconds": raw})
        with (
            tempfile.TemporaryDirectory() as storage,
            dt.Study(NoopTrainer, name="dispatch", storage=storage, client=client) as study,
        ):
            began = time.perf_counter()
            handles = [study.submit({"x": i}, 1) for i in range(n)]
            for handle in handles:
                handle.result()
            independent = time.perf_counter() - began
            rows.append({"what": "dagtune: independent one-step stages", "stages": n, "seconds": independent})
            chain = dt.Steps(list(range(n + 1)), list(range(1, n + 1)))
            began = time.perf_counter()
            for steps in range(1, n + 1):
                study.submit({"x": chain}, steps).result()
            chained = time.perf_counter() - began
            rows.append(
                {
                    "what": "dagtune: chained stages (submit, wait, extend)",
                    "stages": n,
                    "seconds": chained,
                    "busy": 1,  # one stage at a time
                }
            )
            loads = dict(study.coordinator.loads)
    for row in rows:
        row["stages_per_second"] = row["stages"] / row["seconds"]
        row["ms_per_stage"] = 1000 * row["seconds"] / row["stages"]
        row["worker_ms_per_stage"] = row.pop("busy", WORKERS) * row["ms_per_stage"]
    return {
        "workers": WORKERS,
        "rows": rows,
        "overhead_ms_per_stage": 1000 * (independent - raw) / n,
        "overhead_worker_ms_per_stage": WORKERS * 1000 * (independent - raw) / n,
        "chained_loads": loads,
    }


if __name__ == "__main__":
    import json

    print(json.dumps(benchmark(), indent=2))


def markdown(result: dict[str, Any]) -> str:
    from perf.table import table

    rows = table(
        result["rows"],
        [
            ("what", "what"),
            ("stages", "stages"),
            ("seconds", "seconds"),
            ("stages_per_second", "stages/s"),
            ("ms_per_stage", "wall ms/stage"),
            ("worker_ms_per_stage", "worker-ms/stage (busy workers x wall / stages)"),
        ],
    )
    loads = result["chained_loads"]
    return (
        f"{rows}\n\ndagtune adds **{result['overhead_ms_per_stage']:.1f} ms of wall time per stage** over raw "
        f"Dask with both workers busy, i.e. **{result['overhead_worker_ms_per_stage']:.1f} ms of a worker's time per "
        f"stage** "
        f"(checkpoint save with fsync, one directive read per step, events and the coordinator's round "
        f"trip before the next just-in-time submission). Chained stages run one at a time (each waits for "
        f"the previous), so one worker is busy at a time. Chained stages "
        f"continued in memory "
        f"{loads['memory']} times and loaded from storage {loads['storage']} times."
    )
