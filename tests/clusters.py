"""The real Dask cluster the integration tests run on: two single-threaded worker processes
on loopback, as a small GPU node would have (one worker per GPU)."""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from contextlib import contextmanager
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
