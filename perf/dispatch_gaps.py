"""Where the time between two stages on one worker goes (a diagnostic of perf/dispatch.py's
independent one-step stages; not part of `python -m perf`).

An embedded cluster of 2 workers (TLS, or plain TCP with ``--tcp``) and a study on the durable
default store (a local directory) run `stages` independent one-step trials of the no-op
trainer, submitted at once: the coordinator feeds them to Dask just in time, one per free
slot. For each worker, Dask's task stream gives when each task computed there; a scheduler
plugin gives when the scheduler received each task and when it sent it to a worker. The gap
between two tasks on one worker splits into: the previous task's end until the scheduler
received the next one (the worker's event travelling to the study, the coordinator's turn,
the submission travelling to the scheduler), the scheduler's own turn, and the scheduler's
sending it until the worker started it.

    PYTHONPATH=$PWD python -m perf.dispatch_gaps [stages] [--tcp]
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from itertools import pairwise
from typing import Any

import dagtune as dt
from perf.dispatch import NoopTrainer


class _Arrivals:
    """A scheduler plugin: when each task first reached the scheduler, and when it was sent
    to a worker (its transition to processing), by the scheduler's clock (this process's)."""

    def __init__(self) -> None:
        self.received: dict[str, float] = {}
        self.sent: dict[str, float] = {}

    def transition(self, key: str, start: str, finish: str, *args: Any, **kwargs: Any) -> None:
        now = time.time()
        self.received.setdefault(key, now)
        if finish == "processing":
            self.sent[key] = now


def _ms(values: list[float]) -> dict[str, float]:
    return {"median": 1000 * statistics.median(values), "mean": 1000 * statistics.mean(values)}


def measure(stages: int = 300, tls: bool = True, warmup: int = 20) -> dict[str, Any]:
    from distributed import Client, get_task_stream
    from distributed.diagnostics.plugin import SchedulerPlugin

    from dagtune.execution.dask import embedded_cluster

    arrivals = _Arrivals()
    plugin = type("ArrivalsPlugin", (SchedulerPlugin,), {"transition": arrivals.transition})()
    load_before = os.getloadavg()
    cluster = embedded_cluster(2, None, tls)
    client = Client(cluster)
    try:
        client.run(lambda: __import__("dagtune.runner"))  # import torch in the workers first
        cluster.scheduler.add_plugin(plugin)
        with (
            tempfile.TemporaryDirectory() as storage,
            dt.Study(NoopTrainer, name="gaps", storage=storage, client=client) as study,
        ):
            for handle in [study.submit({"x": -1 - i}, 1) for i in range(warmup)]:
                handle.result()
            with get_task_stream(client) as stream:
                began = time.perf_counter()
                for handle in [study.submit({"x": i}, 1) for i in range(stages)]:
                    handle.result()
                wall = time.perf_counter() - began
    finally:
        client.close()
        cluster.close()
    by_worker: dict[str, list[tuple[float, float, str]]] = {}
    for record in stream.data:
        computed = [s for s in record["startstops"] if s["action"] == "compute"]
        if computed:
            by_worker.setdefault(record["worker"], []).append(
                (computed[0]["start"], computed[0]["stop"], record["key"])
            )
    task, gap, to_scheduler, scheduler, to_worker = [], [], [], [], []
    for tasks in by_worker.values():
        tasks.sort()
        task += [stop - start for start, stop, _ in tasks]
        for (_, stopped, _), (started, _, key) in pairwise(tasks):
            gap.append(started - stopped)
            if key in arrivals.sent:
                to_scheduler.append(arrivals.received[key] - stopped)
                scheduler.append(arrivals.sent[key] - arrivals.received[key])
                to_worker.append(started - arrivals.sent[key])
    return {
        "cluster": "TLS" if tls else "plain TCP",
        "stages": stages,
        "wall_ms_per_stage": 1000 * wall / stages,
        "task_ms": _ms(task),
        "gap_ms": _ms(gap),
        "end_to_scheduler_received_next_ms": _ms(to_scheduler),
        "scheduler_turn_ms": _ms(scheduler),
        "scheduler_sent_to_worker_started_ms": _ms(to_worker),
        "load_average": {"before": load_before, "after": os.getloadavg()},
    }


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    print(json.dumps(measure(int(args[0]) if args else 300, tls="--tcp" not in sys.argv), indent=2))
