"""Bokeh figures of a snapshot: the stage tree, the learning curves, the counters and the
hyper-parameters' importance.

`StudyView` owns the data sources and figures and `update`s them in place from a new
snapshot, so a live page only swaps data; `tree_figure` and `curves_figure` build a view
once for a static figure (`Result.plot_tree`, `Result.plot_curves`, notebooks).

The tree draws each piece of training as a horizontal bar over its steps, one row per
search-plan node: the colour is its state, the thickness (and a ``×n`` label) how many
trials share it, and the critical path glows red underneath. Curves are coloured by the
trial's last value of the metric, brightest for the best.
"""

from __future__ import annotations

import html
import math

from bokeh.layouts import column
from bokeh.models import ColorBar, ColumnDataSource, Div, HoverTool, LinearColorMapper
from bokeh.palettes import Viridis256
from bokeh.plotting import figure

from dagtune.dashboard.tree import DONE, QUEUED, RUNNING, UNTRAINED
from dagtune.summary import UNKNOWN_FROM_STORAGE, seconds_label

__all__ = ["COLORS", "StudyView", "counters_html", "curves_figure", "importance_html", "tree_figure"]

COLORS = {DONE: "#4c78a8", RUNNING: "#54a24b", QUEUED: "#f58518", UNTRAINED: "#bab0ac"}
CRITICAL = "#e45756"


def _width(trials: int) -> float:
    return 3.0 + 3.0 * math.log2(max(trials, 1))


def _tree_data(snapshot: dict) -> tuple[dict, dict, dict, dict]:
    tree = snapshot["tree"]
    n = len(tree["node"])
    pieces = {
        "x0": tree["start"],
        "x1": tree["end"],
        "y": tree["row"],
        "node": [node[:8] for node in tree["node"]],
        "trials": tree["trials"],
        "state": tree["state"],
        "color": [COLORS.get(s, COLORS[UNTRAINED]) for s in tree["state"]],
        "width": [_width(t) for t in tree["trials"]],
        "label": tree["label"],
        "steps": [f"{a}–{b}" for a, b in zip(tree["start"], tree["end"])],
    }
    hot = [i for i in range(n) if tree["critical"][i]]
    critical = {
        "x0": [tree["start"][i] for i in hot],
        "x1": [tree["end"][i] for i in hot],
        "y": [tree["row"][i] for i in hot],
        "width": [_width(tree["trials"][i]) + 8 for i in hot],
    }
    shared = [i for i in range(n) if tree["trials"][i] > 1]
    marks = {
        "x": [(tree["start"][i] + tree["end"][i]) / 2 for i in shared],
        "y": [tree["row"][i] for i in shared],
        "text": [f"×{tree['trials'][i]}" for i in shared],
    }
    links = snapshot["links"]
    link_data = {"x": links["x"], "y0": links["y0"], "y1": links["y1"]}
    return pieces, critical, marks, link_data


def _curve_data(snapshot: dict) -> dict:
    curves = snapshot["curves"]
    return {
        "xs": curves["steps"],
        "ys": curves["values"],
        "trial": curves["trial"],
        "final": curves["final"],
        "status": curves["status"],
        "config": curves["config"],
    }


def counters_html(snapshot: dict) -> str:
    """The counters line: trials by status, steps trained vs shared, the merge rate of the
    trials ended so far, GPU-seconds (worker-seconds without GPUs) saved, the best trial
    (saying so when it is still running), and the first failed trial's error."""
    c = snapshot["counters"]
    executed = c.get("executed_steps")
    if executed is None:  # a stored study: say why, and what storage does tell
        note = html.escape(UNKNOWN_FROM_STORAGE, quote=True)
        executed_html = f'<span title="{note}">— (not recorded)</span>'
    else:
        executed_html = f"<b>{executed}</b>"
    rate = c.get("merge_rate_ended")
    rate_html = (
        "<b>–</b> (no trial ended yet)"
        if rate is None
        else f"<b>{rate:.2f}</b> ({c.get('ended', 0)} of {c.get('trials', 0)} trials ended)"
    )
    parts = [
        f"<b>{html.escape(snapshot['study'])}</b>",
        f"trials <b>{c.get('trials', 0)}</b> ({c.get('completed', 0)} completed, "
        f"{c.get('pending', 0)} pending, {c.get('stopped', 0)} stopped, {c.get('diverged', 0)} diverged, "
        f"{_failed_html(c.get('failed', 0))})",
        f"steps: trial <b>{c.get('trial_steps', 0)}</b> · unique <b>{c.get('unique_steps', 0)}</b> · "
        f"executed {executed_html}",
        f"merge rate {rate_html}",
    ]
    label = seconds_label(snapshot.get("gpus"))
    if "gpu_seconds" in c:
        parts.append(
            f"{label} <b>{c['gpu_seconds']:.1f}</b>, saved by reuse <b>{c.get('gpu_seconds_saved', 0.0):.1f}</b>"
        )
    elif "plan_steps" in c:
        parts.append(
            f"the model's search plan holds <b>{c['plan_steps']}</b> trained steps "
            f"(every study of it); this study's sessions recorded no {label}"
        )
    best = snapshot.get("best")
    if best is not None:
        note = best.get("note") or f"trial {best['trial']}, {best['steps']} steps"
        parts.append(
            f"best {html.escape(str(snapshot['metric']))} <b>{best['value']:.4g}</b> ({html.escape(note)})"
        )
    line = '<div class="dagtune-counters">' + " &nbsp;|&nbsp; ".join(parts) + "</div>"
    failed = (snapshot.get("failures") or {}).get("first")
    if failed:
        trial, error = failed
        line += (
            '<div class="dagtune-failures" style="color:#c0392b">first failed trial: '
            f"trial {int(trial)}: {html.escape(str(error))}</div>"
        )
    return line


def _failed_html(count: int) -> str:
    text = f"{count} failed"
    return f'<b style="color:#c0392b">{text}</b>' if count else text


def importance_html(snapshot: dict) -> str:
    """The hyper-parameters' importance for the metric, as bars ("" until the study is
    finished: `dagtune.importance`)."""
    found = snapshot.get("importance")
    if not found:
        return ""
    rows = []
    for name, value in zip(found["names"], found["values"]):
        width = max(0.0, min(1.0, value)) * 100
        rows.append(
            f"<tr><td>{html.escape(name)}</td>"
            f'<td style="width:60%"><div style="background:#4c78a8;height:0.9em;width:{width:.1f}%"></div></td>'
            f"<td>{value:.3f}</td></tr>"
        )
    title = (
        f"Importance of each hyper-parameter for {html.escape(str(snapshot.get('metric')))} "
        f"({html.escape(found['method'])}, completed trials)"
    )
    return f'<div class="dagtune-importance"><b>{title}</b><table style="width:100%">{"".join(rows)}</table></div>'


class StudyView:
    """The figures of one study, updated in place from snapshots."""

    def __init__(
        self, *, width: int = 900, tree_height: int = 360, curves_height: int = 320, stretch: bool = False
    ):
        columns = ["x0", "x1", "y", "node", "trials", "state", "color", "width", "label", "steps"]
        self.pieces = ColumnDataSource({name: [] for name in columns})
        self.critical = ColumnDataSource({"x0": [], "x1": [], "y": [], "width": []})
        self.marks = ColumnDataSource({"x": [], "y": [], "text": []})
        self.links = ColumnDataSource({"x": [], "y0": [], "y1": []})
        self.curves = ColumnDataSource(
            {name: [] for name in ("xs", "ys", "trial", "final", "status", "config")}
        )
        sizing = {"sizing_mode": "stretch_width"} if stretch else {}
        self.min_tree_height = tree_height
        self.counters = Div(text="", name="dagtune-counters", sizing_mode="stretch_width")
        self.importance = Div(text="", name="dagtune-importance", sizing_mode="stretch_width")

        tree = figure(
            title="Stage tree",
            name="dagtune-tree",
            width=width,
            height=tree_height,
            x_axis_label="step",
            tools="pan,wheel_zoom,box_zoom,reset,save",
            toolbar_location="above",
            **sizing,
        )
        tree.y_range.flipped = True
        tree.y_range.range_padding = 0.2
        tree.yaxis.visible = False
        tree.ygrid.visible = False
        tree.segment(
            "x0", "y", "x1", "y", source=self.critical, line_width="width", color=CRITICAL, alpha=0.35
        )
        tree.segment("x", "y0", "x", "y1", source=self.links, line_width=1.5, color="#888888")
        bars = tree.segment(
            "x0", "y", "x1", "y", source=self.pieces, line_width="width", color="color", legend_field="state"
        )
        tree.text(
            "x",
            "y",
            text="text",
            source=self.marks,
            text_font_size="9pt",
            text_align="center",
            text_baseline="bottom",
            y_offset=-5,
        )
        tree.add_tools(
            HoverTool(
                renderers=[bars],
                tooltips=[
                    ("node", "@node"),
                    ("steps", "@steps"),
                    ("trials", "@trials"),
                    ("state", "@state"),
                    ("config", "@label"),
                ],
            )
        )
        tree.add_layout(tree.legend[0], "right")
        self.tree = tree

        self.mapper = LinearColorMapper(palette=Viridis256)
        curves = figure(
            title="Learning curves",
            name="dagtune-curves",
            width=width,
            height=curves_height,
            x_axis_label="step",
            tools="pan,wheel_zoom,box_zoom,reset,save",
            toolbar_location="above",
            **sizing,
        )
        lines = curves.multi_line(
            "xs",
            "ys",
            source=self.curves,
            line_width=2,
            alpha=0.8,
            color={"field": "final", "transform": self.mapper},
        )
        curves.add_tools(
            HoverTool(
                renderers=[lines],
                tooltips=[
                    ("trial", "@trial"),
                    ("final", "@final{0.0000}"),
                    ("status", "@status"),
                    ("config", "@config"),
                ],
            )
        )
        curves.add_layout(ColorBar(color_mapper=self.mapper, width=10), "right")
        self.curves_figure = curves

    @property
    def layout(self):
        return column(
            self.counters, self.tree, self.curves_figure, self.importance, sizing_mode="stretch_width"
        )

    def update(self, snapshot: dict) -> None:
        """Show `snapshot` (replaces every source's data)."""
        pieces, critical, marks, links = _tree_data(snapshot)
        self.pieces.data, self.critical.data, self.marks.data, self.links.data = (
            pieces,
            critical,
            marks,
            links,
        )
        self.curves.data = _curve_data(snapshot)
        finals = snapshot["curves"]["final"]
        if finals:
            low, high = min(finals), max(finals)
            if low == high:
                low, high = low - 0.5, high + 0.5
            self.mapper.low, self.mapper.high = low, high
        self.mapper.palette = Viridis256 if snapshot.get("mode", "max") == "max" else Viridis256[::-1]
        metric = snapshot.get("metric") or "metric"
        self.curves_figure.title.text = f"Learning curves: {metric} (colour: last value)"
        self.curves_figure.yaxis.axis_label = metric
        self.tree.title.text = "Stage tree (width: trials sharing a stage; red glow: critical path)"
        self.counters.text = counters_html(snapshot)
        self.importance.text = importance_html(snapshot)
        rows = max(snapshot["tree"]["row"], default=0) + 1
        self.tree.height = max(self.min_tree_height, 90 + 18 * rows)  # room for every branch


def tree_figure(snapshot: dict, width: int = 800, height: int = 360):
    """A static figure of a snapshot's stage tree."""
    view = StudyView(width=width, tree_height=height)
    view.update(snapshot)
    return view.tree


def curves_figure(snapshot: dict, width: int = 800, height: int = 320):
    """A static figure of a snapshot's learning curves."""
    view = StudyView(width=width, curves_height=height)
    view.update(snapshot)
    return view.curves_figure
