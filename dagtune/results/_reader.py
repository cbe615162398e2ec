"""Reading a results group back (`open_results`, `StudyResults`): its trials frame, learning
curves and models, from a group of any format dagtune wrote (1 to 5).

A group of format ``dagtune-results/5`` is its base arrays' committed rows with its
committed change log applied over them (`StoredTable`); one of format 4 the same with the
log of that format (an array per column: `StoredTable4`); an older one is its arrays, whole.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from dagtune.checkpoints import CheckpointStore
from dagtune.config import config_dumps, config_from_json
from dagtune.frames import HyperColumn, TrialRow, frame_of, trials_table
from dagtune.records import is_study_name
from dagtune.results._format import (
    FORMAT,
    FORMAT_3,
    FORMAT_4,
    cells_array,
    is_changing,
    missing_cell,
    open_group,
    results_url,
)
from dagtune.results._log import LogChanges, last_of

if TYPE_CHECKING:
    from dagtune.trainer import Trainer

__all__ = ["StoredTable", "StoredTable4", "StudyResults", "open_results", "stored_table"]


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
        `trainer_kwargs` are given (needed for a class defined in a notebook or an interactive
        session, recorded as ``__main__``, or arguments JSON can't hold; a script's class is
        recorded by the script's module name and imported from it); they must make the study's
        model identity."""
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
        stored = stored_table(self.group)
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
        if attrs.get("format") not in (FORMAT, FORMAT_4, FORMAT_3) or "hyperparameters" not in attrs:
            return trials_table(self.rows())
        return _stored_frame(stored_table(self.group), self.metrics, dict(attrs["hyperparameters"]))

    def curve(self, metric: str):
        """A DataFrame of `metric`: one row per trial, one column per step from 0 (column
        ``s``: the metric right after step ``s``; NaN: not evaluated)."""
        import pandas as pd

        if metric not in self.metrics:
            raise KeyError(f"no metric {metric!r} in these results; there are {sorted(self.metrics)}")
        stored = stored_table(self.group)
        values = stored.curve(self.metrics[metric])
        ids, order = stored.ids, stored.order()
        return pd.DataFrame(
            values[order],
            index=pd.Index(ids[order], name="trial_id", dtype="int64"),
            columns=pd.RangeIndex(stored.steps, name="step"),
        )


def stored_table(group: Any) -> StoredTable | StoredTable4:
    """A group's trials as its readers see them, whatever its format."""
    return StoredTable(group) if group.attrs.get("format") == FORMAT else StoredTable4(group)


class StoredTable:
    """The trials of a group of format `FORMAT`: the committed rows of its base arrays
    (attribute ``rows``; the metrics and hyper-parameters the base holds: ``based``), then the
    trials new in its committed change log (attribute ``log``: entries), with the log's last
    cells of each trial and curve cell applied over them (`dagtune.results._log`)."""

    def __init__(self, group: Any) -> None:
        self.group = group
        attrs = group.attrs
        self.length, self.steps = int(attrs["rows"]), int(attrs["steps"])
        based = attrs["based"]
        self._based = {"metrics": set(based["metrics"]), "hyperparameters": set(based["hyperparameters"])}
        entries = int(attrs["log"])
        self.changes = LogChanges(group["log"][:entries] if entries else [])
        base = group["trial_id"][: self.length] if self.length else np.zeros(0, dtype=np.int64)
        self.ids = np.concatenate([base, self.changes.new_ids])
        self._sorter = np.argsort(self.ids, kind="stable")
        self._at = self.row_of(self.changes.ids)

    def row_of(self, ids: np.ndarray) -> np.ndarray:
        """The rows of trial ids `ids` (each in the table)."""
        return self._sorter[np.searchsorted(self.ids, ids, sorter=self._sorter)]

    def order(self):
        """The rows in trial id order (the writer keeps them so unless trials came late)."""
        ids = self.ids
        return slice(None) if bool(np.all(ids[1:] > ids[:-1])) else self._sorter

    def based(self, name: str) -> bool:
        """Whether the base arrays hold per-trial array or curve `name`."""
        parts = name.split("/")
        if parts[0] in ("final", "curve"):
            return parts[1] in self._based["metrics"]
        if parts[0] == "hyper":
            return parts[1] in self._based["hyperparameters"]
        return self.length > 0

    def column(self, name: str) -> np.ndarray:
        """The per-trial array `name`, row by row."""
        if self.based(name):
            base = self.group[name][: self.length]
        else:
            base = cells_array(name, [missing_cell(name)] * self.length)
        new = self.changes.new_cells(name)
        if new is None:  # a changing cell: the log has it for every new trial
            new = cells_array(name, [missing_cell(name)] * len(self.changes.new_ids))
        values = np.concatenate([base, new])
        if is_changing(name) and len(self._at):
            values[self._at] = self.changes.cells(name)
        return values

    def curve(self, key: str) -> np.ndarray:
        """The learning curve array `key`, ``[row, step]``."""
        values = np.full((len(self.ids), self.steps), np.nan)
        if self.length and self.based(f"curve/{key}"):
            stored = self.group[f"curve/{key}"][: self.length, : self.steps]
            values[: stored.shape[0], : stored.shape[1]] = stored
        if key in self.changes.points:
            ids, steps, points = self.changes.points[key]
            inside = steps < self.steps
            values[self.row_of(ids[inside]), steps[inside]] = points[inside]
        return values


#: arrays that change with a trial's progress: the ones the change log of format 4 holds
_CHANGING_4 = ("status", "steps", "error")


class StoredTable4:
    """The trials of a group of format ``dagtune-results/4``: the committed rows of the base
    arrays, the committed change logs (an array per column) applied over them in order (the
    last entry of a trial or a curve cell wins). A group of an earlier format is its arrays,
    whole."""

    def __init__(self, group: Any) -> None:
        self.group = group
        attrs = group.attrs
        if attrs.get("format") == FORMAT_4:
            self.length, self.steps = int(attrs["rows"]), int(attrs["steps"])
            self.logged, self.points = int(attrs["log"]["rows"]), dict(attrs["log"]["points"])
        else:
            self.length, self.steps = group["trial_id"].shape[0], group["step"].shape[0]
            self.logged, self.points = 0, {}
        self.ids = group["trial_id"][: self.length]
        self._sorter = np.argsort(self.ids, kind="stable")
        if self.logged:
            logged = group["log/trial_id"][: self.logged]
            self._last = last_of(logged)
            self._at = self.row_of(logged[self._last])

    def row_of(self, ids: np.ndarray) -> np.ndarray:
        """The rows of trial ids `ids` (each in the base)."""
        return self._sorter[np.searchsorted(self.ids, ids, sorter=self._sorter)]

    def order(self):
        """The rows in trial id order (the writer kept them so unless trials came late)."""
        ids = self.ids
        return slice(None) if bool(np.all(ids[1:] > ids[:-1])) else self._sorter

    def column(self, name: str) -> np.ndarray:
        """The per-trial array `name`, row by row."""
        values = self.group[name][: self.length]
        if self.logged and (name in _CHANGING_4 or is_changing(name)):
            values[self._at] = self.group[f"log/{name}"][: self.logged][self._last]
        return values

    def curve(self, key: str) -> np.ndarray:
        """The learning curve array `key`, ``[row, step]``."""
        values = np.full((self.length, self.steps), np.nan)
        stored = self.group[f"curve/{key}"][: self.length, : self.steps]
        values[: stored.shape[0], : stored.shape[1]] = stored
        count = self.points.get(key, 0)
        if count:
            group = self.group
            ids = group[f"log/curve/{key}/trial_id"][:count]
            steps = group[f"log/curve/{key}/step"][:count]
            points = group[f"log/curve/{key}/value"][:count]
            rows = self.row_of(ids).astype(np.int64)
            last = last_of((rows << 32) | steps)
            rows, steps, points = rows[last], steps[last], points[last]
            inside = steps < self.steps
            values[rows[inside], steps[inside]] = points[inside]
        return values


def _stored_frame(stored: StoredTable | StoredTable4, metrics: Mapping[str, str], hypers: Mapping[str, str]):
    """The trials frame of a group (format `FORMAT`, 4 or 3) from its
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
        open_group(results_url(storage, name), "r", storage_options), storage, name, storage_options
    )
