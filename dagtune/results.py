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
(hyper-parameter name -> array name). There is one row per
trial, in trial id order (``trial_id`` says which). A write costs what changed: the
per-trial arrays are stored in chunks of 1,024 rows and only the chunks holding a trial that
changed are written again (new trials add rows), and the learning curves get only the points
reported since the last write, so neither time nor memory grows with the trials, the largest
trial id or the steps between points. Works with zarr 3 (Python >= 3.11) and zarr 2.18 (Python 3.10): `_create` hides their
two ways of making an array and of storing variable-length text.
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

FORMAT = "dagtune-results/3"
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

    Each write costs what changed since the last one: the per-trial arrays are chunked by
    `_CHUNK_ROWS` rows and only the chunks holding a changed trial are written (new trials
    add rows: the arrays grow), and the learning curves get only the points reported since.
    Finding what changed compares one small tuple per trial; nothing else walks every trial,
    unless rows moved (a trial id below the last one written, as after restoring) or the
    metrics' array names changed, which rewrite the group once.

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
        self._written: dict[int, tuple] = {}  # trial id -> what its row showed when written
        self._rows: dict[int, int] = {}  # trial id -> its row, as last written
        self._last = -1  # the largest trial id written
        self._metrics: set[str] = set()  # every metric written
        self._keys: dict[str, str] = {}  # metric -> array name, as last written
        self._hypers: set[str] = set()  # every hyper-parameter written
        self._hyper_keys: dict[str, str] = {}  # hyper-parameter -> array name, as last written
        self._steps = 0  # columns of the curves, as last written
        self._points: dict[int, int] = {}  # trial id -> curve points written
        #: chunks of the per-trial arrays the last write stored (one per array and chunk)
        self.chunks_written = 0

    def __repr__(self) -> str:  # storage options may hold credentials: never show them
        return f"ResultsWriter({self.url!r})"

    def write(self, trials: Mapping[int, Trial]) -> bool:
        """Bring the group up to date with `trials`; False if nothing had changed."""
        if self.retry is None:
            return self._attempt(trials)
        return self.retry.call(lambda: self._attempt(trials), f"writing {self.url}")

    def _attempt(self, trials: Mapping[int, Trial]) -> bool:
        if self.guard is not None:
            self.guard()
        written = self._written
        changed = [i for i, t in trials.items() if written.get(i) != _snapshot(t)]
        if not changed:
            return False
        group = self._group
        if group is None:
            options = (
                self.storage_options
                if self.retry is None
                else single_attempt_options(self.url, self.storage_options)
            )
            group = self._group = _open_group(self.url, "a", options)
        changed.sort()
        fresh = [i for i in changed if i not in self._rows]
        gone = len(self._rows) + len(fresh) != len(trials)  # a trial written before is missing
        moved = gone or (bool(fresh) and fresh[0] < self._last)
        metrics = self._metrics | {m for i in changed for _, ms in trials[i].curve for m in ms}
        keys = _array_names(metrics)
        hypers = self._hypers | {n for i in changed for n in trials[i].config}
        hyper_keys = _array_names(hypers)
        renamed = keys != self._keys or hyper_keys != self._hyper_keys
        # an older group: its step coordinate may count from 1, it lacks the hyper-parameters' arrays
        renumber = group.attrs.get("format", FORMAT) != FORMAT
        whole = moved or renamed or renumber or not self._rows
        if whole:  # every row again, in trial id order
            rows = {i: row for row, i in enumerate(sorted(trials))}
            dirty = added = erred = list(range(len(rows)))
            points: dict[int, int] = {}
            kept = 0
        else:
            kept = len(self._rows)  # rows a write stored
            rows = dict(self._rows)  # kept only once written: a failed write is tried again whole
            for i in fresh:
                rows[i] = len(rows)
            dirty = sorted(rows[i] for i in changed)
            # a trial's id and config never change: their rows are written once; its error
            # only when it changes
            added = [rows[i] for i in fresh]
            erred = sorted(rows[i] for i in changed if i not in written or written[i][4] != trials[i].error)
            points = self._points
        order = sorted(rows, key=rows.__getitem__)  # trial ids by row
        steps = max(
            self._steps if not whole else 0,
            max((trials[i].reached for i in (order if whole else changed)), default=0),
            max((s for i in (order if whole else changed) for s, _ in trials[i].curve), default=0),
        )
        group.attrs.update(
            {
                "format": FORMAT,
                "study": self.study,
                "identity": self.identity,
                "metrics": keys,
                "hyperparameters": hyper_keys,
            }
        )
        self.chunks_written = 0
        columns: dict[str, tuple[str, Callable[[Trial], Any], list[int]]] = {
            "trial_id": ("int64", lambda t: t.id, added),
            "status": ("text", lambda t: t.status, dirty),
            "steps": ("int64", lambda t: t.reached, dirty),
            "config": ("text", lambda t: config_dumps(t.config), added),
            "error": ("text", lambda t: t.error or "", erred),
        }
        for metric, key in keys.items():
            columns[f"final/{key}"] = ("float64", _final(metric), dirty)
        for hyper, key in hyper_keys.items():  # a config never changes; the last value follows the steps
            columns[f"hyper/{key}/constant"] = ("bool", _hyper(hyper, is_constant, True), added)
            columns[f"hyper/{key}/first"] = (
                "text",
                _hyper(hyper, lambda s: _json(value_at(s, 0)), "null"),
                added,
            )
            columns[f"hyper/{key}/schedule"] = ("text", _hyper(hyper, readable, ""), added)
            columns[f"hyper/{key}/last"] = ("text", _last(hyper), dirty)
        for name, (dtype, value, rows_of) in columns.items():
            self.chunks_written += _put_rows(group, name, dtype, order, trials, rows_of, value, whole, kept)
        _put_steps(group, steps, rewrite=renumber)
        touched = order if whole else changed
        for metric, key in keys.items():
            rows_at, columns_at, values = [], [], []
            for i in touched:
                trial = trials[i]
                for step, reported in trial.curve[points.get(i, 0) :]:
                    if metric in reported:
                        rows_at.append(rows[i])
                        columns_at.append(step - 1)
                        values.append(reported[metric])
            curve = _curve(group, f"curve/{key}", (len(order), steps), clear=whole)
            if values:
                curve.set_coordinate_selection(
                    (np.array(rows_at, dtype=np.int64), np.array(columns_at, dtype=np.int64)),
                    np.array(values, dtype=np.float64),
                )
        if whole:
            written.clear()
        for i in touched:
            written[i] = _snapshot(trials[i])
            points[i] = len(trials[i].curve)
        self._rows, self._points, self._last = rows, points, max(rows, default=-1)
        self._metrics, self._keys, self._steps = metrics, keys, steps
        self._hypers, self._hyper_keys = hypers, hyper_keys
        return True


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


def _array_names(metrics: set[str]) -> dict[str, str]:
    """An array name for each metric: its characters an array name can't hold replaced,
    never ``.`` or ``..``, at most 100 characters, and distinct (``_2``, ``_3``, ... after a
    name another metric's became first)."""
    names: dict[str, str] = {}
    taken: set[str] = set()
    for metric in sorted(metrics):
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


def _curve(group: Any, name: str, shape: tuple[int, int], *, clear: bool):
    """The float array `name` of `shape` (created, or grown with NaN cells); every cell NaN
    with `clear`."""
    if name not in group:
        return _create(
            group, name, shape=shape, dtype="float64", chunks=(_CHUNK_TRIALS, _CHUNK_STEPS), fill_value=np.nan
        )
    array = group[name]
    if clear:
        array.resize((0, 0))  # drops every chunk: the cells read as NaN again
    grown = shape if clear else tuple(max(a, b) for a, b in zip(array.shape, shape))
    if array.shape != grown:
        array.resize(grown)
    return array


def _put_steps(group: Any, steps: int, *, rewrite: bool = False) -> None:
    """The ``step`` coordinate 0 .. `steps` - 1, writing only what it lacks (all of it with
    `rewrite`), a block at a time (its length follows the steps trained, never the steps a
    trial asked for)."""
    if "step" in group:
        array = group["step"]
        have = array.shape[0]
        if have != steps:
            array.resize((steps,))
        if rewrite:
            have = 0
    else:
        array = _create(group, "step", shape=(steps,), dtype="int64", chunks=(_CHUNK_VALUES,))
        have = 0
    for begin in range(have, steps, _STEP_BLOCK):
        end = min(begin + _STEP_BLOCK, steps)
        array[begin:end] = np.arange(begin, end, dtype=np.int64)


def _put_rows(
    group: Any,
    name: str,
    dtype: str,
    order: list[int],
    trials: Mapping[int, Trial],
    dirty: list[int],
    value: Callable[[Trial], Any],
    whole: bool,
    kept: int,
) -> int:
    """Write the rows `dirty` (sorted row numbers) of the per-trial array `name`, one chunk
    of `_CHUNK_ROWS` rows at a time: each chunk holding a dirty row is written whole, its
    dirty rows and those from `kept` on (the rows no write stored yet) from `order` (the
    trial ids by row), its other rows as stored (so a write works out the cells of the trials
    that changed, not of every trial in their chunks); the array is created, grown or, with
    `whole` or another layout (a group written before chunks were fixed), made anew.
    Returns the chunks written."""
    length = len(order)
    kind = _text([]).dtype if dtype == "text" else np.dtype(dtype)
    array = group.get(name)
    if array is not None and (array.chunks != (_CHUNK_ROWS,) or array.dtype != kind):
        array, whole = None, True
    if array is None or whole:
        array = _create(group, name, shape=(length,), dtype=kind, chunks=(_CHUNK_ROWS,), overwrite=True)
        dirty, kept = list(range(length)), 0
    elif array.shape != (length,):
        array.resize((length,))
    by_chunk: dict[int, list[int]] = {}
    for row in dirty:
        by_chunk.setdefault(row // _CHUNK_ROWS, []).append(row)
    for chunk, rows in sorted(by_chunk.items()):
        begin, end = chunk * _CHUNK_ROWS, min((chunk + 1) * _CHUNK_ROWS, length)
        stored = min(end, kept)
        values = array[begin:stored].tolist() if begin < stored else []
        for row in rows:
            if row < stored:
                values[row - begin] = value(trials[order[row]])
        values.extend(value(trials[i]) for i in order[begin + len(values) : end])
        array[begin:end] = _text(values) if dtype == "text" else np.array(values, dtype=kind)
    return len(by_chunk)


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
        group = self.group
        finals = {metric: group[f"final/{key}"][:] for metric, key in self.metrics.items()}
        rows = []
        for i, (trial_id, status, steps, text, error) in enumerate(
            zip(
                group["trial_id"][:],
                group["status"][:],
                group["steps"][:],
                group["config"][:],
                group["error"][:],
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
        if self.group.attrs.get("format") != FORMAT or "hyperparameters" not in self.group.attrs:
            return trials_table(self.rows())
        return _stored_frame(self.group, self.metrics, dict(self.group.attrs["hyperparameters"]))

    def curve(self, metric: str):
        """A DataFrame of `metric`: one row per trial, one column per step from 0 (column
        ``s``: the metric right after step ``s``; NaN: not evaluated)."""
        import pandas as pd

        if metric not in self.metrics:
            raise KeyError(f"no metric {metric!r} in these results; there are {sorted(self.metrics)}")
        values = self.group[f"curve/{self.metrics[metric]}"][:]
        steps = self.group["step"].shape[0]
        return pd.DataFrame(
            values[:, :steps],
            index=pd.Index(self.group["trial_id"][:], name="trial_id", dtype="int64"),
            columns=pd.RangeIndex(steps, name="step"),
        )


def _stored_frame(group: Any, metrics: Mapping[str, str], hypers: Mapping[str, str]):
    """The trials frame of `group` (format `FORMAT`) from its columns, without a config
    parsed: what `trials_table` makes of its rows (`StudyResults.rows`), cell for cell."""
    ids = group["trial_id"][:]
    # the writer keeps the rows in trial id order: sorted again only if they are not
    order = slice(None) if bool(np.all(ids[1:] > ids[:-1])) else np.argsort(ids, kind="stable")

    def column(name: str) -> list:
        return group[name][:][order].tolist()

    finals = {}
    for metric in sorted(metrics):
        values = group[f"final/{metrics[metric]}"][:][order]
        if not np.isnan(values).all():  # a metric no trial has a value of has no column
            finals[metric] = values.tolist()
    columns = {}
    for hyper in sorted(hypers):
        key = hypers[hyper]
        schedule = column(f"hyper/{key}/schedule")  # "": the trial's config lacks it
        if not any(schedule):
            continue
        first = _json_cells(column(f"hyper/{key}/first"))
        if bool(np.all(group[f"hyper/{key}/constant"][:])):
            columns[hyper] = HyperColumn(True, first, [], [])
        else:
            last = _json_cells(column(f"hyper/{key}/last"))
            columns[hyper] = HyperColumn(False, first, [text or None for text in schedule], last)
    empty = config_dumps({})
    return frame_of(
        ids[order].tolist(),
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
