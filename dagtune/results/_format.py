"""What a results group holds, cell by cell: its format names, its per-trial arrays and how a
trial fills each (`columns`), the array names of metrics and hyper-parameters, and the few
zarr calls that differ between zarr 3 (Python >= 3.11) and zarr 2.18 (Python 3.10)."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from dagtune.config import config_dumps
from dagtune.frames import is_constant, last_value, readable, value_at
from dagtune.records import Trial

__all__ = [
    "CHANGING",
    "CHUNK_ROWS",
    "FORMAT",
    "FORMAT_3",
    "FORMAT_4",
    "Column",
    "cells_array",
    "columns",
    "create_array",
    "dtype_of",
    "is_changing",
    "missing_cell",
    "names_added",
    "open_group",
    "put_steps",
    "results_url",
    "text_array",
]

FORMAT = "dagtune-results/5"  # the change log: one entry of packed rows per write
FORMAT_4 = "dagtune-results/4"  # the change log: one array per column
FORMAT_3 = "dagtune-results/3"  # no change log: its arrays whole
#: rows of a per-trial array in one chunk. Reading a chunk costs zarr a fixed overhead
#: beyond its bytes (two hand-offs to its thread pool, for the read and the decode; more
#: CPU still when a core is free for its threads to contend for the GIL): at 1024 rows the
#: 14 arrays of a 100,000-trial table were 1,372 chunks, 0.44 of the trials frame's 0.82 s
#: of CPU (up to 0.83 of 1.21 with a core free); at 8192 they are 182, 0.21 s (perf/RESULTS.md
#: section 12). A compaction rewrites the chunks it touches whole: about 0.05 s more when a
#: few scattered rows changed at 100,000 trials. Groups written with other chunks read as before.
CHUNK_ROWS = 8192
#: a curve's chunk, [trial, step]: many trials by few steps, since a write's new points are
#: the recent steps of the trials that ran (a band of steps over many trials), and a chunk
#: a write touches is read, changed and written whole. (64 trials by 256 steps made each
#: write of a 2-step grid rewrite 128 KB per 64 trials for 1 KB of points: 10x the CPU.)
#: Groups written with other chunks read and grow as before: zarr keeps each array's own.
CHUNK_TRIALS, CHUNK_STEPS = 1024, 16
_CHUNK_VALUES = 65536
_STEP_BLOCK = 1 << 16  # step coordinates written at once
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")

#: the per-trial arrays that change with a trial's progress (besides ``final/`` and
#: ``hyper/*/last``): the ones a change of a trial written before stores again
CHANGING = ("status", "steps", "error")

#: a per-trial array: its dtype ("text" for variable-length text), a trial's cell, and
#: whether the cell never changes once the trial is written
Column = tuple[str, Callable[[Trial], Any], bool]


def zarr2() -> bool:
    import zarr

    return int(zarr.__version__.split(".")[0]) < 3


def text_array(values: list[str]) -> np.ndarray:
    """Variable-length text: numpy's StringDType for zarr 3, objects for zarr 2's VLenUTF8."""
    return np.array(values, dtype=object if zarr2() else np.dtypes.StringDType())


def create_array(group: Any, name: str, *, shape, dtype, chunks, **kwargs):
    """A new array of `group` (zarr 3's `create_array`, zarr 2's `create_dataset`)."""
    if dtype == "text":
        dtype = text_array([]).dtype
    if not zarr2():
        return group.create_array(name, shape=shape, dtype=dtype, chunks=chunks, **kwargs)
    if np.dtype(dtype) == np.dtype(object):
        import numcodecs

        kwargs["object_codec"] = numcodecs.VLenUTF8()
    return group.create_dataset(name, shape=shape, dtype=dtype, chunks=chunks, **kwargs)


def results_url(storage: str, name: str) -> str:
    """Where the results of study `name` live under `storage`."""
    return f"{storage.rstrip('/')}/studies/{name}/results.zarr"


def open_group(url: str, mode: str, storage_options: Mapping[str, Any] | None):
    import zarr

    options = dict(storage_options or {})
    return zarr.open_group(url, mode=mode, storage_options=options or None)


def columns(keys: Mapping[str, str], hyper_keys: Mapping[str, str]) -> dict[str, Column]:
    """The per-trial arrays of a group with metrics `keys` and hyper-parameters
    `hyper_keys` (name -> array name): array name -> `Column`."""
    table: dict[str, Column] = {
        "trial_id": ("int64", lambda t: t.id, True),
        "config": ("text", lambda t: config_dumps(t.config), True),
        "status": ("text", lambda t: t.status, False),
        "steps": ("int64", lambda t: t.reached, False),
        "error": ("text", lambda t: t.error or "", False),
    }
    for metric, key in keys.items():
        table[f"final/{key}"] = ("float64", _final(metric), False)
    for hyper, key in hyper_keys.items():  # a config never changes; the last value follows the steps
        table[f"hyper/{key}/constant"] = ("bool", _hyper(hyper, is_constant, True), True)
        table[f"hyper/{key}/first"] = ("text", _hyper(hyper, lambda s: _json(value_at(s, 0)), "null"), True)
        table[f"hyper/{key}/schedule"] = ("text", _hyper(hyper, readable, ""), True)
        table[f"hyper/{key}/last"] = ("text", _last(hyper), False)
    return table


def is_changing(name: str) -> bool:
    """Whether the cells of per-trial array `name` change with a trial's progress."""
    return (
        name in CHANGING
        or name.startswith("final/")
        or (name.startswith("hyper/") and name.endswith("/last"))
    )


def dtype_of(name: str) -> str:
    """The dtype of per-trial array `name` ("text": variable-length text)."""
    if name.startswith("final/"):
        return "float64"
    if name.endswith("/constant"):
        return "bool"
    return "int64" if name in ("trial_id", "steps") else "text"


def cells_array(name: str, values: list) -> np.ndarray:
    """`values`, cells of per-trial array `name`, as the numpy array zarr stores of it."""
    dtype = dtype_of(name)
    return text_array(values) if dtype == "text" else np.array(values, dtype=dtype)


def missing_cell(name: str) -> Any:
    """The cell of array `name` for a trial it says nothing of: a row written before its
    metric or hyper-parameter existed (no value; a trial without the hyper-parameter)."""
    if name.startswith("final/"):
        return np.nan
    if name.startswith("hyper/"):
        return {"constant": True, "first": "null", "schedule": "", "last": "null"}[name.rsplit("/", 1)[1]]
    return {"trial_id": -1, "steps": 0}.get(name, "")


def _final(metric: str) -> Callable[[Trial], float]:
    """A trial's final value of `metric` (NaN without one), read off its last point (its
    `metrics` would build a dict per cell)."""

    def value(t: Trial) -> float:
        found = None if t.last is None else t.last.get(metric)
        return np.nan if found is None else float(found)

    return value


def _hyper(name: str, cell: Callable[[Any], Any], missing: Any) -> Callable[[Trial], Any]:
    """A trial's cell of hyper-parameter `name` (`cell` of its sequence; `missing` if its
    config lacks it), made once per sequence: trials share their sequences (`Constant`s by
    value), and `columns` is made for one write, whose trials keep their sequences alive (so
    no id is reused meanwhile)."""
    cells: dict[int, Any] = {}

    def value(t: Trial) -> Any:
        if name not in t.config:
            return missing
        sequence = t.config[name]
        made = cells.get(id(sequence), _NONE)
        if made is _NONE:
            made = cells[id(sequence)] = cell(sequence)
        return made

    return value


def _last(name: str) -> Callable[[Trial], str]:
    """A trial's value of hyper-parameter `name` at the last step it reached, as JSON, made
    once per sequence and step (as `_hyper`'s cells)."""
    cells: dict[tuple[int, int], str] = {}

    def value(t: Trial) -> str:
        if name not in t.config:
            return "null"
        sequence, reached = t.config[name], t.reached
        made = cells.get((id(sequence), reached))
        if made is None:
            made = cells[id(sequence), reached] = _json(last_value(sequence, reached))
        return made

    return value


_NONE = object()  # no cell made yet


def _json(value: Any) -> str:
    """A hyper-parameter's value (a JSON scalar, NaN or None) as JSON text that reads back
    the same value of the same type. A finite float or a plain int is written as `json`
    writes it (its repr), and None as ``null``, without the encoder's setup, which cost more
    than the text: a write makes one such cell per hyper-parameter of every trial that
    changed."""
    kind = type(value)
    if (kind is float and math.isfinite(value)) or kind is int:
        return repr(value)
    if value is None:  # the last value of a trial that reached no step yet
        return "null"
    return json.dumps(value.item() if isinstance(value, np.generic) else value)


def names_added(names: Mapping[str, str], metrics: set[str]) -> dict[str, str]:
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


def put_steps(group: Any, steps: int, array: Any = None) -> Any:
    """The ``step`` coordinate 0 .. `steps` - 1, writing only what it lacks, a block at a
    time (its length follows the steps trained, never the steps a trial asked for); returns
    the array. `array`: the group's ``step`` array as the caller holds it (None: looked up)."""
    if array is None and "step" in group:
        array = group["step"]
    if array is not None:
        have = array.shape[0]
        if have == steps:
            return array
        array.resize((steps,))
    else:
        array = create_array(group, "step", shape=(steps,), dtype="int64", chunks=(_CHUNK_VALUES,))
        have = 0
    for begin in range(have, steps, _STEP_BLOCK):
        end = min(begin + _STEP_BLOCK, steps)
        array[begin:end] = np.arange(begin, end, dtype=np.int64)
    return array
