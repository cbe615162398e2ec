"""The one table schema of a study's trials and learning curves.

`Result.trials` (a run just ended) and ``open_results(...).trials`` (a study read back from
storage) build their frames here, from the same rows, so they have the same columns:

- the index ``trial_id``;
- ``status``, ``steps`` (the steps the trial reached: its steps if completed, else the
  steps it received metrics for), then one float column per metric with the trial's final
  value (NaN where it reported none);
- a **constant** hyper-parameter (its value never changes in any trial, however it was
  written: ``0.1``, ``Exponential(0.1, 1.0)``) is one column ``NAME`` of its plain values
  (numbers, strings or bools); a **schedule** (its value changes in some trial) is three:
  ``NAME/schedule``, its short text (``"MultiStep(0.1, [30, 45], 0.1)"``, ``"128→256@40"``,
  ``"0.1"`` in a trial where it is constant), ``NAME/first``, its value at step 0, and
  ``NAME/last``, its value at the last step the trial trained (``steps - 1``; missing for a
  trial that trained none). Loggers use the same names (`dagtune.loggers.hparams_of`);
- ``error`` (the traceback of a failed trial, else ``""``) and ``config`` (the exact config
  as canonical JSON: ``dagtune.config.config_from_json(json.loads(text))`` gives it back).

A hyper-parameter whose name is taken by a metric or a column above is prefixed
``config/``; a metric named like a fixed column, ``metric/``.

Learning curves (`curves_table`) are indexed by trial id, with one column per **step**, as
the README defines it: step ``s`` is the ``s``-th call of ``Trainer.train()`` counted from
0, and the value in column ``s`` is the metric evaluated right after it (after ``s + 1``
steps of training); NaN where the metric was not evaluated. A trial of ``n`` steps has
columns ``0 .. n - 1``, the last one its final metrics.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from dagtune.config import Config, config_dumps
from dagtune.records import Trial
from dagtune.sequences import Constant, Sequence, Steps

__all__ = [
    "FIXED_COLUMNS",
    "HyperColumn",
    "TrialRow",
    "curves_table",
    "frame_of",
    "is_constant",
    "last_value",
    "readable",
    "row_of",
    "trials_table",
    "value_at",
]

#: The columns every trials frame has besides metrics and hyper-parameters.
FIXED_COLUMNS = ("status", "steps", "error", "config")


@dataclass(frozen=True)
class TrialRow:
    """What a trials frame shows of one trial."""

    id: int
    status: str
    steps: int  # reached
    metrics: Mapping[str, float]
    config: Config
    error: str = ""
    config_json: str | None = None  # the config's canonical JSON when it is at hand (read from storage)


def row_of(trial: Trial) -> TrialRow:
    """The row of a `Trial` record."""
    return TrialRow(
        trial.id, trial.status, trial.reached, dict(trial.metrics or {}), trial.config, trial.error or ""
    )


def readable(sequence: Any) -> str:
    """A short form of a sequence for tables and labels: ``0.9``, ``64→128@18``, else repr."""
    if isinstance(sequence, Constant):
        return f"{sequence.value:g}" if isinstance(sequence.value, float) else repr(sequence.value)
    if isinstance(sequence, Steps):
        values = "→".join(f"{v:g}" if isinstance(v, float) else str(v) for v in sequence.values)
        return f"{values}@{','.join(str(m) for m in sequence.milestones)}"
    return repr(sequence)


def is_constant(sequence: Sequence) -> bool:
    """Whether `sequence` takes the same value at every step (compared by canonical form, so
    ``Exponential(0.1, 1.0)`` is constant and a schedule that only changes late is not)."""
    if type(sequence) is Constant:  # most hyper-parameters: no second sequence built to compare
        return True
    try:
        return sequence == Constant(sequence(0))
    except ValueError:  # no finite value at step 0
        return False


def value_at(sequence: Sequence, step: int) -> Any:
    """The value of `sequence` at `step` as frames show it: NaN where it is not finite."""
    try:
        return sequence(step)
    except ValueError:  # not finite there
        return math.nan


def last_value(sequence: Sequence, steps: int) -> Any:
    """The value of `sequence` at the last of `steps` steps trained (None if none)."""
    return None if steps <= 0 else value_at(sequence, steps - 1)


@dataclass(frozen=True)
class HyperColumn:
    """One hyper-parameter over a frame's rows (the trials frame's cells, None where a
    trial lacks it): `constant` whether it is constant in every trial that has it (one
    column of `first`), else its `schedule` texts and its values at the `first` and `last`
    step trained (`schedule` and `last` unused when constant)."""

    constant: bool
    first: list
    schedule: list
    last: list


def trials_table(rows: Iterable[TrialRow]):
    """The trials frame of `rows` (the module docstring gives its columns)."""
    rows = sorted(rows, key=lambda r: r.id)
    hypers: dict[str, HyperColumn] = {}
    for name in sorted({n for r in rows for n in r.config}):
        sequences = [r.config.get(name) for r in rows]
        constant = all(s is None or is_constant(s) for s in sequences)
        first = [None if s is None else value_at(s, 0) for s in sequences]
        if constant:  # one column: no texts or last values to work out
            hypers[name] = HyperColumn(True, first, [], [])
            continue
        schedule = [None if s is None else readable(s) for s in sequences]
        last = [None if s is None else last_value(s, r.steps) for s, r in zip(sequences, rows)]
        hypers[name] = HyperColumn(False, first, schedule, last)
    return frame_of(
        [r.id for r in rows],
        [r.status for r in rows],
        [r.steps for r in rows],
        {
            m: [float(r.metrics.get(m, math.nan)) for r in rows]
            for m in sorted({m for r in rows for m in r.metrics})
        },
        hypers,
        [r.error or "" for r in rows],
        [config_dumps(r.config) if r.config_json is None else r.config_json for r in rows],
    )


def frame_of(
    ids: list[int],
    status: list[str],
    steps: list[int],
    metrics: Mapping[str, list[float]],
    hypers: Mapping[str, HyperColumn],
    error: list[str],
    config: list[str],
):
    """The trials frame of columns given whole, one cell per row in trial id order
    (`metrics` and `hypers` by name, in the order of their columns): what `trials_table`
    builds from rows, and a stored study's results from their stored columns."""
    import pandas as pd  # loaded only for a table

    taken: set[str] = set(FIXED_COLUMNS)

    def claim(name: str, prefix: str) -> str:
        column = name if name not in taken else f"{prefix}/{name}"
        while column in taken:
            column = f"{prefix}/{column}"
        taken.add(column)
        return column

    columns: dict[str, list] = {"status": status, "steps": steps}
    for metric, values in metrics.items():
        columns[claim(metric, "metric")] = values
    for name, hyper in hypers.items():
        column = name if name not in taken else f"config/{name}"
        if hyper.constant:
            columns[claim(column, "config")] = hyper.first
            continue
        columns[claim(f"{column}/schedule", "config")] = hyper.schedule
        columns[claim(f"{column}/first", "config")] = hyper.first
        columns[claim(f"{column}/last", "config")] = hyper.last
    columns["error"] = error
    columns["config"] = config
    return pd.DataFrame(columns, index=pd.Index(ids, name="trial_id", dtype="int64"))


def curves_table(curves: Mapping[int, Iterable[tuple[int, Mapping[str, float]]]], metric: str, ids=None):
    """The learning curves of `metric`: one row per trial id (`ids`, default the curves'),
    one column per step from 0 (the module docstring says what a step is). `curves` maps a
    trial id to its ``(steps trained, metrics)`` points, as a `Trial` records them: the
    point after ``k`` steps of training goes in column ``k - 1``."""
    import numpy as np
    import pandas as pd

    ids = sorted(curves) if ids is None else list(ids)
    points = {i: [(k, m[metric]) for k, m in curves.get(i, ()) if metric in m] for i in ids}
    width = max((k for found in points.values() for k, _ in found), default=0)
    values = np.full((len(ids), width), np.nan)
    for row, i in enumerate(ids):
        for k, value in points[i]:
            values[row, k - 1] = value
    return pd.DataFrame(
        values,
        index=pd.Index(ids, name="trial_id", dtype="int64"),
        columns=pd.RangeIndex(width, name="step"),
    )
