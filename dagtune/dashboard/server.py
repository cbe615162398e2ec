"""``dagtune dashboard STORAGE``: the dagtune page served from storage, no study running.

A Bokeh server (bokeh's own, on 127.0.0.1 by default) serves the same page as the Dask
dashboard's (`dagtune.dashboard.page`); its snapshots are read from the studies' records
and search plans in storage (`dagtune.catalog`) and re-read every `refresh` seconds, so a
study running elsewhere shows up as its journals are flushed.

The page talks to the server over a websocket, which Bokeh accepts only from the origins
(``host:port`` as the browser's address bar has it) it was told about: `websocket_origins`
lists the names and addresses of this machine a browser can reach the bound address by.
"""

from __future__ import annotations

import ipaddress
import socket
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from dagtune.catalog import StorageError, list_studies, load_study, open_storage
from dagtune.dashboard.snapshot import stored_snapshot

__all__ = ["StoredSnapshots", "serve", "websocket_origins"]


#: how a snapshot of a stored study is read: (store, study name, plans read so far) -> snapshot
SnapshotReader = Callable[[Any, str, dict], dict]


def snapshot_from_journals(store: Any, name: str, plans: dict) -> dict:
    """Study `name`'s snapshot read from its journals (`load_study`; `plans` shares the
    model's plan between the studies of one refresh)."""
    return stored_snapshot(load_study(store, name, plans))


class StoredSnapshots:
    """The latest snapshot of each study in storage (or of `names`), cached `refresh` s,
    each read by `read` (`dagtune dashboard` passes the study's index when it is current:
    `dagtune.study_index`, a module above this package)."""

    def __init__(
        self,
        store: Any,
        names: list[str] | None = None,
        refresh: float = 5.0,
        read: SnapshotReader = snapshot_from_journals,
    ):
        self.store = store
        self.names = names
        self.refresh = refresh
        self.read = read
        self._cache: dict[str, dict] = {}
        self._read_at = -float("inf")

    def __call__(self) -> dict[str, dict]:
        if time.monotonic() - self._read_at >= self.refresh:
            self._read_at = time.monotonic()
            plans: dict = {}
            for name in self.names or list_studies(self.store):
                try:
                    snapshot = self.read(self.store, name, plans)
                except StorageError:
                    continue  # created but not written yet
                previous = self._cache.get(name)
                if previous is not None and _same(previous, snapshot):
                    continue  # keep the old time stamp: the page redraws only on change
                self._cache[name] = snapshot
        return dict(self._cache)


def _same(a: dict, b: dict) -> bool:
    return {k: v for k, v in a.items() if k != "time"} == {k: v for k, v in b.items() if k != "time"}


def free_port(address: str = "127.0.0.1") -> int:
    with socket.socket() as probe:
        probe.bind((address, 0))
        return probe.getsockname()[1]


_EVERY_INTERFACE = ("0.0.0.0", "::", "")


def _loopback(address: str) -> bool:
    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:  # a host name
        return False


def websocket_origins(address: str, port: int, extra: Iterable[str] = ()) -> list[str]:
    """The origins a browser may open the page from when the server listens on `address`:
    ``localhost`` and ``127.0.0.1`` always; for another address also that address and this
    machine's host names; for every interface (``0.0.0.0``, ``::``) also every IPv4 address
    of this machine. Each is ``host:port``; `extra` adds more as they are (a proxy's or a
    tunnel's ``host:port``). Bokeh's origin check can't hold an IPv6 address (it splits at
    colons), so a browser must reach a server on IPv6 by a host name."""
    hosts = {"localhost", "127.0.0.1", address}
    if not _loopback(address):
        hosts |= {socket.gethostname(), socket.getfqdn()}
    if address in _EVERY_INTERFACE:
        import psutil

        hosts |= {
            entry.address
            for entries in psutil.net_if_addrs().values()
            for entry in entries
            if entry.family == socket.AF_INET
        }
    return [f"{host}:{port}" for host in sorted(h for h in hosts if h and ":" not in h)] + list(extra)


def serve(
    storage: str,
    *,
    names: list[str] | None = None,
    address: str = "127.0.0.1",
    port: int = 8790,
    refresh: float = 5.0,
    storage_options: Mapping[str, Any] | None = None,
    allow_origins: Iterable[str] = (),
    read: SnapshotReader = snapshot_from_journals,
):
    """Start serving the page for `storage` at ``http://{address}:{port}/dagtune`` (port 0:
    a free one) to browsers at `websocket_origins` (plus `allow_origins`); returns the
    started `bokeh.server.server.Server` (``server.io_loop.start()`` runs it,
    ``server.stop()`` stops it). Each study's snapshot is read by `read` (`StoredSnapshots`).
    Raises `StorageError` for unreadable storage."""
    from bokeh.application import Application
    from bokeh.application.handlers.function import FunctionHandler
    from bokeh.server.server import Server

    from dagtune.dashboard.page import build_page  # loads bokeh: only where the page is served

    store = open_storage(storage, storage_options)
    for name in names or ():
        read(store, name, {})  # a clear error for a study that is not there
    port = port or free_port(address)

    def make(doc: Any) -> None:
        build_page(doc, StoredSnapshots(store, names, refresh, read), period_ms=int(refresh * 1000))

    server = Server(
        {"/dagtune": Application(FunctionHandler(make))},
        address=address,
        port=port,
        allow_websocket_origin=websocket_origins(address, port, allow_origins),
    )
    server.start()
    return server
