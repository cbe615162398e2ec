"""Dispatch overhead: what dagtune adds on top of Dask per stage, and what the embedded
cluster's TLS adds to that and to its start.

A trainer that does nothing, so every second is overhead. Two embedded clusters of 2
workers run side by side, one on plain TCP and one with TLS (`Study(security=...)`'s two
settings), each with a study on the durable default store (a local directory). Six
measurements, interleaved in rounds (each round runs every one of them on its share of the
stages, in a rotated order; the median round is reported): on each cluster, raw Dask (all
no-op tasks submitted at once), dagtune with one independent one-step trial per stage
(just-in-time submission: a finished stage's event travels back before the next is
submitted), and dagtune with chained stages (each trial branches from the previous one's
end, so consecutive stages continue in memory). The start of an embedded cluster (TLS: with
making its key) until its client is connected is timed as many times per setting,
alternating which goes first.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import dagtune as dt

WORKERS = 2
SETTINGS = (("plain TCP", False), ("TLS", True))  # (name, Study(security=...))
RAW = "raw Dask tasks (all submitted at once)"
INDEPENDENT = "dagtune: independent one-step stages"
CHAINED = "dagtune: chained stages (submit, wait, extend)"


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


def _start(tls: bool) -> tuple[Any, Any, float]:
    """An embedded cluster of `WORKERS` and its client, and the seconds they took to start."""
    from distributed import Client

    from dagtune.execution.dask import embedded_cluster

    began = time.perf_counter()
    cluster = embedded_cluster(WORKERS, None, tls)
    client = Client(cluster)
    return cluster, client, time.perf_counter() - began


def _raw(client: Any, lo: int, hi: int) -> None:
    client.gather(client.map(_noop, range(lo, hi), pure=False))


def _independent(study: dt.Study, lo: int, hi: int) -> None:
    for handle in [study.submit({"x": i}, 1) for i in range(lo, hi)]:
        handle.result()


def _chained(study: dt.Study, lo: int, hi: int, n: int) -> None:
    """Extend one trial from `lo` to `hi` steps of a chain of `n`, one stage at a time."""
    chain = dt.Steps(list(range(n + 1)), list(range(1, n + 1)))
    for steps in range(lo + 1, hi + 1):
        study.submit({"x": chain}, steps).result()


def _interleaved(
    runs: dict[tuple[str, str], Any], cpu: Callable[[], float], n: int, repeats: int
) -> tuple[dict[tuple[str, str], list[float]], dict[tuple[str, str], list[float]]]:
    """Milliseconds of wall time and of CPU time (`cpu`: seconds used so far) per stage of
    each of `runs` ((what, cluster) -> run(lo, hi)) in each of `repeats` rounds of
    ``n // repeats`` stages: every round runs every measurement once, in an order rotated
    (and reversed every other round), so that a drift in the machine's load favours none of
    them."""
    chunk = n // repeats
    names = list(runs)
    wall: dict[tuple[str, str], list[float]] = {name: [] for name in names}
    used: dict[tuple[str, str], list[float]] = {name: [] for name in names}
    for round_ in range(repeats):
        order = names[round_ % len(names) :] + names[: round_ % len(names)]
        for name in order if round_ % 2 == 0 else order[::-1]:
            cpu_began, began = cpu(), time.perf_counter()
            runs[name](round_ * chunk, (round_ + 1) * chunk)
            wall[name].append(1000 * (time.perf_counter() - began) / chunk)
            used[name].append(1000 * (cpu() - cpu_began) / chunk)
    return wall, used


def _cpu(clients: list[Any]) -> Callable[[], float]:
    """CPU seconds used so far by this process (the study's coordinator, the Dask clients
    and the embedded clusters' schedulers) and by every worker process of `clients`."""

    def used() -> float:
        workers = sum(sum(client.run(time.process_time).values()) for client in clients)
        return time.process_time() + workers

    return used


def benchmark(mode: str = "quick") -> dict[str, Any]:
    n = {"smoke": 20, "quick": 300, "full": 1000}[mode]
    repeats = {"smoke": 2, "quick": 6, "full": 10}[mode]
    starts = {"smoke": 1, "quick": 3, "full": 5}[mode]
    load_before = os.getloadavg()
    startup: dict[str, list[float]] = {name: [] for name, _ in SETTINGS}
    for i in range(starts - 1):  # the last start of each is the cluster measured below
        for name, tls in SETTINGS if i % 2 else SETTINGS[::-1]:
            cluster, client, seconds = _start(tls)
            startup[name].append(seconds)
            client.close()
            cluster.close()
    with contextlib.ExitStack() as stack:
        clients, studies = {}, {}
        for name, tls in SETTINGS:
            cluster, client, seconds = _start(tls)
            stack.callback(cluster.close)
            stack.callback(client.close)  # callbacks run last first: the client closes before its cluster
            startup[name].append(seconds)
            client.run(lambda: __import__("dagtune.runner"))  # import torch in the workers first
            clients[name] = client
            storage = stack.enter_context(tempfile.TemporaryDirectory())
            studies[name] = stack.enter_context(
                dt.Study(NoopTrainer, name="dispatch", storage=storage, client=client)
            )
        runs: dict[tuple[str, str], Any] = {}
        for name, _ in SETTINGS:
            runs[RAW, name] = partial(_raw, clients[name])
            runs[INDEPENDENT, name] = partial(_independent, studies[name])
            runs[CHAINED, name] = partial(_chained, studies[name], n=n)
        per_stage, cpu_per_stage = _interleaved(runs, _cpu(list(clients.values())), n, repeats)
        loads = {name: dict(study.coordinator.loads) for name, study in studies.items()}
    rows = []
    for (what, name), values in per_stage.items():
        busy = 1 if what == CHAINED else WORKERS  # chained stages run one at a time
        ms = statistics.median(values)
        rows.append(
            {
                "what": what,
                "security": name,
                "stages": n,
                "ms_per_stage": ms,
                "stages_per_second": 1000 / ms,
                "worker_ms_per_stage": busy * ms,
                "cpu_ms_per_stage": statistics.median(cpu_per_stage[what, name]),
                "rounds": ", ".join(f"{v:.1f}" for v in values),
            }
        )
    overhead = {  # the median over rounds of each round's difference: measured side by side
        name: statistics.median(
            a - b for a, b in zip(per_stage[INDEPENDENT, name], per_stage[RAW, name], strict=True)
        )
        for name, _ in SETTINGS
    }
    cpu_overhead = {
        name: statistics.median(
            a - b for a, b in zip(cpu_per_stage[INDEPENDENT, name], cpu_per_stage[RAW, name], strict=True)
        )
        for name, _ in SETTINGS
    }
    median = {key: statistics.median(values) for key, values in per_stage.items()}
    return {
        "workers": WORKERS,
        "repeats": repeats,
        "rows": rows,
        "overhead_ms_per_stage": overhead,
        "overhead_worker_ms_per_stage": {name: WORKERS * ms for name, ms in overhead.items()},
        "overhead_cpu_ms_per_stage": cpu_overhead,
        "tls_ratio": {
            what: median[what, "TLS"] / median[what, "plain TCP"] for what in (RAW, INDEPENDENT, CHAINED)
        },
        "startup_seconds": startup,
        "startup_median": {name: statistics.median(times) for name, times in startup.items()},
        "chained_loads": loads,
        "load_average": {"before": load_before, "after": os.getloadavg()},
        "cpus": os.cpu_count(),
        "commit": _commit(),
    }


def _commit() -> str:
    completed = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=Path(__file__).parent
    )
    return completed.stdout.strip()


if __name__ == "__main__":
    import json

    print(json.dumps(benchmark(), indent=2))


def markdown(result: dict[str, Any]) -> str:
    from perf.table import table

    rows = table(
        result["rows"],
        [
            ("what", "what"),
            ("security", "cluster"),
            ("stages", "stages"),
            ("ms_per_stage", "wall ms/stage (median of rounds)"),
            ("stages_per_second", "stages/s"),
            ("worker_ms_per_stage", "worker-ms/stage (busy workers x wall)"),
            ("cpu_ms_per_stage", "CPU ms/stage (all processes, median)"),
            ("rounds", "wall ms/stage of each round"),
        ],
    )
    overhead = result["overhead_ms_per_stage"]
    startup, median = result["startup_seconds"], result["startup_median"]
    tcp, tls = (name for name, _ in SETTINGS)
    loads = result["chained_loads"][tls]
    raw, independent, chained = result["tls_ratio"].values()  # TLS / plain TCP wall time of each measurement
    load = result.get("load_average", {})
    before, after = load.get("before", (float("nan"),) * 3), load.get("after", (float("nan"),) * 3)
    return (
        f"{rows}\n\nEach of the six measurements ran {result.get('repeats', '?')} rounds of "
        f"{result['rows'][0]['stages'] // result.get('repeats', 1)} stages, interleaved (every round "
        "runs all six, in a rotated order); the table gives the median round. On the TLS cluster "
        "(the embedded cluster's default) dagtune adds "
        f"**{overhead[tls]:.1f} ms of wall time per stage** over raw Dask with both workers busy (the "
        f"median over rounds of each round's difference), i.e. "
        f"**{result['overhead_worker_ms_per_stage'][tls]:.1f} ms of a worker's time per stage** "
        f"({overhead[tcp]:.1f} ms on plain TCP); in CPU time (this process, with the coordinator, "
        "client and scheduler, plus both workers: what a loaded machine makes everyone wait for) "
        f"**{result['overhead_cpu_ms_per_stage'][tls]:.1f} ms per stage** over raw Dask "
        f"({result['overhead_cpu_ms_per_stage'][tcp]:.1f} ms on plain TCP). Studies on the durable default store (a local "
        "directory): every stage saves its checkpoint (data and commit marker fsynced). "
        f"TLS against plain TCP, side by side: raw Dask tasks {raw:.2f}x, "
        f"independent stages {independent:.2f}x, chained stages {chained:.2f}x the wall "
        f"time. Chained stages run one at a time (each waits for the previous), so one worker is busy "
        f"at a time; on the TLS cluster they continued in memory {loads['memory']} times and loaded "
        f"from storage {loads['storage']} times.\n\n"
        f"Starting the embedded cluster (2 workers) until its client is connected, median of "
        f"{len(startup[tls])} alternating starts: **{median[tcp]:.2f} s on plain TCP, {median[tls]:.2f} s "
        f"with TLS** (making its key included; all starts: "
        f"{', '.join(f'{t:.2f}' for t in startup[tcp])} s and {', '.join(f'{t:.2f}' for t in startup[tls])} s).\n\n"
        f"Measured at commit {result.get('commit', '?')} on {result.get('cpus', '?')} cores shared with "
        f"other work: load average {before[0]:.1f} (1 min) when it began, {after[0]:.1f} when it ended."
    )
