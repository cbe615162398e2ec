"""The "dagtune" Bokeh page: a study picker, the counters, the stage tree and the curves.

`build_page` fills a Bokeh document from any source of snapshots (a callable returning the
latest snapshot per study name) and refreshes it periodically: inside the Dask scheduler
the source is what studies published to it (`dagtune.dashboard.plugin`), in
``dagtune dashboard STORAGE`` it is what storage holds (`dagtune.dashboard.server`).
"""

from __future__ import annotations

from collections.abc import Callable

from bokeh.layouts import column
from bokeh.models import Div, Select

from dagtune.dashboard.figures import StudyView

__all__ = ["build_page"]

Snapshots = Callable[[], dict[str, dict]]

_EMPTY = (
    "<p>No dagtune study has published here yet. A study on this Dask cluster shows up "
    "within a second of starting; <code>dagtune dashboard STORAGE</code> shows finished ones.</p>"
)


def build_page(doc, snapshots: Snapshots, *, period_ms: int = 1000, title: str = "dagtune") -> None:
    """Add the page to `doc`; it polls `snapshots` every `period_ms` and redraws on change."""
    view = StudyView(stretch=True)
    select = Select(title="Study", options=[], name="dagtune-study", width=320)
    empty = Div(text=_EMPTY, name="dagtune-empty")
    shown: list[tuple[str, float] | None] = [None]

    def refresh() -> None:
        latest = snapshots()
        names = sorted(latest)
        if names != list(select.options):
            select.options = names
        if select.value not in latest:
            newest = max(latest.values(), key=lambda s: s["time"], default=None)
            select.value = newest["study"] if newest else ""
            return  # the value callback redraws
        snapshot = latest[select.value]
        empty.visible = False
        if shown[0] != (select.value, snapshot["time"]):
            view.update(snapshot)
            shown[0] = (select.value, snapshot["time"])

    select.on_change("value", lambda _attr, _old, _new: refresh())
    refresh()
    doc.add_periodic_callback(refresh, period_ms)
    doc.title = title
    doc.add_root(column(select, empty, view.layout, sizing_mode="stretch_width", name="dagtune-page"))
