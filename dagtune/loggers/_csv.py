"""`CSV`: every step of every trial as one row of a CSV file per study."""

from __future__ import annotations

import csv
import os
from collections.abc import Mapping
from typing import Any

from dagtune.loggers._base import Logger, TrialInfo, safe_name

__all__ = ["CSV"]


class CSV(Logger):
    """``{directory}/{study}/progress.csv``: one row per trial and step, read with
    ``pandas.read_csv``. Columns: ``trial_id``, ``step`` (from 0), each hyper-parameter's
    value during that step (a name a metric has too is prefixed ``config/``), then every
    metric (empty where a step did not report it). A metric that first appears later
    widens the file (it is rewritten once with the new column). Rows are flushed at every
    run's end and when the study closes; resuming the study appends only the steps the file
    lacks."""

    def __init__(self, directory: str | os.PathLike):
        self.directory = os.fspath(directory)
        self._files: dict[str, _Progress] = {}

    def __repr__(self) -> str:
        return f"dt.loggers.CSV({self.directory!r})"

    def path(self, study: str) -> str:
        """The CSV file of `study`."""
        return os.path.join(self.directory, safe_name(study), "progress.csv")

    def open(self, study: str, identity: str) -> None:
        self._files[study] = _Progress(self.path(study))

    def start(self, trial: TrialInfo) -> int:
        progress = self._files[trial.study]
        progress.configs[trial.id] = trial
        return progress.last.get(trial.id, -1)

    def log(self, study: str, trial: int, step: int, metrics: Mapping[str, float]) -> None:
        self._files[study].add(trial, step, metrics)

    def flush(self, study: str) -> None:
        self._files[study].flush()

    def close(self, study: str) -> None:
        self._files.pop(study).close()


class _Progress:
    """One study's CSV file: its columns, the last step of each trial in it, an open handle."""

    def __init__(self, path: str):
        self.path = path
        self.configs: dict[int, TrialInfo] = {}
        self.last: dict[int, int] = {}
        self.hp: list[str] = []  # hyper-parameter names, in column order
        self.metrics: list[str] = []
        self._found: list[str] | None = None  # an existing file's columns, until sorted out
        self._file: Any = None
        self._writer: Any = None
        if os.path.exists(path):
            with open(path, newline="") as file:
                reader = csv.reader(file)
                header = next(reader, None)
                if header:
                    self._found = header[2:]
                    for row in reader:
                        if len(row) >= 2 and row[0].isdigit():
                            trial, step = int(row[0]), int(row[1])
                            self.last[trial] = max(self.last.get(trial, -1), step)

    def _sort_out(self, names: list[str]) -> None:
        """An existing file's columns, told apart by the study's hyper-parameter `names`
        (a hyper-parameter a metric shares its name with is the ``config/`` column)."""
        found, self._found = self._found or [], None
        hp = {
            (f"config/{n}" if f"config/{n}" in found else n): n
            for n in names
            if n in found or f"config/{n}" in found
        }
        self.hp = [hp[c] for c in found if c in hp]
        self.metrics = [c for c in found if c not in hp]

    def _header(self) -> list[str]:
        hp = [self._hp_column(n, self.metrics) for n in self.hp]
        return ["trial_id", "step", *hp, *self.metrics]

    def add(self, trial: int, step: int, metrics: Mapping[str, float]) -> None:
        info = self.configs[trial]
        values = info.values(step)
        if self._found is not None:
            self._sort_out(list(values))
        if [n for n in values if n not in self.hp] or [m for m in metrics if m not in self.metrics]:
            before = (list(self.hp), list(self.metrics))
            self.hp += [n for n in values if n not in self.hp]
            self.metrics += sorted(m for m in metrics if m not in self.metrics)
            self._rewrite(*before)
        row: dict[str, Any] = {"trial_id": trial, "step": step}
        header = self._header()
        for name, column in zip(self.hp, header[2:]):
            row[column] = values.get(name, "")
        row.update({m: repr(float(v)) for m, v in metrics.items()})
        self._handle().writerow([row.get(c, "") for c in header])
        self.last[trial] = max(self.last.get(trial, -1), step)

    def _handle(self) -> Any:
        if self._writer is None:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            fresh = not os.path.exists(self.path) or os.path.getsize(self.path) == 0
            self._file = open(self.path, "a", newline="")  # noqa: SIM115 - kept open while logging
            self._writer = csv.writer(self._file)
            if fresh:
                self._writer.writerow(self._header())
        return self._writer

    def _hp_column(self, name: str, metrics: list[str]) -> str:
        return f"config/{name}" if name in metrics else name

    def _rewrite(self, hp: list[str], metrics: list[str]) -> None:
        """Rewrite the file under the wider header; rows written under the columns `hp` and
        `metrics` keep their values."""
        self.close()
        rows: list[dict[str, str]] = []
        if os.path.exists(self.path):
            with open(self.path, newline="") as file:
                rows = list(csv.DictReader(file))
        was = {n: self._hp_column(n, metrics) for n in hp}
        partial = f"{self.path}.partial"
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        with open(partial, "w", newline="") as file:
            writer = csv.writer(file)
            writer.writerow(self._header())
            for row in rows:
                values = [row.get("trial_id", ""), row.get("step", "")]
                values += [row.get(was[n], "") if n in was else "" for n in self.hp]
                values += [row.get(m, "") if m in metrics else "" for m in self.metrics]
                writer.writerow([v or "" for v in values])
        os.replace(partial, self.path)

    def flush(self) -> None:
        if self._file is not None:
            self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
        self._file = self._writer = None
