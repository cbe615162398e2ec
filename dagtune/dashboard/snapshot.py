"""Snapshots: one compact, JSON-ready picture of a study for every view of it.

A snapshot holds the study's counters (trials by status; trial, unique and executed steps;
GPU-seconds and what reuse saved), its best trial, the stage tree laid out as pieces
(`dagtune.dashboard.tree`), the learning curves of one metric and, once no trial is
pending, the importance of each hyper-parameter for it (`dagtune.importance`). It is built from a live
study (`live_snapshot`, with running and queued stages and the critical path), from what a
study left in storage (`stored_snapshot`) or from a `Result` (`result_snapshot`), and read
by the Bokeh page, the notebook views and the command line, which therefore all agree. The
figures in it are `dagtune.summary`'s.

Columns are lists (not lists of dicts) so a snapshot stays small on its way to the Dask
scheduler through ``log_event`` (msgpack: plain ints, floats, strings, lists, dicts).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping, MutableMapping
from typing import Any

from dagtune.catalog import StoredStudy
from dagtune.collector_pause import collector_paused
from dagtune.config import Config
from dagtune.dashboard.kept import KeptSnapshot, spans_by_node
from dagtune.dashboard.tree import DONE, QUEUED, RUNNING, UNTRAINED, TrialPath, layout, overlaps
from dagtune.importance import importance_columns, method_of_columns, score_columns
from dagtune.records import COMPLETED, PENDING, ScheduleView, StudyView, Trial, TrialChanges, ViewFigures
from dagtune.summary import (
    best_note,
    best_of,
    config_text,
    error_line,
    failures,
    finite,
    merge_rate_so_far,
    metric_of,
    readable,
    saved_seconds,
    status_counts,
    trained_from_plan,
    trained_from_trials,
)

__all__ = ["CURVES_SENT", "FORMAT", "compose", "live_snapshot", "result_snapshot", "stored_snapshot"]

FORMAT = "dagtune-dashboard/1"


def _label(config: Config | None, parent: Config | None) -> str:
    """What a node changes from its parent (every hyper-parameter for a root)."""
    if config is None:
        return ""
    shown = [
        f"{name}={readable(seq)}"
        for name, seq in config.items()
        if parent is None or name not in parent or repr(parent[name]) != repr(seq)
    ]
    return ", ".join(shown)


# --------------------------------------------------------------------------- the snapshot


def compose(
    *,
    study: str,
    identity: str,
    source: str,
    trials: list[Trial],
    metric: str | None,
    mode: str,
    counters: Mapping[str, Any],
    configs: Mapping[str, Config],
    trained: Mapping[str, int],
    running: Iterable[tuple[str, int, int]] = (),
    queued: Iterable[tuple[str, int, int]] = (),
    critical: Iterable[tuple[str, int, int]] = (),
    link: Any = None,
    importance: bool = True,
    gpus: float | None = None,
    labels: MutableMapping[tuple[str, str | None], str] | None = None,
    kept: KeptSnapshot | None = None,
    figures: ViewFigures | None = None,
    changes: TrialChanges | None = None,
) -> dict:
    """A snapshot from parts every source can provide.

    `link` is the study's `dagtune.records.StudyLink` if it is half of a surrogate study
    (shown as "surrogate (S=8) of NAME" or "target of NAME (S=8)"). `gpus`: the GPUs each of
    its stages asks for (0 or None: none, so its GPU-seconds are worker-seconds).

    It carries the learning curves of at most `CURVES_SENT` trials (``curves_total`` says
    how many have one), so a page of a 100,000-trial study stays small.

    Besides `counters` it holds the live merge rate (``counters["merge_rate_ended"]``, over
    the ``counters["ended"]`` trials that ended: `dagtune.summary.merge_rate_so_far`), the
    failed trials (``failures``: how many, and the first one's id and error line) and where
    the best value comes from (``best["note"]``: a running trial says so).

    `configs` maps plan nodes to their configs (for labels), `trained` to the last step
    trained on them; `running` and `queued` are spans of running tasks and queued stages.
    With `importance`, a snapshot of a study with no pending trial holds the importance of
    each hyper-parameter for the metric (computed once per set of results). `labels` keeps
    the tree's labels from one snapshot of a study to the next (a caller's dict, filled here):
    a node's label is made from its config and its parent's, which never change, so a
    running study's snapshot labels only the nodes new since the last one. `kept` (a running
    study's feed's `KeptSnapshot`, its labels used instead of `labels`) keeps the tree's layout
    and the curves too, so the snapshot redoes only what changed since the feed's last one:
    the same snapshot as one made from scratch. `figures` (a live study's, kept as its trials
    change: `dagtune.records.ViewFigures`) give the best trial, where they are by the metric
    and mode shown, the live merge rate, the failures and the hyper-parameters' names, so that
    these read no trial. `changes` (a live study's view's, `dagtune.records.TrialChanges`) tells
    `kept` which trials changed since the view it was last brought to, so that it looks at
    those only (without, it looks at every trial).
    """
    parts = {
        "study": study,
        "identity": identity,
        "source": source,
        "counters": counters,
        "link": link,
        "importance": importance,
        "gpus": gpus,
        "figures": figures,
    }
    if kept is not None:
        return _kept_compose(
            trials, metric, mode, configs, trained, running, queued, critical, kept, changes, **parts
        )
    if metric is None:
        metric, mode = metric_of(trials)
    running, queued = list(running), list(queued)
    running_on, queued_on = spans_by_node(running), spans_by_node(queued)

    def state(node: str, start: int, end: int) -> str:
        if end <= trained.get(node, -1):
            return DONE
        if overlaps(running_on.get(node, ()), start, end):
            return RUNNING
        if overlaps(queued_on.get(node, ()), start, end):
            return QUEUED
        return UNTRAINED

    boundaries: dict[str, set[int]] = {}
    for node, a, b in [*running, *queued]:
        boundaries.setdefault(node, set()).update((a, b))
    for node, step in trained.items():
        boundaries.setdefault(node, set()).add(step)
    paths = [TrialPath(t.id, t.segments) for t in sorted(trials, key=lambda t: t.id)]
    tree = layout(paths, state, boundaries=boundaries, critical=critical)
    made = {} if labels is None else labels
    for node, parent in tree.parents.items():
        if (node, parent) not in made:
            made[node, parent] = _label(configs.get(node), configs.get(parent) if parent else None)
    curves: dict[str, list] = {k: [] for k in ("trial", "status", "final", "config", "steps", "values")}
    drawn = [t for t in trials if any(finite(p.get(metric)) for p in t.points)]
    for trial in sorted(_curves_sent(drawn, metric, mode), key=lambda t: t.id):
        points = [(p.step, p.get(metric)) for p in trial.points if finite(p.get(metric))]
        curves["trial"].append(trial.id)
        curves["status"].append(trial.status)
        curves["final"].append(points[-1][1])
        curves["config"].append(config_text(trial.config))
        curves["steps"].append([s for s, _ in points])
        curves["values"].append([float(v) for _, v in points])
    shown_tree = {
        "node": [p.node for p in tree.pieces],
        "start": [p.start for p in tree.pieces],
        "end": [p.end for p in tree.pieces],
        "row": [p.row for p in tree.pieces],
        "trials": [p.trials for p in tree.pieces],
        "state": [p.state for p in tree.pieces],
        "critical": [p.critical for p in tree.pieces],
        "label": [made.get((p.node, tree.parents.get(p.node)), "") for p in tree.pieces],
    }
    return _assembled(
        trials,
        metric,
        mode,
        shown_tree,
        tree.links,
        dict(tree.parents),
        curves,
        len(drawn),
        **parts,
    )


def _kept_compose(
    trials: list[Trial],
    metric: str | None,
    mode: str,
    configs: Mapping[str, Config],
    trained: Mapping[str, int],
    running: Iterable[tuple[str, int, int]],
    queued: Iterable[tuple[str, int, int]],
    critical: Iterable[tuple[str, int, int]],
    kept: KeptSnapshot,
    changes: TrialChanges | None,
    **parts: Any,
) -> dict:
    """`compose` with the tree and the curves brought up to date in `kept`, looking only at the
    trials that `changes` says changed since the view `kept` was last brought to."""
    changed = kept.changed_since(changes)
    metric, mode = kept.curves.update(trials, changed, metric, mode)
    kept.tree.update(trials, changed, trained, running, queued, critical)
    made = kept.labels
    for node in kept.tree.new_nodes:
        parent = kept.tree.parents[node]
        if (node, parent) not in made:
            made[node, parent] = _label(configs.get(node), configs.get(parent) if parent else None)
    curves = kept.curves.curves(kept.curves.chosen(CURVES_SENT, mode), metric)
    kept.brought_to(changes)
    return _assembled(
        trials,
        metric,
        mode,
        kept.tree.columns(made),
        kept.tree.links,
        dict(kept.tree.ordered_parents),
        curves,
        len(kept.curves.drawn),
        **parts,
    )


def _assembled(
    trials: list[Trial],
    metric: str | None,
    mode: str,
    tree: dict[str, list],
    links: list[tuple[int, int, int]],
    parents: dict[str, str | None],
    curves: dict[str, list],
    drawn: int,
    *,
    study: str,
    identity: str,
    source: str,
    counters: Mapping[str, Any],
    link: Any,
    importance: bool,
    gpus: float | None,
    figures: ViewFigures | None,
) -> dict:
    """The snapshot, from its tree and curves and the figures of the trials (`figures` where
    given, else read off every trial)."""
    if figures is not None and (figures.metric, figures.mode) == (metric, mode):
        best = figures.best
    else:
        best = best_of(trials, metric, mode)
    if figures is not None:
        so_far, ended = figures.merge_rate_ended, figures.ended
        first = figures.first_failed
        failed = figures.failed, None if first is None else [first.id, error_line(first.error)]
        hp = list(figures.hyper_parameters)
    else:
        so_far, ended = merge_rate_so_far(trials)
        listed = failures(trials)
        failed = len(listed), list(listed[0]) if listed else None
        hp = sorted({name for t in trials for name in t.config})
    finished = importance and not any(t.status == PENDING for t in trials)
    return {
        "format": FORMAT,
        "study": study,
        "identity": identity,
        "link": "" if link is None else str(link),
        "source": source,
        "time": time.time(),
        "metric": metric,
        "mode": mode,
        "hp": hp,
        "counters": {**counters, "merge_rate_ended": so_far, "ended": ended},
        "gpus": gpus or 0,
        "failures": {"count": failed[0], "first": failed[1]},
        "best": None
        if best is None
        else {
            "trial": best.id,
            "value": float(best.metrics[metric]),
            "steps": best.reached,
            "status": best.status,
            "note": best_note(best),
            "config": {name: readable(seq) for name, seq in best.config.items()},
        },
        "tree": tree,
        "links": {
            "x": [x for x, _, _ in links],
            "y0": [y for _, y, _ in links],
            "y1": [y for _, _, y in links],
        },
        "parents": parents,
        "curves": curves,
        "curves_total": drawn,
        "importance": _importance(trials, metric, mode) if finished else None,
    }


#: a snapshot carries at most this many learning curves (the best half by the metric's last
#: value, then trials evenly spaced by id); ``curves_total`` says how many trials have one
CURVES_SENT = 1000


def _curves_sent(trials: list[Trial], metric: str | None, mode: str) -> list[Trial]:
    """The trials whose curves a snapshot carries (all of them up to `CURVES_SENT`)."""
    if len(trials) <= CURVES_SENT:
        return trials

    def last(trial: Trial) -> float:
        value = next(v for p in reversed(trial.points) if finite(v := p.get(metric)))
        return -value if mode == "max" else value

    best = sorted(trials, key=lambda t: (last(t), t.id))[: CURVES_SENT // 2]
    taken = {t.id for t in best}
    rest = sorted((t for t in trials if t.id not in taken), key=lambda t: t.id)
    count = CURVES_SENT - len(best)
    return best + [rest[i * len(rest) // count] for i in range(count)]


_IMPORTANCE: dict[str, dict | None] = {}  # importance_inputs (as JSON) -> what the snapshot shows
_IMPORTANCE_KEPT = 16
#: the page scores importance on at most this many completed trials (evenly spaced by id):
#: fANOVA's cost grows faster than the trials (on this project's 2-core machine, CPU time for
#: two or three numeric hyper-parameters: 2.2 s at 256 trials, 5.6 s at 500, 16 s at 1,000,
#: 50 s at 2,000), and the live page scores it in the study's process when the study ends
IMPORTANCE_TRIALS = 500


def _importance(trials: list[Trial], metric: str | None, mode: str) -> dict | None:
    """The hyper-parameters' importance for a finished study (`dagtune.importance`), as
    ``{"method", "names", "values"}``; None when it can't be computed (fewer than 2
    completed trials, no metric)."""
    return scored_importance(importance_inputs(trials, metric, mode))


def importance_inputs(trials: list[Trial], metric: str | None, mode: str) -> dict | None:
    """What the page's importance of a finished study is scored from, as plain JSON values:
    the variables and metric values (`dagtune.importance.importance_columns`) of at most
    `IMPORTANCE_TRIALS` completed trials, evenly spaced by id, and how many completed; None
    when nothing can be scored (no metric, fewer than 2 trials reported it). A study's read
    index keeps these rather than the scores, so closing a study never waits for fANOVA
    (seconds): the page scores them when it is drawn."""
    if metric is None:
        return None
    used = sorted((t for t in trials if t.status == COMPLETED), key=lambda t: t.id)
    total = len(used)
    if total > IMPORTANCE_TRIALS:
        used = [used[i * total // IMPORTANCE_TRIALS] for i in range(IMPORTANCE_TRIALS)]
    try:
        columns, values = importance_columns(used, metric)
    except ValueError:
        return None
    return {"mode": mode, "sampled": len(used), "total": total, "columns": columns, "values": values}


def scored_importance(inputs: Mapping[str, Any] | None) -> dict | None:
    """The page's importance (``{"method", "names", "values"}``) from `importance_inputs`;
    None when there are none or they can't be scored. Computed once per set of inputs:
    fANOVA takes seconds."""
    if inputs is None:
        return None
    key = json.dumps(inputs, sort_keys=True, default=str)
    if key not in _IMPORTANCE:
        try:
            columns, values = inputs["columns"], inputs["values"]
            sampled, total = inputs["sampled"], inputs["total"]
            scores = score_columns(columns, values, inputs["mode"])
        except (
            KeyError,
            TypeError,
            ValueError,
            ImportError,
            RuntimeError,
        ):  # nothing to score, or a damaged index
            found = None
        else:
            method = method_of_columns(columns)
            method += f", {sampled} of {total} trials" if sampled < total else ""
            found = {"method": method, "names": list(scores), "values": list(scores.values())}
        while len(_IMPORTANCE) >= _IMPORTANCE_KEPT:
            _IMPORTANCE.pop(next(iter(_IMPORTANCE)))
        _IMPORTANCE[key] = found
    return _IMPORTANCE[key]


# --------------------------------------------------------------------------- sources


def result_snapshot(result: Any, name: str = "result", *, importance: bool = False) -> dict:
    """A snapshot of a `Result` (its trials only: no plan, nothing running); with
    `importance`, the hyper-parameters' importance too (the notebook views go without)."""
    trials = list(result.records)
    configs: dict[str, Config] = {}
    for trial in trials:
        if trial.segments:
            configs.setdefault(trial.segments[-1][0], trial.config)
    for trial in trials:
        for node, _, _ in trial.segments:
            configs.setdefault(node, trial.config)
    counters = {**status_counts(trials), **result.report}
    counters["gpu_seconds_saved"] = saved_seconds(result.report)
    return compose(
        study=name,
        identity="",
        source="result",
        trials=trials,
        metric=result.metric,
        mode=result.mode,
        counters=counters,
        configs=configs,
        trained=trained_from_trials(trials),
        importance=importance,
        gpus=getattr(result, "gpus", None),
    )


def stored_snapshot(
    study: StoredStudy, metric: str | None = None, mode: str | None = None, *, importance: bool = True
) -> dict:
    """A snapshot of a study as storage holds it (`dagtune.catalog.load_study`; nothing runs:
    pieces are done or untrained); without the importance unless `importance`."""
    if metric is None:
        metric, guessed = metric_of(study.trials)
        mode = mode or guessed
    nodes = {node for t in study.trials for node, _, _ in t.segments}
    report = study.report()
    if "gpu_seconds" in report:
        report["gpu_seconds_saved"] = saved_seconds(report)
    return compose(
        study=study.name,
        identity=study.identity,
        source="storage",
        trials=study.trials,
        metric=metric,
        mode=mode or "max",
        counters={**status_counts(study.trials), **report},
        configs={n: study.plan.nodes[n].config for n in nodes},
        trained=trained_from_plan(study.plan, nodes),
        link=study.describe.get("link"),
        importance=importance,
        gpus=study.describe.get("gpus"),
    )


def live_snapshot(
    study: Any,
    labels: MutableMapping[tuple[str, str | None], str] | None = None,
    *,
    kept: KeptSnapshot | None = None,
) -> dict:
    """A snapshot of a running `Study` (from its read model, `Study.view(schedule=True)`);
    `labels`: the tree's labels made by earlier snapshots of this study (`compose`); `kept`:
    what the earlier snapshots of one feed of this study kept (`dagtune.dashboard.kept`), so
    this one redoes only the trials and tree nodes that changed since.

    Taken with the cyclic garbage collector paused: at 10,000 trials a snapshot makes
    hundreds of thousands of short-lived objects (freed by their reference counts), whose
    count set off collections that each walked the study's whole heap and freed nothing
    (0.88 s of CPU per snapshot against 0.52 s without them, perf/RESULTS.md section 9l)."""
    with collector_paused():
        return _live_snapshot(study, labels, kept)


def _live_snapshot(
    study: Any, labels: MutableMapping[tuple[str, str | None], str] | None, kept: KeptSnapshot | None
) -> dict:
    view: StudyView = study.view(schedule=True)
    schedule = view.schedule or ScheduleView()
    trials = list(view.trials)
    statuses = status_counts(trials) if view.figures is None else dict(view.figures.statuses)
    counters = {
        **statuses,
        **view.report,
        "gpu_seconds_saved": saved_seconds(view.report),
        "running_tasks": schedule.running_tasks,
        "queued_stages": schedule.queued_stages,
    }
    snapshot = compose(
        study=view.name,
        identity=view.identity,
        source="live",
        trials=trials,
        metric=view.metric,
        mode=view.mode,
        counters=counters,
        configs=view.configs or {},
        trained=view.trained or {},
        running=schedule.running,
        queued=schedule.queued,
        critical=schedule.critical,
        link=view.link,
        importance=False,  # computed below, apart: it may take seconds
        gpus=view.gpus,
        labels=labels,
        kept=kept,
        figures=view.figures,
        changes=view.changes,
    )
    if not statuses[PENDING]:
        snapshot["importance"] = _importance(trials, snapshot["metric"], snapshot["mode"])
    return snapshot
