"""A study's read index: what `dagtune status`, `dagtune tree` and the page show of it,
kept in storage with the journal bytes it was read from, so reading a large study does not
parse every journal line again.

Reading a stored study folds every line of its records journal and of its model's search
plan journal into trials (`dagtune.catalog.load_study`): about 15 us a line and several
lines a trial, so half a minute and more than a gigabyte for 100,000 trials, on every
`dagtune status`. Yet a study that has ended does not change. So the study's writer (the
holder of its writer lease, `dagtune.study_lease`), when it closes, computes what the views
show (`digest`: the status row, the failed trials, the page's snapshot, the tree's trial
ends and, in ``detail``, what `dagtune status --study` adds: the best `TOP_KEPT` trials by
the default metric and the incidents; an index without ``detail``, as the first writers of
this format left, sends that command to the journals) from what it holds
(`dagtune.durable.Persistence.session_study`: the records it folded when it opened, its
coordinator's trials, whose every change it recorded, and its plan; no journal line is read
again, whatever the study's size, unless another writer changed the shared plan meanwhile:
then the plan is folded afresh) and writes it to ``studies/{name}/index.json.gz``
with *what it covers*: every file of both journals and its size
(`dagtune.plan.Journal.covered`). Journals only grow (object stores add segments, never
rewrite one), so while each journal holds exactly those files at those sizes the bytes are
the ones the index was computed from, and a fresh read would fold them into the same trials:
the index is the answer. Readers (`study_view`) check that with one listing of each journal
directory and use the index; when anything differs (a study running or resumed, another
study of the model writing the shared plan, a lost or cut-short write), or the index is
missing, unreadable, of another format or another study, they read the journals as before.
So the journals stay the truth and an index never makes an answer wrong, only a read fast.

The index is written whole: to a temporary file renamed over it on a local disk (a killed
writer leaves the old index or none, never part of one), in one put on an object store.
"""

from __future__ import annotations

import heapq
import json
import logging
import time
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from dagtune.catalog import StoredStudy, check_study_name, load_study, stored_study
from dagtune.checkpoints import CheckpointStore
from dagtune.collector_pause import collector_paused
from dagtune.config import config_dumps, config_from_json
from dagtune.dashboard.snapshot import (
    importance_inputs,
    scored_importance,
    stored_snapshot,
)
from dagtune.durable import Persistence, index_path, put_whole
from dagtune.frames import TrialRow, row_of
from dagtune.plan import Journal
from dagtune.records import PENDING, Trial
from dagtune.summary import best_of, failures, merge_rate_so_far, metric_of, status_counts

__all__ = [
    "INDEX_FORMAT",
    "TOP_KEPT",
    "StoredView",
    "StudyDetail",
    "digest",
    "read_index",
    "rebuild_index",
    "status_figures",
    "study_detail",
    "study_status",
    "study_view",
    "top_rows",
    "write_index",
    "write_study_index",
]

log = logging.getLogger("dagtune")

INDEX_FORMAT = "dagtune-index/1"
TOP_KEPT = 100  # best trials an index keeps for `dagtune status --study` (its ``--top``)


def status_figures(stored: StoredStudy, metric: str | None = None, mode: str | None = None) -> dict[str, Any]:
    """What `dagtune status` shows of a stored study, as the page's snapshot has it
    (``metric``, ``mode``, ``hp``, ``best``, ``counters``, with `dagtune.summary`'s figures),
    its ``report``, its ``failures`` (trial id and error line, in trial order) and ``link``:
    a walk of the trials, without the stage tree's layout and learning curves the page draws."""
    trials = stored.trials
    if metric is None:
        metric, guessed = metric_of(trials)
        mode = mode or guessed
    mode = mode or "max"
    report = stored.report()
    so_far, ended = merge_rate_so_far(trials)
    best = best_of(trials, metric, mode)
    link = stored.describe.get("link")
    return {
        "metric": metric,
        "mode": mode,
        "hp": sorted({name for t in trials for name in t.config}),
        "report": report,
        "counters": {**status_counts(trials), **report, "merge_rate_ended": so_far, "ended": ended},
        "best": None
        if best is None
        else {
            "trial": best.id,
            "value": float(best.metrics[metric]),
            "steps": best.reached,
            "status": best.status,
        },
        "failures": [list(failed) for failed in failures(trials)],
        "link": None if link is None else str(link),
    }


def top_rows(trials: Iterable[Trial], metric: str | None, mode: str, top: int) -> list[TrialRow]:
    """The rows of the best `top` of `trials` by `metric` (`mode` ``max`` or ``min``; NaN last,
    then by trial id), best first: what `dagtune status --study` lists."""
    if metric is None:
        return []
    scored = [t for t in trials if t.metrics and metric in t.metrics]
    sign = -1.0 if mode == "min" else 1.0
    ranked = heapq.nsmallest(
        top, scored, key=lambda t: (t.metrics[metric] != t.metrics[metric], -sign * t.metrics[metric], t.id)
    )
    return [row_of(t) for t in ranked]


def _detail_of(stored: StoredStudy, status: Mapping[str, Any]) -> dict[str, Any]:
    """What `dagtune status --study` shows beyond the status row (default metric): the best
    `TOP_KEPT` trials' rows, how many trials have the metric, the study's ``gpus`` and the
    incidents of reading its journals."""
    metric = status["metric"]
    rows = top_rows(stored.trials, metric, status["mode"], TOP_KEPT)
    scored = sum(1 for t in stored.trials if metric is not None and t.metrics and metric in t.metrics)
    return {
        "top": [[r.id, r.status, r.steps, dict(r.metrics), config_dumps(r.config), r.error] for r in rows],
        "scored": scored,
        "gpus": stored.describe.get("gpus"),
        "incidents": list(stored.incidents),
    }


@dataclass
class StudyDetail:
    """What `dagtune status --study` shows of a study beyond its status row, with the
    default metric: its best trials' rows (best first, at most the ``top`` asked), its
    search plan's `identity`, its ``gpus`` (`dagtune.summary.seconds_label`) and the
    incidents of reading its journals."""

    identity: str
    top: list[TrialRow]
    gpus: Any
    incidents: list[str]


def study_detail(store: CheckpointStore, name: str, top: int) -> tuple[dict[str, Any], StudyDetail] | None:
    """Study `name`'s status figures and `StudyDetail` (its `top` best trials) from its index,
    when the index is current and holds them (an index written before it kept them does not,
    nor one that keeps fewer than `top` of more trials), else None: read the journals."""
    index = read_index(store, name)
    detail = None if index is None else index.get("detail")
    if not isinstance(detail, dict) or not isinstance(index.get("identity"), str):
        return None
    try:
        kept, scored = detail["top"], detail["scored"]
        if len(kept) < min(top, scored):
            return None
        rows = [
            TrialRow(
                int(i),
                str(status),
                int(steps),
                dict(metrics),
                config_from_json(json.loads(config)),
                str(error),
            )
            for i, status, steps, metrics, config, error in kept[:top]
        ]
        incidents = [str(line) for line in detail["incidents"]]
    except (KeyError, TypeError, ValueError) as error:
        log.warning(
            "dagtune: the index of study %s has no readable detail (%s); the journals are read", name, error
        )
        return None
    return index["status"], StudyDetail(index["identity"], rows, detail.get("gpus"), incidents)


def _tree_ends(stored: StoredStudy, metric: str | None) -> dict[str, list[str]]:
    """The trials ending on each node of the stage tree (``#id value``), in trial order, as
    `dagtune tree` lists them; trials the plan has no path for are left out."""
    ends: dict[str, list[str]] = {}
    for trial in stored.trials:
        if not trial.segments:  # the plan has no path for it (its node events are missing)
            continue
        value = (trial.metrics or {}).get(metric)
        shown = f"{value:.4g}" if isinstance(value, float) else "—"
        ends.setdefault(trial.segments[-1][0], []).append(f"#{trial.id} {shown}")
    return ends


@dataclass
class StoredView:
    """What the views show of one stored study: `status` (`status_figures` with the default
    metric), `snapshot` (the page's, `dagtune.dashboard.snapshot.stored_snapshot`), the
    trials ending on each node (`ends`, for `dagtune tree`) and how many trials it has.
    `stored` is the study read from its journals, or None when this came from its index
    (then whatever else the views need, such as `dagtune status --study`'s best trials and
    incidents, is read from the journals: `load_study`)."""

    name: str
    trials: int
    status: dict[str, Any]
    snapshot: dict[str, Any]
    ends: dict[str, list[str]]
    stored: StoredStudy | None = None
    importance_inputs: dict[str, Any] | None = None

    def page_snapshot(self) -> dict[str, Any]:
        """The page's snapshot; where the index kept only what the importance is scored from
        (`importance_inputs`), scored now (once per process and inputs: fANOVA takes seconds,
        which the study's closing writer does not spend)."""
        if self.importance_inputs is None:
            return self.snapshot
        return {**self.snapshot, "importance": scored_importance(self.importance_inputs)}


def _view_of(stored: StoredStudy, *, score_importance: bool = True) -> StoredView:
    """What the views show of `stored`; unless `score_importance`, the page's snapshot holds
    no importance and the view what it would be scored from (what an index keeps)."""
    snapshot = stored_snapshot(stored, importance=score_importance)
    finished = not any(t.status == PENDING for t in stored.trials)
    inputs = None
    if finished and not score_importance:
        inputs = importance_inputs(stored.trials, snapshot["metric"], snapshot["mode"])
    return StoredView(
        stored.name,
        len(stored.trials),
        status_figures(stored),
        snapshot,
        _tree_ends(stored, snapshot["metric"]),
        stored,
        inputs,
    )


def digest(
    stored: StoredStudy, covers: Mapping[str, Mapping[str, int]], *, detail: bool = True
) -> dict[str, Any]:
    """The index of `stored`, read from journals holding exactly `covers` (journal directory
    under the storage root -> file name -> size); with `dagtune status --study`'s detail
    unless `detail` is False (its incidents are not known exactly)."""
    view = _view_of(stored, score_importance=False)
    return _index_of(view, stored.identity, covers, _detail_of(stored, view.status) if detail else None)


def _index_of(
    view: StoredView, identity: str, covers: Mapping[str, Mapping[str, int]], detail: dict[str, Any] | None
) -> dict[str, Any]:
    extra = {} if detail is None else {"detail": detail}  # indexes before it had none: readers read journals
    if view.importance_inputs is not None:  # earlier indexes hold the importance in their snapshot
        extra["importance_inputs"] = view.importance_inputs
    return {
        **extra,
        "format": INDEX_FORMAT,
        "study": view.name,
        "identity": identity,
        "covers": {directory: dict(files) for directory, files in covers.items()},
        "trials": view.trials,
        "status": view.status,
        "snapshot": view.snapshot,
        "ends": view.ends,
    }


def write_index(store: CheckpointStore, index: Mapping[str, Any]) -> None:
    """Write `index` (a `digest`) whole, over the study's earlier one."""
    data = zlib.compress(json.dumps(index, separators=(",", ":")).encode(), 6)
    put_whole(store.fs, index_path(store.root, index["study"]), data)


def write_study_index(persistence: Persistence) -> None:
    """The closing writer's index: its study as a reader would fold it, built from what the
    session holds (`Persistence.session_study`: no line of its records read again), or
    where that can't be vouched for read back (`Persistence.read_back`: its own records),
    digested and written (while it holds the study's lease); nothing is written when
    neither can be vouched for."""
    held = persistence.session_study()
    if held is not None:
        records, folded, planned, covers = held
    else:
        read = persistence.read_back()
        if read is None:
            return
        (records, planned, covers), folded = read, None
    # a reader's incidents are known exactly when this session saw none in the study's
    # records, and none in the plan or read the plan afresh (as a reader does)
    fresh = planned is not persistence.plan_journal
    exact = not persistence.records.incidents and (fresh or not planned.journal.incidents)
    incidents = list(planned.journal.incidents) if exact else []
    stored = stored_study(persistence.name, records, planned.plan, incidents, folded)
    persistence.lease.ensure()
    write_index(persistence.store, digest(stored, covers, detail=exact))


def _current(store: CheckpointStore, covers: Any) -> bool:
    """Whether every journal `covers` names holds exactly those files at those sizes."""
    if not isinstance(covers, dict) or not covers:
        return False
    for directory, files in covers.items():
        if not isinstance(directory, str) or ".." in directory.split("/") or not isinstance(files, dict):
            return False
        if Journal(store.fs, f"{store.root}/{directory}").sizes() != files:
            return False
    return True


def read_index(store: CheckpointStore, name: str) -> dict[str, Any] | None:
    """Study `name`'s index if it is there, readable and current (module docstring), else None."""
    path = index_path(store.root, check_study_name(name))
    try:
        data = store.fs.cat_file(path)
    except FileNotFoundError:
        return None
    except OSError as error:  # permissions, a directory in its place: the journals say it all
        log.warning(
            "dagtune: the index %s can't be read (%s: %s); the journals are read instead",
            path,
            type(error).__name__,
            error,
        )
        return None
    try:
        index = json.loads(zlib.decompress(data))
        fields = ("trials", "status", "snapshot", "ends")
        if not isinstance(index, dict) or index.get("format") != INDEX_FORMAT or index.get("study") != name:
            raise ValueError(f"not a {INDEX_FORMAT} index of study {name!r}")
        if not all(isinstance(index.get(key), int if key == "trials" else dict) for key in fields):
            raise ValueError("fields missing")
    except (ValueError, zlib.error, RecursionError) as error:
        log.warning("dagtune: the index %s can't be read (%s); the journals are read instead", path, error)
        return None
    return index if _current(store, index.get("covers")) else None


def study_status(store: CheckpointStore, name: str, plans: dict | None = None) -> dict[str, Any]:
    """`status_figures` of study `name` (default metric): from its index when that is
    current, else read from its journals (without the page's snapshot)."""
    index = read_index(store, name)
    return status_figures(load_study(store, name, plans)) if index is None else index["status"]


def study_view(store: CheckpointStore, name: str, plans: dict | None = None) -> StoredView:
    """What the views show of study `name`: from its index when that is current, else read
    from its journals (`dagtune.catalog.load_study`, which `plans` caches the search plans of)."""
    index = read_index(store, name)
    if index is None:
        return _view_of(load_study(store, name, plans))
    snapshot = {**index["snapshot"], "time": time.time()}  # read now, as one read from the journals
    inputs = index.get("importance_inputs")
    return StoredView(
        name,
        index["trials"],
        index["status"],
        snapshot,
        index["ends"],
        None,
        inputs if isinstance(inputs, dict) else None,
    )


def rebuild_index(store: CheckpointStore, name: str) -> StoredView:
    """Read study `name` from its journals and write its index (what its writer does when it
    closes). Only the holder of the study's writer lease, or a process that knows no study
    writes it (a store being prepared), may call this."""
    with collector_paused():  # the study and its views all live until the index is written
        stored = load_study(store, name)
        view = _view_of(stored, score_importance=False)
        if stored.covers is not None:  # else a file was skipped as another journal's: nothing to vouch for
            write_index(
                store, _index_of(view, stored.identity, stored.covers, _detail_of(stored, view.status))
            )
    return view
