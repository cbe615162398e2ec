"""The clusters a benchmark's studies run on, and what the smoke mode (``python -m perf
--smoke``) shares between benchmarks.

A smoke run only checks that every benchmark still runs: one cluster start (its workers
importing torch) and stop per benchmark would be most of its time, so within `session()` every
benchmark's smoke studies share one embedded cluster per worker count, started on first use
and stopped at the session's end."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

_session: contextlib.ExitStack | None = None
_clients: dict[int, Any] = {}


@contextlib.contextmanager
def session() -> Iterator[None]:
    """Keep the clusters `shared_client` starts open until the end of this block."""
    global _session
    with contextlib.ExitStack() as stack:
        _session = stack
        try:
            yield
        finally:
            _session = None
            _clients.clear()


@contextlib.contextmanager
def shared_client(workers: int) -> Iterator[Any]:
    """A client of an embedded cluster of `workers` workers (TLS, as a study's own cluster)
    for a smoke run's studies one after the other: the session's one if a `session()` is open
    (started on first use), else one of its own, closed after."""
    if _session is None:
        with _embedded_client(workers, security=None) as client:
            yield client
        return
    if workers not in _clients:
        _clients[workers] = _session.enter_context(_embedded_client(workers, security=None))
    yield _clients[workers]


@contextlib.contextmanager
def cluster_client(mode: str, workers: int) -> Iterator[Any]:
    """The cluster a benchmark's measured studies run on: in smoke mode the shared one, else a
    fresh embedded cluster of `workers` plain-TCP workers (what is measured is the studies, not
    the encryption), closed after."""
    if mode == "smoke":
        with shared_client(workers) as client:
            yield client
        return
    with _embedded_client(workers, security=False) as client:
        yield client


@contextlib.contextmanager
def _embedded_client(workers: int, security: bool | None) -> Iterator[Any]:
    from distributed import Client

    from dagtune.execution.dask import embedded_cluster  # loads distributed

    with embedded_cluster(workers, None, security) as cluster, Client(cluster) as client:
        yield client
