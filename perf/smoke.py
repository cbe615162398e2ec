"""What the benchmarks' smoke mode (``python -m perf --smoke``) shares between their studies."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def shared_client(workers: int) -> Iterator[Any]:
    """A client of one embedded cluster of `workers` workers (TLS, as a study's own cluster),
    for a smoke run's studies one after the other: the smoke only checks that a benchmark
    runs, and each study's own cluster start (its workers importing torch) would be most of
    its time. Closed after."""
    from distributed import Client

    from dagtune.execution.dask import embedded_cluster  # loads distributed

    with embedded_cluster(workers, None, None) as cluster, Client(cluster) as client:
        yield client
