"""The real Dask clusters the integration tests run on: two single-threaded worker processes
on loopback, as a small GPU node would have (one worker per GPU), and `dask scheduler` /
`dask worker` processes started from their console script."""

from __future__ import annotations

import contextlib
import importlib
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from distributed import Client, LocalCluster


@contextmanager
def local_client(warm_up: bool = True, **cluster_kwargs: Any) -> Iterator[Client]:
    """A client of a fresh 2-worker LocalCluster; `warm_up` imports the example trainers
    (and torch) in the workers first, so the first test does not pay for it."""
    settings = {
        "n_workers": 2,
        "threads_per_worker": 1,
        "processes": True,
        "host": "127.0.0.1",
        "dashboard_address": "127.0.0.1:0",
        "silence_logs": 40,
        **cluster_kwargs,
    }
    with LocalCluster(**settings) as cluster, Client(cluster) as client:
        if warm_up:
            client.run(importlib.import_module, "digits")
        yield client


def leftover_work(client: Client, workers: int, settle: float) -> str:
    """What keeps `client`'s cluster from being as a test found it, `settle` seconds after the
    test (a task that still runs on a worker thread, cancelled or not; fewer than `workers`
    workers), or "" once it is idle."""
    deadline = time.monotonic() + settle
    while True:
        try:
            running = client.run(lambda dask_worker: dask_worker.state.executing_count)
            left = {address: count for address, count in running.items() if count}
            found = f"tasks running: {left}" if left else ""
            if len(running) < workers:
                found = f"{len(running)} of {workers} workers"
        except Exception as error:  # a worker leaving while asked
            found = f"{type(error).__name__}: {error}"
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.2)


def dask_command(*args: str) -> list[str]:
    """The `dask` console script of this environment (``python -m dask`` if it has none)."""
    script = Path(sys.executable).with_name("dask")
    return [str(script), *args] if script.exists() else [sys.executable, "-m", "dask", *args]


def scheduler_address(scheduler_file: Path, process: subprocess.Popen, log: Path, timeout: float = 60) -> str:
    """The address a `dask scheduler --scheduler-file` process writes once it listens (fails
    with its log if it exits or takes longer than `timeout` seconds)."""
    deadline = time.monotonic() + timeout
    while True:  # the scheduler writes the file in place: it can be read half written
        with contextlib.suppress(FileNotFoundError, json.JSONDecodeError, KeyError):
            return json.loads(scheduler_file.read_text())["address"]
        assert time.monotonic() < deadline and process.poll() is None, log.read_text()
        time.sleep(0.2)
