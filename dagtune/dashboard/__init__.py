"""The dagtune dashboard: a live "dagtune" page in Dask's dashboard, and the same page
served from storage by ``dagtune dashboard STORAGE``.

``dask scheduler --preload dagtune.dashboard`` puts the page on a scheduler from the start
(`dask_setup`); a study on Dask registers it itself otherwise (`attach`).
"""

from __future__ import annotations

import importlib
from typing import Any

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

#: the names the page's plugin module holds, loaded on first access: the plugin loads
#: distributed, which what only draws a snapshot (a closing study's read index, the page
#: served from storage) does not need (`dagtune.dashboard.snapshot`, loaded by itself)
_PLUGIN = frozenset(__all__) - {"dask_setup"}


def __getattr__(name: str) -> Any:
    """Load the plugin module behind a public name on first access, and keep the name."""
    if name not in _PLUGIN:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module("dagtune.dashboard.plugin"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


def dask_setup(scheduler: Any) -> None:
    """The preload hook: ``dask scheduler --preload dagtune.dashboard``."""
    from dagtune.dashboard.plugin import DashboardPlugin  # loads distributed: a scheduler has it

    scheduler.add_plugin(DashboardPlugin(), idempotent=True)
