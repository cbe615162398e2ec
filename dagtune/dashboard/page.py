"""The "dagtune" Bokeh page: a study picker, the counters, the stage tree and the curves.

`build_page` fills a Bokeh document from any source of snapshots (a callable returning the
latest snapshot per study key) and refreshes it periodically: inside the Dask scheduler
the source is what studies published to it, keyed by name and token
(`dagtune.dashboard.plugin`), in ``dagtune dashboard STORAGE`` it is what storage holds,
keyed by name (`dagtune.dashboard.server`). The study picker shows names, with the token
where two running studies share a name.
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


def labels(snapshots: dict[str, dict]) -> list[tuple[str, str]]:
    """``(key, label)`` per study for the picker: its name, with its token if another study
    shown has the same name, and its part in a surrogate study if it has one ("digits —
    surrogate (S=8) of digits-target"); sorted by label."""
    names = [s["study"] for s in snapshots.values()]
    options = []
    for key, snapshot in snapshots.items():
        name, token = snapshot["study"], snapshot.get("token")
        label = f"{name} ({token})" if token and names.count(name) > 1 else name
        if snapshot.get("link"):
            label += f" — {snapshot['link']}"
        options.append((key, label))
    return sorted(options, key=lambda option: (option[1], option[0]))


def build_page(doc, snapshots: Snapshots, *, period_ms: int = 1000, title: str = "dagtune") -> None:
    """Add the page to `doc`; it polls `snapshots` every `period_ms` and redraws on change."""
    view = StudyView(stretch=True)
    select = Select(title="Study", options=[], name="dagtune-study", width=320)
    empty = Div(text=_EMPTY, name="dagtune-empty")
    shown: list[tuple[str, float] | None] = [None]

    def refresh() -> None:
        latest = snapshots()
        options = labels(latest)
        if options != [tuple(o) if isinstance(o, (list, tuple)) else (o, o) for o in select.options]:
            select.options = options
        if select.value not in latest:
            newest = max(latest, key=lambda key: latest[key]["time"], default=None)
            select.value = newest or ""
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
