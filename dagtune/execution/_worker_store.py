"""How Dask workers get a study's checkpoint store: once, through a worker plugin, and never
inside a task.

A store's storage options may hold credentials (an S3 key and secret). A task's spec is kept
by the scheduler while the task exists, shows up in its transition logs, cluster dumps and
the worker's task state, and travels once per stage; so the Dask executor hands the store to
the workers once, as a worker plugin named after the study (`StorePlugin`, `register`), and
each task carries only a `StoreRef`: the storage URL and that name. Workers that join later
get the plugin from the scheduler when they register; the study's ``close`` unregisters it
(`unregister`), so the credentials do not outlive the study on a long-lived scheduler.

Until then the scheduler keeps the plugin, pickled, to hand it to new workers, and any
connected client can read it: that is why the embedded cluster admits only the study's own
client (`_security`). Workers whose environment already holds credentials
(``AWS_*`` variables, ``~/.aws``, an instance role) need no storage options at all, and then
nothing secret travels through Dask.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from distributed.diagnostics.plugin import WorkerPlugin

__all__ = ["StorePlugin", "StoreRef", "register", "store_on", "unregister"]

log = logging.getLogger("dagtune")


@dataclass(frozen=True)
class StoreRef:
    """What a task carries instead of the store: the storage URL (for messages) and the name
    of the worker plugin that holds the store."""

    url: str
    plugin: str


class StorePlugin(WorkerPlugin):
    """Holds a checkpoint store on every worker (its options, credentials included, travel
    with the plugin once rather than with every task)."""

    def __init__(self, store: Any, name: str):
        self.store = store
        self.name = name


def register(client: Any, store: Any, name: str) -> StoreRef:
    """Give every worker of `client`'s scheduler, present and future, `store` under `name`;
    returns the reference tasks carry."""
    client.register_plugin(StorePlugin(store, name), name=name)
    return StoreRef(store.url, name)


def unregister(client: Any, ref: StoreRef) -> None:
    """Withdraw the store from the scheduler and its workers (a closed scheduler has
    nothing left to withdraw)."""
    try:
        client.unregister_worker_plugin(ref.plugin)
    except Exception:
        log.debug("dagtune: withdrawing the store plugin %s failed", ref.plugin, exc_info=True)


def store_on(worker: Any, ref: StoreRef) -> Any:
    """The store `ref` names on `worker`. Raises RuntimeError if the worker lacks it (the
    study closed, or someone unregistered its plugin)."""
    plugin = worker.plugins.get(ref.plugin)
    if not isinstance(plugin, StorePlugin):
        raise RuntimeError(
            f"worker {worker.address} has no checkpoint store {ref.plugin!r} for {ref.url} "
            "(the study that registered it has closed)"
        )
    return plugin.store
