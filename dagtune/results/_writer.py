"""`ResultsWriter`: the coordinator writes its study's trials to the results group, a write
costing what changed since the last one (format ``dagtune-results/5``, `dagtune.results`)."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Collection, Mapping
from typing import Any

import numpy as np

from dagtune.records import Trial
from dagtune.results._format import (
    CHUNK_ROWS,
    CHUNK_STEPS,
    CHUNK_TRIALS,
    FORMAT,
    cells_array,
    columns,
    create_array,
    missing_cell,
    names_added,
    open_group,
    put_steps,
    text_array,
)
from dagtune.results._log import LogChanges, entry_text
from dagtune.results._reader import StoredTable
from dagtune.storage_retry import StorageRetry, single_attempt_options

__all__ = ["COMPACT_FRACTION", "COMPACT_MIN", "ResultsWriter"]

COMPACT_FRACTION = 0.25  # the change log applied to the base once it reaches this part of it
COMPACT_MIN = 4096  # ... and at least this many rows and points
#: entries the change log has room for when made; it doubles when full and never shrinks
#: (readers read its committed entries, attribute ``log``), so a write resizes it seldom
_LOG_ROOM = 16

#: a curve's points to store: metric array name -> (trial ids, steps from 0, values)
_Points = dict[str, tuple[list[int], list[int], list[float]]]


class ResultsWriter:
    """Writes the trials of one study to its zarr group (the coordinator's job).

    A write costs what changed since the last one, however the changes are spread over the
    trials: the rows of the trials that changed (all the cells of a trial new to the group,
    the changing ones of a trial written before) and the learning curves' new points go, as
    one entry of packed rows, to the group's change log, and the group's attributes are
    written, which commits it: three store writes (the entry, the log's shape, the
    attributes; and the ``step`` coordinate when the steps grew). When the log outgrows
    `compact_fraction` of the table (and `compact_min` rows and points), and when the study
    closes (`compact`), it is applied to the base arrays and emptied: amortized, a constant
    per changed row and point.

    Which trials changed: those of `write`'s `changed` (ids the caller saw change since the
    last write: the study's ledger marks them as events arrive), each compared with what
    its row showed when written (one small tuple), so a write visits the trials that changed,
    not the table. Without `changed` every trial is compared, as is at the session's first
    write, which takes the group as storage holds it (a resumed study's rows are compared
    with the trials restored: the write stores only the rows and points that differ).

    Crash safety: what a write stores before its commit is beyond the committed counts
    (readers ignore it, the next write overwrites it), and compacting writes into the base
    only what the committed log still says (readers apply the log over the base), so a
    write stopped anywhere leaves the rows before it or after it. The exceptions: a group of
    an earlier format, another study's or none is written anew at the session's first write,
    and so is the group after a trial written before went missing.

    A write that fails with a transient storage error is retried whole by `retry`
    (`dagtune.storage_retry`; a write is idempotent), and `guard`, if given, is called before
    every attempt and may raise to forbid it (the study's writer lease)."""

    def __init__(
        self,
        url: str,
        storage_options: Mapping[str, Any] | None,
        *,
        study: str,
        identity: str,
        retry: StorageRetry | None = None,
        guard: Callable[[], None] | None = None,
        compact_fraction: float = COMPACT_FRACTION,
        compact_min: int = COMPACT_MIN,
    ) -> None:
        self.url = url
        self.storage_options = dict(storage_options or {})
        self.study, self.identity = study, identity
        self.retry, self.guard = retry, guard
        self.compact_fraction, self.compact_min = compact_fraction, compact_min
        self._group: Any = None
        self._forget()
        # zarr imported now, when the study opens, not inside its first results write: its
        # import (about 0.1 s of CPU) would stall the event loop in the middle of the run
        importlib.import_module("zarr")
        #: trials the last write compared with what it had written (the others: unchanged)
        self.visited = 0

    def _forget(self) -> None:
        """What the writer knows of the group: nothing (it is written anew)."""
        self._written: dict[int, tuple] = {}  # trial id -> what its row showed when written
        self._rows: dict[int, int] = {}  # trial id -> its row (the base's, then the log's new)
        self._points: dict[int, int] = {}  # trial id -> curve entries written
        self._keys: dict[str, str] = {}  # metric -> array name
        self._hyper_keys: dict[str, str] = {}  # hyper-parameter -> array name
        self._based: dict[str, set[str]] = {"metrics": set(), "hyperparameters": set()}
        self._base_rows = 0  # committed rows of the base arrays
        self._steps = 0  # columns of the curves
        self._entries = 0  # committed entries of the change log
        self._logged = 0  # rows and points the committed log holds
        self._based_points = 0  # points applied to the base curves
        self._cleared: _Points = {}  # stored points the trials lack: written NaN next
        self._unwritten: set[int] = set()  # trials whose stored rows differ: written next
        #: the group's arrays opened (or made) so far, by name: opening one reads and parses
        #: its metadata, which every write and compaction did again for each array it touched
        self._arrays: dict[str, Any] = {}

    def __repr__(self) -> str:  # storage options may hold credentials: never show them
        return f"ResultsWriter({self.url!r})"

    @property
    def logged(self) -> int:
        """Rows and points in the group's committed change log (0: the base is the table)."""
        return self._logged

    def write(self, trials: Mapping[int, Trial], changed: Collection[int] | None = None) -> bool:
        """Bring the group up to date with `trials`, of which only those of `changed` (ids)
        may have changed since the last write (None: any); False if nothing had changed."""
        if self.retry is None:
            return self._attempt(trials, changed)
        return self.retry.call(lambda: self._attempt(trials, changed), f"writing {self.url}")

    def compact(self) -> bool:
        """Apply the change log to the base arrays and empty it (the study closes: the group
        reads as a plain table again); False if there was nothing to apply."""
        if self._group is None or not self._entries:
            return False
        if self.retry is None:
            return self._compact_now()
        return self.retry.call(self._compact_now, f"compacting {self.url}")

    def _compact_now(self) -> bool:
        if self.guard is not None:
            self.guard()
        self._compact()
        return True

    def _compaction_due(self) -> bool:
        base = len(self._rows) + self._based_points
        return self._logged >= max(self.compact_min, self.compact_fraction * base)

    def _attempt(self, trials: Mapping[int, Trial], changed: Collection[int] | None) -> bool:
        if self.guard is not None:
            self.guard()
        if self._group is None:  # the session's first write: the group as storage holds it
            self._open(trials)
            changed = None
        written = self._written
        if changed is None:
            candidates: Collection[int] = trials
        else:
            candidates = [i for i in {*changed, *self._unwritten} if i in trials]
        self.visited = len(candidates)
        moved = sorted(i for i in candidates if written.get(i) != _snapshot(trials[i]))
        due = self._compaction_due()  # a compaction that failed
        if not moved and not due:
            return False
        fresh = [i for i in moved if i not in self._rows]
        if len(self._rows) + len(fresh) != len(trials):  # a trial written before is missing
            self._group = open_group(self.url, "w", self._options())
            self._forget()
            moved = fresh = sorted(trials)
        if moved:
            self._log(trials, moved, fresh)
        if self._compaction_due():
            self._compact()
        return bool(moved)

    def _options(self) -> dict[str, Any]:
        if self.retry is None:
            return self.storage_options
        return single_attempt_options(self.url, self.storage_options)

    def _open(self, trials: Mapping[int, Trial]) -> None:
        """Take the group as storage holds it: one of this format and study is kept, and
        what it says of each trial compared with `trials` (the rows and points that differ
        are written next); any other is written anew."""
        group = open_group(self.url, "a", self._options())
        attrs = group.attrs
        same = attrs.get("study") == self.study and attrs.get("identity") == self.identity
        self._forget()
        if attrs.get("format") != FORMAT or not same:
            self._group = open_group(self.url, "w", self._options())
            return
        stored = StoredTable(group)
        ids = [int(i) for i in stored.ids]
        if not all(i in trials for i in ids):  # a trial stored is gone: written anew
            self._group = open_group(self.url, "w", self._options())
            return
        differ = _rows_that_differ(stored, trials, ids, dict(attrs["metrics"]))
        for key in attrs["metrics"].values():
            points, cleared, count = _curve_differences(stored, key, trials, ids)
            differ |= points
            self._based_points += count
            if cleared[0]:
                self._cleared[key] = cleared
        self._rows = {i: row for row, i in enumerate(ids)}
        self._keys, self._hyper_keys = dict(attrs["metrics"]), dict(attrs["hyperparameters"])
        based = attrs["based"]
        self._based = {"metrics": set(based["metrics"]), "hyperparameters": set(based["hyperparameters"])}
        self._base_rows, self._steps = stored.length, stored.steps
        self._entries, self._logged = int(attrs["log"]), stored.changes.size
        for row, i in enumerate(ids):
            if row in differ:
                self._unwritten.add(i)
            else:
                self._written[i] = _snapshot(trials[i])
                self._points[i] = len(trials[i].points)
        self._group = group  # last: a failure above leaves the group to take again

    def _log(self, trials: Mapping[int, Trial], moved: list[int], fresh: list[int]) -> None:
        """Store the rows of the trials `moved` (sorted ids; `fresh`: those new to the
        group) and their new curve points as one entry of the change log, then commit it."""
        group, entries = self._group, self._entries
        metrics = set(self._keys) | {m for i in moved for point in trials[i].points for m in point.names}
        keys = names_added(self._keys, metrics)
        hyper_keys = names_added(
            self._hyper_keys, set(self._hyper_keys) | {n for i in fresh for n in trials[i].config}
        )
        new: dict[str, list] = {}
        rows: dict[str, list] = {}
        for name, (_, value, static) in columns(keys, hyper_keys).items():
            if static and fresh:
                new[name] = [value(trials[i]) for i in fresh]
            if not static or name == "trial_id":
                rows[name] = [value(trials[i]) for i in moved]
        points = self._new_points(trials, moved, keys)
        steps = max(
            self._steps,
            max((trials[i].reached for i in moved), default=0),
            max((point.step for i in moved for point in trials[i].points), default=0),
        )
        text = entry_text(new, rows, points)
        log = self._array("log")
        if log is None:
            log = self._arrays["log"] = create_array(
                group, "log", shape=(_LOG_ROOM,), dtype="text", chunks=(1,)
            )
        elif log.shape[0] <= entries:  # room for more entries: readers read the committed ones
            log.resize((max(entries + 1, 2 * log.shape[0]),))
        log[entries : entries + 1] = text_array([text])
        self._arrays["step"] = put_steps(group, steps, self._array("step"))
        self._commit(keys, hyper_keys, self._base_rows, steps, entries + 1, self._based)
        for i in fresh:
            self._rows[i] = len(self._rows)
        for i in moved:
            self._written[i] = _snapshot(trials[i])
            self._points[i] = len(trials[i].points)
        self._cleared, self._unwritten = {}, set()
        self._entries, self._steps, self._keys, self._hyper_keys = entries + 1, steps, keys, hyper_keys
        self._logged += len(moved) + sum(len(p[0]) for p in points.values())

    def _new_points(self, trials: Mapping[int, Trial], moved: list[int], keys: Mapping[str, str]) -> _Points:
        """The curve points of the trials `moved` not written yet (and the stored points the
        trials lack, as NaN), per metric array name."""
        found: dict[str, tuple[list[int], list[int], list[float]]] = {}
        written = self._points
        for i in moved:  # one pass over the new points (a point: step, names, *values)
            for point in trials[i].points[written.get(i, 0) :]:
                step = point[0] - 1
                for metric, value in zip(point[1], point[2:]):
                    if value is not None:
                        ids, steps, values = found.get(metric) or found.setdefault(metric, ([], [], []))
                        ids.append(i)
                        steps.append(step)
                        values.append(float(value))
        points: _Points = {}
        for metric, key in keys.items():  # the stored points the trials lack first
            cleared, new = self._cleared.get(key, ([], [], [])), found.get(metric, ([], [], []))
            if cleared[0] or new[0]:
                points[key] = (cleared[0] + new[0], cleared[1] + new[1], cleared[2] + new[2])
        return points

    def _commit(
        self,
        keys: Mapping[str, str],
        hyper_keys: Mapping[str, str],
        rows: int,
        steps: int,
        entries: int,
        based: Mapping[str, set[str]],
    ) -> None:
        """Write the group's attributes: what readers read (one store write, the last; all
        of them at once, since `update` writes once per attribute)."""
        self._group.attrs.put(
            {
                "format": FORMAT,
                "study": self.study,
                "identity": self.identity,
                "metrics": dict(keys),
                "hyperparameters": dict(hyper_keys),
                "rows": rows,
                "steps": steps,
                "based": {name: sorted(names) for name, names in based.items()},
                "log": entries,
            }
        )

    def _compact(self) -> None:
        """Apply the committed change log to the base arrays (the last entry of a trial or
        curve cell wins), then commit it empty. Until that commit readers still apply the
        log, over base cells old or new: either reads the same."""
        base = self._base_rows
        changes = LogChanges(self._array("log")[: self._entries])
        total = base + len(changes.new_ids)
        rows = np.fromiter((self._rows[int(i)] for i in changes.ids), dtype=np.int64, count=len(changes.ids))
        order = np.argsort(rows, kind="stable")
        based = self._based
        for name, (dtype, _, static) in columns(self._keys, self._hyper_keys).items():
            array = self._base_array(name, dtype, (total,), (CHUNK_ROWS,), base)
            if static:
                if total > base:
                    array[base:total] = changes.new_cells(name)
            elif len(rows):
                array.set_orthogonal_selection((rows[order],), changes.cells(name)[order])
        for key in self._keys.values():
            curve = self._base_array(
                f"curve/{key}", "float64", (total, self._steps), (CHUNK_TRIALS, CHUNK_STEPS), 0
            )
            if key in changes.points:
                ids, steps, values = changes.points[key]
                at = np.fromiter((self._rows[int(i)] for i in ids), dtype=np.int64, count=len(ids))
                curve.set_coordinate_selection((at, steps), values)
                self._based_points += len(values)
        based = {"metrics": set(self._keys.values()), "hyperparameters": set(self._hyper_keys.values())}
        self._commit(self._keys, self._hyper_keys, total, self._steps, 0, based)
        self._based, self._base_rows, self._entries, self._logged = based, total, 0, 0

    def _array(self, name: str) -> Any:
        """The group's array `name` as opened before, else opened now (None if it has none)."""
        array = self._arrays.get(name)
        if array is None and name in self._group:
            array = self._arrays[name] = self._group[name]
        return array

    def _base_array(self, name: str, dtype: str, shape: tuple[int, ...], chunks: tuple[int, ...], base: int):
        """Base array `name` with `shape`: the committed one grown, or one made anew (not
        committed: what a failed compaction left is replaced) with the cells of the `base`
        rows written before it (which lacked it) missing."""
        parts = name.split("/")
        if parts[0] in ("final", "curve", "hyper"):
            committed = parts[1] in self._based["hyperparameters" if parts[0] == "hyper" else "metrics"]
        else:
            committed = self._base_rows > 0
        if committed:
            array = self._array(name)
            if array.shape != shape:
                array.resize(shape)
            return array
        missing = missing_cell(name) if parts[0] != "curve" else np.nan
        fill = {"fill_value": missing} if dtype in ("float64", "bool") else {}
        array = self._arrays[name] = create_array(
            self._group, name, shape=shape, dtype=dtype, chunks=chunks, overwrite=True, **fill
        )
        if base and dtype == "text":
            array[:base] = cells_array(name, [missing] * base)
        return array


def _snapshot(trial: Trial) -> tuple:
    return (trial.status, trial.steps, trial.reported, len(trial.points), trial.error)


def _rows_that_differ(
    stored: StoredTable, trials: Mapping[int, Trial], ids: list[int], keys: Mapping[str, str]
) -> set[int]:
    """The rows whose changing cells (status, steps, error, final metrics) differ from those
    of their trials now; a hyper-parameter's last value follows the steps, its other cells
    and the config the trial's (a stored study's trial ids keep their configs)."""
    status, steps, error = stored.column("status"), stored.column("steps"), stored.column("error")
    finals = {metric: stored.column(f"final/{key}") for metric, key in keys.items()}
    differ = set()
    for row, i in enumerate(ids):
        t = trials[i]
        if str(status[row]) != t.status or int(steps[row]) != t.reached or str(error[row]) != (t.error or ""):
            differ.add(row)
            continue
        metrics = t.metrics or {}
        if not set(metrics) <= finals.keys() or any(
            m not in finals for point in t.points for m in point.names
        ):
            differ.add(row)
            continue
        for metric, values in finals.items():
            have, want = float(values[row]), float(metrics.get(metric, np.nan))
            if have != want and not (np.isnan(have) and np.isnan(want)):
                differ.add(row)
                break
    return differ


def _curve_differences(
    stored: StoredTable, key: str, trials: Mapping[int, Trial], ids: list[int]
) -> tuple[set[int], tuple[list[int], list[int], list[float]], int]:
    """The rows whose points of curve `key` differ from their trials' (a point missing,
    another value, a point the trial lacks), the stored points the trials lack (to be
    written NaN) and the count of stored points."""
    metric = next(m for m, k in stored.group.attrs["metrics"].items() if k == key)
    curve = stored.curve(key)
    rows, steps, values = [], [], []
    for row, i in enumerate(ids):
        for point in trials[i].points:
            value = point.get(metric)
            if value is not None:
                rows.append(row)
                steps.append(point.step - 1)
                values.append(float(value))
    at, columns_at, want = np.array(rows, dtype=np.int64), np.array(steps, dtype=np.int64), np.array(values)
    inside = columns_at < curve.shape[1]
    have = np.full(len(want), np.nan)
    have[inside] = curve[at[inside], columns_at[inside]]
    wrong = ~((have == want) | (np.isnan(have) & np.isnan(want))) | ~inside
    differ = {int(r) for r in at[wrong]}
    extra = ~np.isnan(curve)
    count = int(np.count_nonzero(extra))
    extra[at[inside], columns_at[inside]] = False
    extra_rows, extra_steps = np.nonzero(extra)
    differ |= {int(r) for r in extra_rows}
    cleared = ([ids[r] for r in extra_rows], [int(s) for s in extra_steps], [np.nan] * len(extra_rows))
    return differ, cleared, count
