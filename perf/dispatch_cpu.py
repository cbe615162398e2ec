"""Where the CPU of perf/dispatch.py's independent one-step stages goes, by process and thread
(a diagnostic; not part of `python -m perf`).

An embedded cluster of 2 workers (TLS, or plain TCP with ``--tcp``) and a study on the durable
default store (a local directory) run `stages` independent one-step trials of the no-op
trainer, submitted at once, after `warmup` of them. Each thread's CPU time (user and system,
from ``/proc/<pid>/task/<tid>/stat``) is read before and after, in this process (the Dask
event loop that runs the client, the scheduler and the nannies; the coordinator's driver
thread ``dagtune-<name>``; the journal's and the publisher's) and in each worker (its event
loop, ``MainThread``; the thread that runs its tasks; the checkpoint hash thread); the reads
and writes of every Dask connection are counted in each process too. With ``--idle`` nothing
is run: the CPU a second of the open study and its cluster, waiting.

    PYTHONPATH=$PWD python -m perf.dispatch_cpu [stages] [--tcp] [--idle]
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import threading
import time
from typing import Any

import dagtune as dt
from perf.dispatch import NoopTrainer


def thread_cpu() -> dict[str, float]:
    """CPU seconds of each thread of this process so far, by name (Dask's task threads as
    ``tasks``), summed over threads of one name."""
    tick = os.sysconf("SC_CLK_TCK")
    names = {t.native_id: t.name for t in threading.enumerate()}
    used: dict[str, float] = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except FileNotFoundError:  # the thread ended meanwhile
            continue
        name = names.get(int(tid), "other")
        name = "tasks" if "Dask-Default-Threads" in name else name
        used[name] = used.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return used


def count_comms() -> None:
    """Count every read and write of Dask's TCP (and TLS) connections in this process (on the
    class itself: `comms` may run pickled by value, from ``__main__``)."""
    from distributed.comm import tcp

    if hasattr(tcp.TCP, "dagtune_comms"):
        return
    tcp.TCP.dagtune_comms = {"write": 0, "read": 0}  # type: ignore[attr-defined]
    for name in ("write", "read"):
        method = getattr(tcp.TCP, name)

        async def counted(
            self: Any, *args: Any, _method: Any = method, _name: str = name, **kwargs: Any
        ) -> Any:
            tcp.TCP.dagtune_comms[_name] += 1  # type: ignore[attr-defined]
            return await _method(self, *args, **kwargs)

        setattr(tcp.TCP, name, counted)


def comms() -> dict[str, int]:
    """This process's counts since `count_comms`."""
    from distributed.comm import tcp

    return dict(tcp.TCP.dagtune_comms)  # type: ignore[attr-defined]


def _per(before: dict[str, float], after: dict[str, float], n: float) -> dict[str, float]:
    return {
        k: round(1000 * (v - before.get(k, 0.0)) / n, 3) for k, v in after.items() if v > before.get(k, 0.0)
    }


def measure(stages: int = 300, tls: bool = True, warmup: int = 20, idle: float = 0.0) -> dict[str, Any]:
    """CPU ms per stage (or, with `idle` seconds, CPU ms per second waiting) by thread."""
    from distributed import Client

    from dagtune.execution.dask import embedded_cluster

    load_before = os.getloadavg()
    count_comms()
    cluster = embedded_cluster(2, None, tls)
    client = Client(cluster)
    try:
        client.run(lambda: __import__("dagtune.runner"))  # import torch in the workers first
        client.run(count_comms)
        with (
            tempfile.TemporaryDirectory() as storage,
            dt.Study(NoopTrainer, name="cpu", storage=storage, client=client) as study,
        ):
            for handle in [study.submit({"x": -1 - i}, 1) for i in range(warmup)]:
                handle.result()
            workers, here, sent, began = (
                client.run(thread_cpu),
                thread_cpu(),
                client.run(comms),
                time.perf_counter(),
            )
            ours = comms()
            if idle:
                time.sleep(idle)
            else:
                for handle in [study.submit({"x": i}, 1) for i in range(stages)]:
                    handle.result()
            wall = time.perf_counter() - began
            workers_after, here_after = client.run(thread_cpu), thread_cpu()
            sent_after, ours_after = client.run(comms), comms()
    finally:
        client.close()
        cluster.close()
    n = idle or stages
    return {
        "cluster": "TLS" if tls else "plain TCP",
        "per": "second idle" if idle else "stage",
        "wall_ms": round(1000 * wall / (1 if idle else stages), 3),
        "study_cpu_ms": _per(here, here_after, n),
        "worker_cpu_ms": {a: _per(workers[a], workers_after[a], n) for a in workers_after},
        "study_comms": {k: round((ours_after[k] - ours[k]) / n, 2) for k in ours},
        "worker_comms": {k: round(sum(sent_after[a][k] - sent[a][k] for a in sent) / n, 2) for k in ours},
        "load_average": {"before": load_before, "after": os.getloadavg()},
    }


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    result = measure(
        int(args[0]) if args else 300, tls="--tcp" not in sys.argv, idle=10.0 if "--idle" in sys.argv else 0.0
    )
    print(json.dumps(result, indent=2))
