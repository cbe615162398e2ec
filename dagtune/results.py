"""Study results as a zarr group: one row per trial, learning curves as ``[trial, step]``.

The coordinator is the only writer (`ResultsWriter`); anyone can read the group with
zarr, xarray or `open_results` (pandas). The group lives at
``{storage}/studies/{name}/results.zarr`` and holds::

    trial_id  int64 [trial]          status  str [trial]      steps  int64 [trial] (reached)
    config    str [trial] (canonical JSON of the config)      error  str [trial] ("" if none)
    step      int64 [step] = 0, 1, 2, ...
    final/<metric>  float64 [trial]          curve/<metric>  float64 [trial, step] (NaN: not evaluated)
    hyper/<name>/constant  bool [trial]  whether the trial's sequence is constant (true if it lacks it)
    hyper/<name>/first     str [trial]   its value at step 0, as JSON ("null" if it lacks it)
    hyper/<name>/schedule  str [trial]   its short text (`dagtune.frames.readable`; "" if it lacks it)
    hyper/<name>/last      str [trial]   its value at the last step reached, as JSON ("null": none)

A step is one call of ``Trainer.train()`` counted from 0, and ``curve/<metric>[i, s]`` is the
metric of trial ``i`` evaluated right after step ``s`` (after ``s + 1`` steps of training), as
in every curve dagtune shows (`dagtune.frames`). Groups written before that convention
(format ``dagtune-results/1``) numbered the same columns 1, 2, ...: they read the same, and a
study that resumes one rewrites its ``step`` coordinate. The ``hyper/`` cells are what the
trials frame shows of each hyper-parameter, worked out by the writer (the last value again
as the trial's steps change) so that reading a frame parses no config; groups written
before them (format ``dagtune-results/2``) read the same by parsing each row's config, and
a study that resumes one writes them.

with attributes ``format``, ``study``, ``identity``, ``metrics`` (metric name -> array
name, since a metric name may hold characters an array name can't) and ``hyperparameters``
(hyper-parameter name -> array name). There is one row per trial, in trial id order
(``trial_id`` says which) unless a trial came late (restored after a later one was
written: appended), and readers sort by ``trial_id``.

A write costs the rows that changed, wherever they are in the table (format
``dagtune-results/4``): new trials are appended to the arrays above (the base), and the
rows of trials written before that changed go to a change log, appended::

    log/trial_id, log/status, log/steps, log/error, log/final/<metric>, log/hyper/<name>/last
                                  [entry]  the changing cells of a row, as of that write
    log/curve/<metric>/trial_id, log/curve/<metric>/step, log/curve/<metric>/value
                                  [point]  the curves' new points (step counted from 0)

The attributes ``rows`` (base rows), ``steps`` (curve columns) and ``log`` (``rows``: log
entries, ``points``: metric array name -> points logged) say how much of each array counts,
and are written last, in one store write: that commits the write. Readers take the base's
rows and apply the log in order (the last entry of a trial, or of a curve cell, wins).
Once the log reaches a quarter of the table, and when the study closes, the writer applies
it to the base and empties it, so after a study the base arrays are the whole table again.
Groups written before the log (``dagtune-results/3``) are their arrays, whole, and read
the same. Works with zarr 3 (Python >= 3.11) and zarr 2.18 (Python 3.10): `_create` hides
their two ways of making an array and of storing variable-length text.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from dagtune.checkpoints import CheckpointStore
from dagtune.config import config_dumps, config_from_json
from dagtune.frames import (
    HyperColumn,
    TrialRow,
    frame_of,
    is_constant,
    last_value,
    readable,
    trials_table,
    value_at,
)
from dagtune.records import Trial, is_study_name
from dagtune.storage_retry import StorageRetry, single_attempt_options

if TYPE_CHECKING:
    from dagtune.trainer import Trainer

__all__ = ["ResultsWriter", "StudyResults", "open_results", "results_url"]

FORMAT = "dagtune-results/4"
_FORMAT_3 = "dagtune-results/3"  # no change log: its arrays whole
_COMPACT_FRACTION = 0.25  # the change logs applied to the base once they reach this part of it
_COMPACT_MIN = 4096  # ... and at least this many entries
_CHUNK_LOG = 4096  # entries of a points log array written together
_CHUNK_TRIALS, _CHUNK_STEPS = 64, 256
_CHUNK_VALUES = 65536
_CHUNK_ROWS = 1024  # rows of a per-trial array written together
_STEP_BLOCK = 1 << 16  # step coordinates written at once
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def _zarr2() -> bool:
    import zarr

    return int(zarr.__version__.split(".")[0]) < 3


def _text(values: list[str]) -> np.ndarray:
    """Variable-length text: numpy's StringDType for zarr 3, objects for zarr 2's VLenUTF8."""
    return np.array(values, dtype=object if _zarr2() else np.dtypes.StringDType())


def _create(group: Any, name: str, *, shape, dtype, chunks, **kwargs):
    if not _zarr2():
        return group.create_array(name, shape=shape, dtype=dtype, chunks=chunks, **kwargs)
    if np.dtype(dtype) == np.dtype(object):
        import numcodecs

        kwargs["object_codec"] = numcodecs.VLenUTF8()
    return group.create_dataset(name, shape=shape, dtype=dtype, chunks=chunks, **kwargs)


def results_url(storage: str, name: str) -> str:
    """Where the results of study `name` live under `storage`."""
    return f"{storage.rstrip('/')}/studies/{name}/results.zarr"


def _open_group(url: str, mode: str, storage_options: Mapping[str, Any] | None):
    import zarr

    options = dict(storage_options or {})
    return zarr.open_group(url, mode=mode, storage_options=options or None)


class ResultsWriter:
    """Writes the trials of one study to its zarr group (the coordinator's job).

    A write costs what changed since the last one, row by row, however the changes are
    spread over the trials: trials new to the group are appended to the base arrays, the
    rows of trials written before that changed are appended to the change log (``log/``,
    their status, steps, error, final metrics and hyper-parameters' last values), and the
    learning curves' new points to the points log; then the group's attributes are written,
    which commits them (readers read the committed counts only). When the logs outgrow a
    fixed fraction of the base (`_COMPACT_FRACTION`, at least `_COMPACT_MIN` entries) or the
    study closes (`compact`), they are applied to the base and emptied: amortized, a constant
    per changed row and point. Finding what changed compares one small tuple per trial.

    Crash safety: what a write stores before its commit is beyond the committed counts
    (readers ignore it, the next write overwrites it), and compacting writes into the base
    only what the committed logs still say (readers apply the logs over the base), so a
    write stopped anywhere leaves the rows before it or after it. The exceptions are the
    session's first write, which writes the group anew (as every write did before the change
    log), and a write after a trial written before went missing, which does too.

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
    ) -> None:
        self.url = url
        self.storage_options = dict(storage_options or {})
        self.study, self.identity = study, identity
        self.retry, self.guard = retry, guard
        self._group: Any = None
        self._forget()
        #: chunks the last write stored (one per array and chunk; a compaction's not counted)
        self.chunks_written = 0

    def _forget(self) -> None:
        """What the writer knows of the group: nothing (it is written anew)."""
        self._written: dict[int, tuple] = {}  # trial id -> what its row showed when written
        self._rows: dict[int, int] = {}  # trial id -> its row in the base arrays
        self._points: dict[int, int] = {}  # trial id -> curve points written
        self._metrics: set[str] = set()  # every metric written
        self._keys: dict[str, str] = {}  # metric -> array name
        self._hypers: set[str] = set()  # every hyper-parameter written
        self._hyper_keys: dict[str, str] = {}  # hyper-parameter -> array name
        self._steps = 0  # columns of the curves
        self._logged = 0  # committed rows of the change log
        self._logged_points: dict[str, int] = {}  # metric's array name -> committed points logged
        self._based_points = 0  # points applied to the base curves

    def __repr__(self) -> str:  # storage options may hold credentials: never show them
        return f"ResultsWriter({self.url!r})"

    def write(self, trials: Mapping[int, Trial]) -> bool:
        """Bring the group up to date with `trials`; False if nothing had changed."""
        if self.retry is None:
            return self._attempt(trials)
        return self.retry.call(lambda: self._attempt(trials), f"writing {self.url}")

    def compact(self) -> bool:
        """Apply the change logs to the base arrays and empty them (the study closes: the
        group reads as a plain table again); False if there was nothing to apply."""
        if self._group is None or not self._log_size():
            return False
        if self.retry is None:
            return self._compact_now()
        return self.retry.call(self._compact_now, f"compacting {self.url}")

    def _compact_now(self) -> bool:
        if self.guard is not None:
            self.guard()
        self._compact()
        return True

    def _log_size(self) -> int:
        return self._logged + sum(self._logged_points.values())

    def _compaction_due(self) -> bool:
        base = len(self._rows) + self._based_points
        return self._log_size() >= max(_COMPACT_MIN, _COMPACT_FRACTION * base)

    def _attempt(self, trials: Mapping[int, Trial]) -> bool:
        if self.guard is not None:
            self.guard()
        written = self._written
        changed = [i for i, t in trials.items() if written.get(i) != _snapshot(t)]
        due = self._group is not None and self._compaction_due()  # a compaction that failed
        if not changed and not due:
            return False
        self.chunks_written = 0
        if self._group is None:  # the session's first write: the group anew
            self._group = _open_group(self.url, "w", self._options())
        fresh = sum(1 for i in changed if i not in self._rows)
        if len(self._rows) + fresh != len(trials):  # a trial written before is missing
            self._group = _open_group(self.url, "w", self._options())
            self._forget()
            changed = list(trials)
        if changed:
            self._append(trials, sorted(changed))
        if self._compaction_due():
            self._compact()
        return bool(changed)

    def _row_of(self, ids: np.ndarray) -> np.ndarray:
        rows = self._rows
        return np.fromiter((rows[int(i)] for i in ids), dtype=np.int64, count=len(ids))

    def _options(self) -> dict[str, Any]:
        if self.retry is None:
            return self.storage_options
        return single_attempt_options(self.url, self.storage_options)

    def _append(self, trials: Mapping[int, Trial], changed: list[int]) -> None:
        """Store the rows of the trials `changed` (sorted ids) and their new curve points,
        then commit them (the group's attributes)."""
        group, base, logged = self._group, len(self._rows), self._logged
        metrics = self._metrics | {m for i in changed for _, ms in trials[i].curve for m in ms}
        keys = _names_added(self._keys, metrics)
        hypers = self._hypers | {n for i in changed for n in trials[i].config}
        hyper_keys = _names_added(self._hyper_keys, hypers)
        self._new_columns(keys, hyper_keys, base, logged)
        fresh = [i for i in changed if i not in self._rows]
        moved = [i for i in changed if i in self._rows]
        for name, (dtype, value, static) in _columns(keys, hyper_keys).items():
            if fresh:
                self.chunks_written += _put(group, name, dtype, base, [value(trials[i]) for i in fresh])
            if moved and not static:
                values = [value(trials[i]) for i in moved]
                self.chunks_written += _put(group, f"log/{name}", dtype, logged, values)
        if moved:
            self.chunks_written += _put(group, "log/trial_id", "int64", logged, moved)
        points = dict(self._logged_points)
        for metric, key in keys.items():
            ids, columns, values = [], [], []
            for i in changed:
                for step, reported in trials[i].curve[self._points.get(i, 0) :]:
                    if metric in reported:
                        ids.append(i)
                        columns.append(step - 1)
                        values.append(reported[metric])
            if values:
                at = points.get(key, 0)
                for name, dtype, cells in (
                    ("trial_id", "int64", ids),
                    ("step", "int64", columns),
                    ("value", "float64", values),
                ):
                    self.chunks_written += _put(
                        group, f"log/curve/{key}/{name}", dtype, at, cells, _CHUNK_LOG
                    )
                points[key] = at + len(values)
        steps = max(
            self._steps,
            max((trials[i].reached for i in changed), default=0),
            max((s for i in changed for s, _ in trials[i].curve), default=0),
        )
        _put_steps(group, steps)
        rows = base + len(fresh)
        self._commit(keys, hyper_keys, rows, steps, logged + len(moved), points)
        for row, i in enumerate(fresh, start=base):
            self._rows[i] = row
        for i in changed:
            self._written[i] = _snapshot(trials[i])
            self._points[i] = len(trials[i].curve)
        self._logged, self._logged_points, self._steps = logged + len(moved), points, steps
        self._metrics, self._keys, self._hypers, self._hyper_keys = metrics, keys, hypers, hyper_keys

    def _new_columns(self, keys: dict[str, str], hyper_keys: dict[str, str], base: int, logged: int) -> None:
        """The arrays of metrics and hyper-parameters new to the group, for the rows and log
        entries written before them (which lacked them): no value, NaN and the cells of a
        trial without the hyper-parameter."""
        group = self._group
        for metric, key in keys.items():
            if metric not in self._keys:
                for name, length in ((f"final/{key}", base), (f"log/final/{key}", logged)):
                    _create(
                        group,
                        name,
                        shape=(length,),
                        dtype="float64",
                        chunks=(_CHUNK_ROWS,),
                        fill_value=np.nan,
                        overwrite=True,
                    )
                _create(
                    group,
                    f"curve/{key}",
                    shape=(base, self._steps),
                    dtype="float64",
                    chunks=(_CHUNK_TRIALS, _CHUNK_STEPS),
                    fill_value=np.nan,
                    overwrite=True,
                )
                for name in ("trial_id", "step", "value"):  # what an earlier attempt left
                    if f"log/curve/{key}/{name}" in group:
                        del group[f"log/curve/{key}/{name}"]
        columns = _columns({}, hyper_keys)
        for hyper, key in hyper_keys.items():
            if hyper in self._hyper_keys:
                continue
            for cell in ("constant", "first", "schedule", "last"):
                name = f"hyper/{key}/{cell}"
                dtype, value, static = columns[name]
                missing = value(Trial(0, {}, 1))
                _create_filled(group, name, dtype, base, missing)
                if not static:
                    _create_filled(group, f"log/{name}", dtype, logged, missing)

    def _commit(
        self,
        keys: dict[str, str],
        hyper_keys: dict[str, str],
        rows: int,
        steps: int,
        logged: int,
        points: dict[str, int],
    ) -> None:
        """Write the group's attributes: what readers read (one store write, the last; all
        of them at once, since `update` writes once per attribute)."""
        self._group.attrs.put(
            {
                "format": FORMAT,
                "study": self.study,
                "identity": self.identity,
                "metrics": keys,
                "hyperparameters": hyper_keys,
                "rows": rows,
                "steps": steps,
                "log": {"rows": logged, "points": points},
            }
        )

    def _compact(self) -> None:
        """Apply the committed change logs to the base arrays (the last entry of a trial or
        curve cell wins), then commit them empty. Until that commit readers still apply the
        logs, over base cells old or new: either reads the same."""
        group, logged = self._group, self._logged
        if logged:
            ids = group["log/trial_id"][:logged]
            last = _last_of(ids)
            rows = self._row_of(ids[last])
            order = np.argsort(rows, kind="stable")
            rows, last = rows[order], last[order]
            for name, (_, _, static) in _columns(self._keys, self._hyper_keys).items():
                if not static:
                    values = group[f"log/{name}"][:logged][last]
                    group[name].set_orthogonal_selection((rows,), values)
        shape = (len(self._rows), self._steps)
        for key, count in self._logged_points.items():
            curve = group[f"curve/{key}"]
            if curve.shape != shape:
                curve.resize(shape)
            if not count:
                continue
            rows, steps, values = _logged_points(group, key, count, self._row_of)
            curve.set_coordinate_selection((rows, steps), values)
            self._based_points += count
        points = dict.fromkeys(self._logged_points, 0)
        self._commit(self._keys, self._hyper_keys, len(self._rows), self._steps, 0, points)
        self._logged, self._logged_points = 0, points


def _columns(
    keys: Mapping[str, str], hyper_keys: Mapping[str, str]
) -> dict[str, tuple[str, Callable[[Trial], Any], bool]]:
    """The per-trial arrays: name -> (dtype, a trial's cell, whether it never changes)."""
    columns: dict[str, tuple[str, Callable[[Trial], Any], bool]] = {
        "trial_id": ("int64", lambda t: t.id, True),
        "config": ("text", lambda t: config_dumps(t.config), True),
        "status": ("text", lambda t: t.status, False),
        "steps": ("int64", lambda t: t.reached, False),
        "error": ("text", lambda t: t.error or "", False),
    }
    for metric, key in keys.items():
        columns[f"final/{key}"] = ("float64", _final(metric), False)
    for hyper, key in hyper_keys.items():  # a config never changes; the last value follows the steps
        columns[f"hyper/{key}/constant"] = ("bool", _hyper(hyper, is_constant, True), True)
        columns[f"hyper/{key}/first"] = ("text", _hyper(hyper, lambda s: _json(value_at(s, 0)), "null"), True)
        columns[f"hyper/{key}/schedule"] = ("text", _hyper(hyper, readable, ""), True)
        columns[f"hyper/{key}/last"] = ("text", _last(hyper), False)
    return columns


def _final(metric: str) -> Callable[[Trial], float]:
    return lambda t: np.nan if not t.metrics else t.metrics.get(metric, np.nan)


def _hyper(name: str, cell: Callable[[Any], Any], missing: Any) -> Callable[[Trial], Any]:
    """A trial's cell of hyper-parameter `name` (`cell` of its sequence; `missing` if its
    config lacks it)."""
    return lambda t: missing if name not in t.config else cell(t.config[name])


def _last(name: str) -> Callable[[Trial], str]:
    """A trial's value of hyper-parameter `name` at the last step it reached, as JSON."""
    return lambda t: "null" if name not in t.config else _json(last_value(t.config[name], t.reached))


def _json(value: Any) -> str:
    """A hyper-parameter's value (a JSON scalar, NaN or None) as JSON text that reads back
    the same value of the same type."""
    return json.dumps(value.item() if isinstance(value, np.generic) else value)


def _snapshot(trial: Trial) -> tuple:
    return (trial.status, trial.steps, trial.reported, len(trial.curve), trial.error)


def _names_added(names: Mapping[str, str], metrics: set[str]) -> dict[str, str]:
    """`names` (metric -> array name) and an array name for each metric of `metrics` it
    lacks: its characters an array name can't hold replaced, never ``.`` or ``..``, at most
    100 characters, and distinct (``_2``, ``_3``, ... after a name taken). A metric keeps its
    name once given: the arrays written under it stay."""
    names = dict(names)
    taken = set(names.values())
    for metric in sorted(metrics - names.keys()):
        base = _UNSAFE.sub("_", metric)[:100]
        if base.strip(".") == "":
            base = f"metric{base}"
        name, n = base, 1
        while name in taken:
            n += 1
            name = f"{base}_{n}"
        taken.add(name)
        names[metric] = name
    return names


def _put_steps(group: Any, steps: int) -> None:
    """The ``step`` coordinate 0 .. `steps` - 1, writing only what it lacks, a block at a
    time (its length follows the steps trained, never the steps a trial asked for)."""
    if "step" in group:
        array = group["step"]
        have = array.shape[0]
        if have != steps:
            array.resize((steps,))
    else:
        array = _create(group, "step", shape=(steps,), dtype="int64", chunks=(_CHUNK_VALUES,))
        have = 0
    for begin in range(have, steps, _STEP_BLOCK):
        end = min(begin + _STEP_BLOCK, steps)
        array[begin:end] = np.arange(begin, end, dtype=np.int64)


def _put(group: Any, name: str, dtype: str, at: int, values: list, chunk: int = _CHUNK_ROWS) -> int:
    """Store `values` at rows `at` on of the 1-d array `name` (created, or resized to end
    with them: what a failed write left beyond is dropped); returns the chunks written."""
    kind = _text([]).dtype if dtype == "text" else np.dtype(dtype)
    end = at + len(values)
    array = group.get(name)
    if array is None:
        array = _create(group, name, shape=(end,), dtype=kind, chunks=(chunk,))
    elif array.shape != (end,):
        array.resize((end,))
    array[at:end] = _text(values) if dtype == "text" else np.array(values, dtype=kind)
    size = array.chunks[0]
    return (end - 1) // size - at // size + 1


def _create_filled(group: Any, name: str, dtype: str, length: int, value: Any) -> None:
    """The 1-d array `name` made anew, `length` cells of `value`."""
    kind = _text([]).dtype if dtype == "text" else np.dtype(dtype)
    array = _create(group, name, shape=(length,), dtype=kind, chunks=(_CHUNK_ROWS,), overwrite=True)
    if length:
        array[:] = _text([value] * length) if dtype == "text" else np.full(length, value, dtype=kind)


def _last_of(ids: np.ndarray) -> np.ndarray:
    """Where each distinct value of `ids` occurs last, in the order of the values."""
    _, first = np.unique(ids[::-1], return_index=True)
    return len(ids) - 1 - first


def _logged_points(group: Any, key: str, count: int, rows: np.ndarray) -> tuple[np.ndarray, ...]:
    """The first `count` logged points of metric array `key` as (rows, steps, values), the
    last one logged of each cell only; `rows` maps each logged trial id to its row (called
    with the ids)."""
    ids = group[f"log/curve/{key}/trial_id"][:count]
    steps = group[f"log/curve/{key}/step"][:count]
    values = group[f"log/curve/{key}/value"][:count]
    at = rows(ids).astype(np.int64)
    last = _last_of((at << 32) | steps)
    return at[last], steps[last], values[last]


# --------------------------------------------------------------------------- reading


class StudyResults:
    """A study's results read back: `trials` (one row per trial) and `curve(metric)`, in the
    schema `Result` has too (`dagtune.frames`), and each trial's model (`load_trainer`,
    `state_dict`) from the study's storage."""

    def __init__(
        self,
        group: Any,
        storage: str | None = None,
        name: str | None = None,
        storage_options: Mapping[str, Any] | None = None,
    ):
        self.group = group
        self.metrics: dict[str, str] = dict(group.attrs.get("metrics", {}))
        self.storage, self.name = storage, name
        self._storage_options = dict(storage_options or {})  # may hold credentials: never shown

    def __repr__(self) -> str:
        return f"<StudyResults {self.name!r} in {self.storage!r}>"

    def _model(self, trial_id: int, trainer: Any, trainer_kwargs: Mapping[str, Any] | None):
        if self.storage is None or self.name is None:
            raise ValueError("these results were not opened with dt.open_results: no storage to load from")
        from dagtune.restore import stored_model  # loads torch and the worker's runner: reading needs neither

        store = CheckpointStore(self.storage, self._storage_options)
        return stored_model(store, self.name, trial_id, trainer=trainer, trainer_kwargs=trainer_kwargs)

    def load_trainer(
        self,
        trial_id: int,
        *,
        trainer: type[Trainer] | None = None,
        trainer_kwargs: Mapping[str, Any] | None = None,
        rng: bool = True,
    ) -> Trainer:
        """Trial `trial_id`'s trainer, built here and restored at its last step, as
        `dagtune.TrialResult.load_trainer` (checkpoint, else rebuilt by training here:
        `dagtune.restore`). The trainer class is the one the study recorded (imported by its
        ``module.qualname``) and its arguments the recorded ones, unless `trainer` and
        `trainer_kwargs` are given (needed for a class defined in the script that ran the
        study, or arguments JSON can't hold); they must make the study's model identity."""
        restorer, path, _ = self._model(trial_id, trainer, trainer_kwargs)
        return restorer.trainer(path, rng=rng, what=f"trial {trial_id} of study {self.name!r}")

    def state_dict(
        self,
        trial_id: int,
        *,
        trainer: type[Trainer] | None = None,
        trainer_kwargs: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Trial `trial_id`'s trainer ``state_dict()`` at its last step: read from its
        checkpoint (no trainer class needed), else rebuilt as `load_trainer` does."""
        restorer, path, _ = self._model(trial_id, trainer, trainer_kwargs)
        return restorer.state(path, what=f"trial {trial_id} of study {self.name!r}")["trainer"]

    def rows(self) -> list[TrialRow]:
        """Each trial as the frames show it (config parsed back from its JSON)."""
        stored = _Stored(self.group)
        finals = {metric: stored.column(f"final/{key}") for metric, key in self.metrics.items()}
        rows = []
        for i, (trial_id, status, steps, text, error) in enumerate(
            zip(
                stored.ids,
                stored.column("status"),
                stored.column("steps"),
                stored.column("config"),
                stored.column("error"),
            )
        ):
            metrics = {m: float(v[i]) for m, v in finals.items() if not np.isnan(v[i])}
            text = str(text)
            config = config_from_json(json.loads(text)) if text else {}
            rows.append(
                TrialRow(int(trial_id), str(status), int(steps), metrics, config, str(error), text or None)
            )
        return rows

    @property
    def trials(self):
        """A DataFrame indexed by trial id: status, steps, final metrics, one column per
        hyper-parameter (a constant's value; a schedule's text, ``NAME/first`` and
        ``NAME/last``), error and config (canonical JSON); `dagtune.frames` says exactly.

        Built from the group's columns, hyper-parameters from their cells the writer stored;
        a group written before those (format ``dagtune-results/2`` or older) parses each
        row's config instead (`rows`), to the same frame."""
        attrs = self.group.attrs
        if attrs.get("format") not in (FORMAT, _FORMAT_3) or "hyperparameters" not in attrs:
            return trials_table(self.rows())
        return _stored_frame(_Stored(self.group), self.metrics, dict(attrs["hyperparameters"]))

    def curve(self, metric: str):
        """A DataFrame of `metric`: one row per trial, one column per step from 0 (column
        ``s``: the metric right after step ``s``; NaN: not evaluated)."""
        import pandas as pd

        if metric not in self.metrics:
            raise KeyError(f"no metric {metric!r} in these results; there are {sorted(self.metrics)}")
        stored = _Stored(self.group)
        values = stored.curve(self.metrics[metric])
        ids, order = stored.ids, stored.order()
        return pd.DataFrame(
            values[order],
            index=pd.Index(ids[order], name="trial_id", dtype="int64"),
            columns=pd.RangeIndex(stored.steps, name="step"),
        )


#: arrays that change with a trial's progress: the ones the change log holds
_CHANGING = ("status", "steps", "error")


def _changes(name: str) -> bool:
    return (
        name in _CHANGING
        or name.startswith("final/")
        or (name.startswith("hyper/") and name.endswith("/last"))
    )


class _Stored:
    """A group's trials as its readers see them: the committed rows of the base arrays, the
    committed change logs applied over them in order (the last entry of a trial or a curve
    cell wins; format `FORMAT`). A group of an earlier format is its arrays, whole."""

    def __init__(self, group: Any) -> None:
        self.group = group
        attrs = group.attrs
        if attrs.get("format") == FORMAT:
            self.length, self.steps = int(attrs["rows"]), int(attrs["steps"])
            self.logged, self.points = int(attrs["log"]["rows"]), dict(attrs["log"]["points"])
        else:
            self.length, self.steps = group["trial_id"].shape[0], group["step"].shape[0]
            self.logged, self.points = 0, {}
        self.ids = group["trial_id"][: self.length]
        self._sorter = np.argsort(self.ids, kind="stable")
        if self.logged:
            logged = group["log/trial_id"][: self.logged]
            self._last = _last_of(logged)
            self._at = self.row_of(logged[self._last])

    def row_of(self, ids: np.ndarray) -> np.ndarray:
        """The rows of trial ids `ids` (each in the base)."""
        return self._sorter[np.searchsorted(self.ids, ids, sorter=self._sorter)]

    def order(self):
        """The rows in trial id order (the writer keeps them so unless trials came late)."""
        ids = self.ids
        return slice(None) if bool(np.all(ids[1:] > ids[:-1])) else self._sorter

    def column(self, name: str) -> np.ndarray:
        """The per-trial array `name`, row by row."""
        values = self.group[name][: self.length]
        if self.logged and _changes(name):
            values[self._at] = self.group[f"log/{name}"][: self.logged][self._last]
        return values

    def curve(self, key: str) -> np.ndarray:
        """The learning curve array `key`, ``[row, step]``."""
        values = np.full((self.length, self.steps), np.nan)
        stored = self.group[f"curve/{key}"][: self.length, : self.steps]
        values[: stored.shape[0], : stored.shape[1]] = stored
        count = self.points.get(key, 0)
        if count:
            rows, steps, points = _logged_points(self.group, key, count, self.row_of)
            inside = steps < self.steps
            values[rows[inside], steps[inside]] = points[inside]
        return values


def _stored_frame(stored: _Stored, metrics: Mapping[str, str], hypers: Mapping[str, str]):
    """The trials frame of a group (format `FORMAT` or ``dagtune-results/3``) from its
    columns, without a config parsed: what `trials_table` makes of its rows
    (`StudyResults.rows`), cell for cell."""
    order = stored.order()

    def column(name: str) -> list:
        return stored.column(name)[order].tolist()

    finals = {}
    for metric in sorted(metrics):
        values = stored.column(f"final/{metrics[metric]}")[order]
        if not np.isnan(values).all():  # a metric no trial has a value of has no column
            finals[metric] = values.tolist()
    columns = {}
    for hyper in sorted(hypers):
        key = hypers[hyper]
        schedule = column(f"hyper/{key}/schedule")  # "": the trial's config lacks it
        if not any(schedule):
            continue
        first = _json_cells(column(f"hyper/{key}/first"))
        if bool(np.all(stored.column(f"hyper/{key}/constant"))):
            columns[hyper] = HyperColumn(True, first, [], [])
        else:
            last = _json_cells(column(f"hyper/{key}/last"))
            columns[hyper] = HyperColumn(False, first, [text or None for text in schedule], last)
    empty = config_dumps({})
    return frame_of(
        stored.ids[order].tolist(),
        [str(status) for status in column("status")],
        column("steps"),
        finals,
        columns,
        [str(error) for error in column("error")],
        [str(text) or empty for text in column("config")],
    )


def _json_cells(texts: list[str]) -> list:
    """JSON texts decoded, all in one call of the parser."""
    return json.loads(f"[{','.join(texts)}]")


def open_results(storage: str, name: str, storage_options: Mapping[str, Any] | None = None) -> StudyResults:
    """Read the results of study `name` under `storage` (a directory or fsspec URL); a name
    no study can have (one that would leave the storage root, like ``../x``) is a ValueError."""
    import os

    if not is_study_name(name):
        raise ValueError(f"{name!r} is not a study name (1-128 letters, digits, '.', '_' or '-')")
    storage = os.fspath(storage)
    return StudyResults(
        _open_group(results_url(storage, name), "r", storage_options), storage, name, storage_options
    )
