"""dagtune in Jupyter: rich HTML for studies and results, a live view while a study runs, and
Bokeh figures (the trials table is `dagtune.summary.trials_frame`; a stage tree renders itself).

Everything here renders a snapshot (`dagtune.dashboard.snapshot`), so a notebook shows
what the dashboard page shows: a summary table, the best trial, a small tree (inline SVG,
no JavaScript, so it survives a saved notebook) and the dashboard link when there is one.
"""

from __future__ import annotations

import html
import math
from collections.abc import Iterable
from typing import Any

from dagtune.dashboard.figures import COLORS, CRITICAL, curves_figure, tree_figure
from dagtune.dashboard.plugin import page_url
from dagtune.dashboard.snapshot import live_snapshot, result_snapshot
from dagtune.dashboard.tree import STATES
from dagtune.summary import seconds_label

__all__ = [
    "LiveView",
    "plot_curves",
    "plot_tree",
    "result_html",
    "study_html",
]

_STYLE = (
    "<style>.dagtune table{border-collapse:collapse;margin:4px 0}"
    ".dagtune td,.dagtune th{padding:2px 10px;text-align:left;border-bottom:1px solid #ddd}"
    ".dagtune th{font-weight:600}</style>"
)


def _rows(pairs: Iterable[tuple[str, Any]]) -> str:
    cells = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(str(v))}</td></tr>" for k, v in pairs)
    return f"<table>{cells}</table>"


def _summary(snapshot: dict) -> str:
    counters = snapshot["counters"]
    executed = counters.get("executed_steps")
    rate = counters.get("merge_rate_ended")
    pairs = [
        (
            "trials",
            f"{counters.get('trials', 0)} ({counters.get('completed', 0)} completed, "
            f"{counters.get('pending', 0)} pending, {counters.get('stopped', 0)} stopped, "
            f"{counters.get('diverged', 0)} diverged, {counters.get('failed', 0)} failed)",
        ),
        (
            "steps",
            f"{counters.get('trial_steps', 0)} trial · {counters.get('unique_steps', 0)} unique · "
            f"{'—' if executed is None else executed} executed",
        ),
        (
            "merge rate",
            "– (no trial ended yet)"
            if rate is None
            else f"{rate:.2f} ({counters.get('ended', 0)} of {counters.get('trials', 0)} trials ended)",
        ),
    ]
    if "gpu_seconds" in counters:
        pairs.append(
            (
                seconds_label(snapshot.get("gpus")),
                f"{counters['gpu_seconds']:.1f} ({counters.get('gpu_seconds_saved', 0.0):.1f} saved by reuse)",
            )
        )
    failed = (snapshot.get("failures") or {}).get("first")
    if failed:
        pairs.append(("first failed trial", f"trial {failed[0]}: {failed[1]}"))
    return _rows(pairs)


def _best(snapshot: dict) -> str:
    best = snapshot.get("best")
    if best is None:
        return "<p>No result yet.</p>"
    note = best.get("note") or f"trial {best['trial']}, {best['steps']} steps"
    head = f"best {snapshot['metric']} = {best['value']:.4g} ({note})"
    return f"<p><b>{html.escape(head)}</b></p>" + _rows(best["config"].items())


def tree_svg(snapshot: dict, width: int = 520, row_height: int = 14, max_rows: int = 40) -> str:
    """The snapshot's stage tree as a small inline SVG (first `max_rows` rows)."""
    tree = snapshot["tree"]
    if not tree["node"]:
        return "<p>No stages yet.</p>"
    last = max(tree["end"]) or 1
    rows = min(max(tree["row"]) + 1, max_rows)
    x = lambda step: 10 + (width - 20) * step / last  # noqa: E731 - a scale, read inline
    y = lambda row: 8 + row * row_height  # noqa: E731
    parts = []
    links = snapshot["links"]
    for step, r0, r1 in zip(links["x"], links["y0"], links["y1"]):
        if r1 < rows:
            parts.append(
                f'<line x1="{x(step):.1f}" y1="{y(r0)}" x2="{x(step):.1f}" y2="{y(r1)}" stroke="#999" stroke-width="1"/>'
            )
    for i in range(len(tree["node"])):
        if tree["row"][i] >= rows:
            continue
        x0, x1, yy = x(tree["start"][i]), x(tree["end"][i]), y(tree["row"][i])
        thick = 2 + 2 * math.log2(max(tree["trials"][i], 1))
        title = html.escape(
            f"steps {tree['start'][i]}–{tree['end'][i]}, {tree['trials'][i]} trials, {tree['state'][i]}: {tree['label'][i]}"
        )
        if tree["critical"][i]:
            parts.append(
                f'<line x1="{x0:.1f}" y1="{yy}" x2="{x1:.1f}" y2="{yy}" stroke="{CRITICAL}" stroke-opacity="0.35" stroke-width="{thick + 6:.1f}"/>'
            )
        color = COLORS.get(tree["state"][i], COLORS["untrained"])
        parts.append(
            f'<line x1="{x0:.1f}" y1="{yy}" x2="{x1:.1f}" y2="{yy}" stroke="{color}" stroke-width="{thick:.1f}"><title>{title}</title></line>'
        )
    height = y(rows - 1) + 10
    legend = " ".join(
        f'<span style="color:{COLORS[s]}">&#9632;</span>&nbsp;{s}' for s in STATES if s in tree["state"]
    )
    more = "" if rows > max(tree["row"]) else f" (first {rows} rows of {max(tree['row']) + 1})"
    return (
        f'<svg width="{width}" height="{height}" xmlns="http://www.w3.org/2000/svg">{"".join(parts)}</svg>'
        f'<div style="font-size:85%">stage tree over {last} steps, thickness: trials sharing it; {legend}{more}</div>'
    )


def snapshot_html(snapshot: dict, title: str, link: str | None = None) -> str:
    """A snapshot as a notebook block: title, dashboard link, summary, best trial, tree."""
    link_html = f' &nbsp;<a href="{html.escape(link)}" target="_blank">dashboard</a>' if link else ""
    return (
        f'<div class="dagtune">{_STYLE}<h4 style="margin:4px 0">{html.escape(title)}{link_html}</h4>'
        f'<div style="display:flex;gap:24px;flex-wrap:wrap"><div>{_summary(snapshot)}'
        f"{_best(snapshot)}</div><div>{tree_svg(snapshot)}</div></div></div>"
    )


def study_html(study: Any) -> str:
    """`Study._repr_html_`: the live study with its dashboard link."""
    client = getattr(study, "client", None)
    link = page_url(client) if client is not None else None
    title = f"Study {study.name!r} · {study.trainer.__name__} · {study.storage}"
    return snapshot_html(live_snapshot(study), title, link)


def result_html(result: Any) -> str:
    """`Result._repr_html_`."""
    return snapshot_html(result_snapshot(result), f"Result: {len(result.records)} trials")


def plot_curves(result: Any, width: int = 800, height: int = 320):
    """`Result.plot_curves`: a Bokeh figure of the metric's learning curves."""
    return curves_figure(result_snapshot(result), width, height)


def plot_tree(result: Any, width: int = 800, height: int = 360):
    """`Result.plot_tree`: a Bokeh figure of the trials' stage tree."""
    return tree_figure(result_snapshot(result), width, height)


class LiveView:
    """A study's HTML view in Jupyter, updated in place while it runs (an IPython display
    handle; no widgets needed)."""

    def __init__(self, study: Any):
        from IPython.display import HTML, display

        self.study = study
        self._html = HTML
        self.handle = display(HTML(study_html(study)), display_id=True)

    def show(self, state: Any, final: bool = False) -> None:
        self.handle.update(self._html(f"<div>{html.escape(state.line())}</div>" + study_html(self.study)))

    def close(self) -> None:
        """The last view stays in the notebook."""
