"""A study's read index: what `dagtune status`, `dagtune tree` and the page show of it,
kept in storage with the journal bytes it was read from, so reading a large study does not
parse every journal line again.

Reading a stored study folds every line of its records journal and of its model's search
plan journal into trials (`dagtune.catalog.load_study`): about 15 us a line and several
lines a trial, so half a minute and more than a gigabyte for 100,000 trials, on every
`dagtune status`. Yet a study that has ended does not change. So the study's writer (the
holder of its writer lease, `dagtune.study_lease`), when it closes, computes what the views
show from the trials it read and wrote (`digest`: the status row, the failed trials, the
page's snapshot and the tree's trial ends) and writes it to ``studies/{name}/index.json.gz``
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

import json
import logging
import time
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dagtune.catalog import StoredStudy, check_study_name, figures_of, load_study, stored_study
from dagtune.checkpoints import CheckpointStore
from dagtune.durable import Persistence, index_path, put_whole
from dagtune.plan import Journal
from dagtune.summary import best_of, failures, metric_of, status_counts

__all__ = [
    "INDEX_FORMAT",
    "StoredView",
    "digest",
    "read_index",
    "rebuild_index",
    "status_figures",
    "study_status",
    "study_view",
    "write_index",
    "write_study_index",
]

log = logging.getLogger("dagtune")

INDEX_FORMAT = "dagtune-index/1"


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
    ended = [t for t in trials if t.done and t.reached > 0]
    so_far = figures_of(ended, stored.plan)["merge_rate"] if ended else None  # summary.merge_rate_so_far
    best = best_of(trials, metric, mode)
    link = stored.describe.get("link")
    return {
        "metric": metric,
        "mode": mode,
        "hp": sorted({name for t in trials for name in t.config}),
        "report": report,
        "counters": {**status_counts(trials), **report, "merge_rate_ended": so_far, "ended": len(ended)},
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


def _view_of(stored: StoredStudy) -> StoredView:
    from dagtune.dashboard.snapshot import stored_snapshot  # the dashboard package: loaded when drawn

    snapshot = stored_snapshot(stored)
    return StoredView(
        stored.name,
        len(stored.trials),
        status_figures(stored),
        snapshot,
        _tree_ends(stored, snapshot["metric"]),
        stored,
    )


def digest(stored: StoredStudy, covers: Mapping[str, Mapping[str, int]]) -> dict[str, Any]:
    """The index of `stored`, read from journals holding exactly `covers` (journal directory
    under the storage root -> file name -> size)."""
    return _index_of(_view_of(stored), stored.identity, covers)


def _index_of(view: StoredView, identity: str, covers: Mapping[str, Mapping[str, int]]) -> dict[str, Any]:
    return {
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
    """The closing writer's index: its study read back as a reader would read it
    (`Persistence.read_back`), digested and written (while it holds the study's lease);
    nothing is written when the read back can't be vouched for."""
    read = persistence.read_back()
    if read is None:
        return
    records, plan, covers = read
    stored = stored_study(persistence.name, records, plan, [])
    persistence.lease.ensure()
    write_index(persistence.store, digest(stored, covers))


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
    return StoredView(name, index["trials"], index["status"], snapshot, index["ends"])


def rebuild_index(store: CheckpointStore, name: str) -> StoredView:
    """Read study `name` from its journals and write its index (what its writer does when it
    closes). Only the holder of the study's writer lease, or a process that knows no study
    writes it (a store being prepared), may call this."""
    stored = load_study(store, name)
    view = _view_of(stored)
    if stored.covers is not None:  # else a file was skipped as another journal's: nothing to vouch for
        write_index(store, _index_of(view, stored.identity, stored.covers))
    return view
