"""The dagtune dashboard: a live "dagtune" page in Dask's dashboard, and the same page
served from storage by ``dagtune dashboard STORAGE``.

``dask scheduler --preload dagtune.dashboard`` puts the page on a scheduler from the start
(`dask_setup`); a study on Dask registers it itself otherwise (`attach`).
"""

from __future__ import annotations

from typing import Any

from dagtune.dashboard.plugin import (
    SNAPSHOTS,
    DashboardPlugin,
    SnapshotFeed,
    attach,
    page_url,
    register,
    snapshots_on,
)

__all__ = [
    "SNAPSHOTS",
    "DashboardPlugin",
    "SnapshotFeed",
    "attach",
    "dask_setup",
    "page_url",
    "register",
    "snapshots_on",
]


def dask_setup(scheduler: Any) -> None:
    """The preload hook: ``dask scheduler --preload dagtune.dashboard``."""
    scheduler.add_plugin(DashboardPlugin(), idempotent=True)
