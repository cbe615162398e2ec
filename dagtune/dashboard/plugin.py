"""The page inside Dask's dashboard, and how a study feeds it.

The coordinator runs in the client process, the dashboard in the scheduler's. A study's
`SnapshotFeed` sends a snapshot (`dagtune.dashboard.snapshot`) whenever something changed,
when the study's publisher asks it (`dagtune.execution.dask.Publisher`, at most once a
second and a tenth of the time), into the scheduler's metadata under
``["dagtune", "dashboard", "<name>-<token>"]``: the scheduler holds one snapshot per study,
the latest (never a log that grows with the study), and two studies of the same name stay
apart. It publishes only where the page is served. `DashboardPlugin`, a scheduler plugin,
adds the "dagtune" page to the scheduler's dashboard, next to Dask's own pages; the page
reads the snapshots there.

The plugin gets there in one of two ways: `register` (what `attach` does for every study on
Dask, the embedded cluster included) sends it to the scheduler, which must be able to
import dagtune; or the scheduler starts with it: ``dask scheduler --preload dagtune.dashboard``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from distributed.diagnostics.plugin import SchedulerPlugin

from dagtune.dashboard.kept import KeptSnapshot
from dagtune.dashboard.snapshot import live_snapshot

__all__ = ["SNAPSHOTS", "DashboardPlugin", "SnapshotFeed", "attach", "page_url", "register", "snapshots_on"]

log = logging.getLogger("dagtune")

SNAPSHOTS = ("dagtune", "dashboard")  # scheduler metadata: {"<name>-<token>": latest snapshot}
PATH = "dagtune"


class DashboardPlugin(SchedulerPlugin):
    """Serves the "dagtune" page from the scheduler (the snapshots it shows are in the
    scheduler's metadata, `snapshots_on`)."""

    name = "dagtune-dashboard"
    idempotent = True

    def __init__(self) -> None:
        self.served = False

    async def start(self, scheduler: Any) -> None:
        self.served = _install_page(scheduler)


def snapshots_on(scheduler: Any) -> dict[str, dict]:
    """The latest snapshot of each study that published to `scheduler`, by key."""
    found = scheduler.get_metadata(list(SNAPSHOTS), default={})
    if not isinstance(found, dict):
        return {}
    return {k: v for k, v in found.items() if isinstance(v, dict) and isinstance(v.get("study"), str)}


def _install_page(scheduler: Any) -> bool:
    """Add the page to the scheduler's dashboard; False if it has none (no bokeh, or
    started without a dashboard)."""
    http = getattr(scheduler, "http_application", None)
    if http is None:
        return False
    try:
        from bokeh.server.server import BokehTornado
        from distributed.dashboard.core import BokehApplication
        from distributed.dashboard.scheduler import template_variables
        from tornado.ioloop import IOLoop
    except ImportError:
        log.info("dagtune: the Dask dashboard is not available; no dagtune page", exc_info=True)
        return False
    dask_app = next((a for a in http.applications if isinstance(a, BokehTornado)), None)
    prefix = dask_app.prefix if dask_app is not None else ""
    extra = template_variables(scheduler)
    if PATH not in extra["pages"]:  # a "dagtune" tab in Dask's navigation bar
        extra["pages"].append(PATH)
    app = BokehApplication({f"/{PATH}": _scheduler_doc}, scheduler, prefix=prefix, template_variables=extra)
    http.add_application(app)
    app.initialize(IOLoop.current())
    app.start()
    return True


def _scheduler_doc(scheduler: Any, extra: dict, doc: Any) -> None:
    """The page as one of the Dask dashboard's documents (its template and theme)."""
    from distributed.dashboard.components.scheduler import BOKEH_THEME, env

    from dagtune.dashboard.page import build_page  # loads bokeh: only where the page is served

    build_page(doc, lambda: snapshots_on(scheduler), title="Dask: dagtune")
    doc.template = env.get_template("simple.html")
    doc.template_variables.update(extra)
    doc.theme = BOKEH_THEME


def page_url(client: Any) -> str | None:
    """The page's address next to Dask's dashboard link, or None without a dashboard."""
    try:
        link = client.dashboard_link
    except Exception:  # no dashboard service, or a link template naming unknown variables
        return None
    if not link:
        return None
    base = link[: -len("status")] if link.endswith("status") else link.rstrip("/") + "/"
    return base + PATH


def register(client: Any) -> bool:
    """Put `DashboardPlugin` on the client's scheduler (once); True if the page is served."""
    try:
        client.register_plugin(DashboardPlugin())
        return bool(client.run_on_scheduler(_served))
    except Exception as error:  # e.g. the scheduler cannot import dagtune
        log.warning(
            "dagtune: no dashboard page on the scheduler (%s); start it with "
            "`dask scheduler --preload dagtune.dashboard` in an environment with dagtune",
            error,
        )
        return False


def _served(dask_scheduler: Any) -> bool:
    plugin = dask_scheduler.plugins.get(DashboardPlugin.name)
    return bool(plugin is not None and plugin.served)


#: how long a feed's final snapshot waits for one its publisher's thread is making (seconds; a
#: 100,000-trial study's first takes about 7 s of CPU, a later one about 2 s)
FINISH_WAIT = 10.0


class SnapshotFeed:
    """A study's snapshots, for its publisher (`dagtune.execution.dask.Publisher`): sent when
    anything changed since the last one; the final one when the study closes. It keeps what
    its snapshots made (`dagtune.dashboard.kept.KeptSnapshot`), so each redoes only what
    changed since the last one. One snapshot is made from what is kept at a time: the final
    one (`finish`, from the closing thread) waits up to `FINISH_WAIT` seconds for one the
    publisher's thread is making (it may outlast the publisher's wait for its thread at a large
    study), then makes its own from scratch (the thread may be waiting for the study's lock,
    which a study closed under it holds); a snapshot that thread finishes after the final one
    is not sent over it."""

    def __init__(self, study: Any, client: Any):
        self.study = study
        self.client = client
        self.key = f"{study.name}-{study.activity().token}"
        self._sent: tuple | None = None
        self._kept = KeptSnapshot()  # labels, layout and curves so far: a snapshot redoes what changed
        self._making = threading.Lock()  # held while a snapshot is made from `_kept`
        self._final = False  # the final snapshot was sent: nothing after it

    def publish(self, force: bool = False) -> bool:
        """Send a snapshot if anything changed since the last one (or with `force`)."""
        with self._making:
            return self._publish(force, self._kept)

    def _publish(self, force: bool, kept: KeptSnapshot) -> bool:
        state = self.study.activity().changes
        if state == self._sent and not force:
            return False
        snapshot = live_snapshot(self.study, kept=kept)
        if self._final:  # made while `finish` sent the final one without waiting: older
            return False
        snapshot["key"], snapshot["token"] = self.key, self.study.activity().token
        self.client.set_metadata([*SNAPSHOTS, self.key], snapshot)
        self._sent = state
        return True

    def finish(self) -> None:
        """Send the final state (the study closes)."""
        if not self._making.acquire(timeout=FINISH_WAIT):
            self._publish(True, KeptSnapshot())  # what is kept is in use: from scratch
            self._final = True  # the snapshot still being made is older: never sent
            return
        try:
            self._publish(True, self._kept)
            self._final = True
        finally:
            self._making.release()


def attach(study: Any, *, announce: Callable[[str], None] | None = print) -> SnapshotFeed | None:
    """Feed a study on Dask to the dagtune page and say where the page is.

    Registers the page on the study's scheduler (the embedded cluster included) and
    announces the page next to Dask's dashboard link. Returns the study's `SnapshotFeed`
    (for its publisher), or None where no page is served (a scheduler without a dashboard,
    or one that can't import dagtune) and for a study without a Dask client (e.g. a
    simulation).
    """
    client = getattr(study, "client", None)
    if client is None or not register(client):
        return None
    feed = SnapshotFeed(study, client)
    url = page_url(client)
    if url and announce is not None:
        announce(f"dagtune: study {study.name!r} live at {url} (Dask dashboard: {client.dashboard_link})")
    return feed
