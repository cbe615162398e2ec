"""The change log of a results group (format ``dagtune-results/5``): one entry per write,
the rows and curve points that write stored, packed into one JSON text.

An entry is ``{"new": {array: [cell, ...]}, "rows": {array: [cell, ...]}, "points": {key:
[[trial id, ...], [step, ...], [value, ...]]}}``: ``new`` holds the cells that never change
(``trial_id``, ``config``, the hyper-parameters' ``constant``, ``first`` and ``schedule``) of
the trials new to the group, in the order they came; ``rows`` the cells that change
(``trial_id``, ``status``, ``steps``, ``error``, ``final/<key>``, ``hyper/<key>/last``) of every
trial that write stored, new or not, as of that write; ``points`` the learning curves' points
it stored (a step counted from 0; NaN: a cell no longer evaluated). A float is JSON's
(``NaN`` and ``Infinity`` included), which reads back the same float.

`LogChanges` reads the committed entries back: the later entry of a trial, or of a curve
cell, wins."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from dagtune.results._format import cells_array, is_changing, missing_cell

__all__ = ["LogChanges", "entry_text", "last_of"]


def entry_text(
    new: Mapping[str, list], rows: Mapping[str, list], points: Mapping[str, tuple[list, list, list]]
) -> str:
    """One log entry (see the module docstring) as the text the log stores."""
    entry = {"new": new, "rows": rows, "points": {k: list(v) for k, v in points.items()}}
    return json.dumps(entry, separators=(",", ":"), default=_plain)


def _plain(value: Any) -> Any:
    """A numpy scalar (a cell worked out with numpy) as the Python value JSON writes."""
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"a results cell JSON can't hold: {value!r}")


def last_of(ids: np.ndarray) -> np.ndarray:
    """Where each distinct value of `ids` occurs last, in the order of the values."""
    _, first = np.unique(ids[::-1], return_index=True)
    return len(ids) - 1 - first


class LogChanges:
    """The committed entries of a change log, decoded: the trials new to the base arrays
    (`new_ids`, in the order they came, with their fixed cells: `new_cells`), the trials
    whose changing cells the log holds (`ids`, ascending, with the last logged cells of each:
    `cells`), and per metric array name the last logged value of each curve cell
    (`points`). `size` counts the rows and points the entries hold, repeats included."""

    def __init__(self, entries: Iterable[str]) -> None:
        decoded = [json.loads(str(entry)) for entry in entries]
        self.new_ids = _ids([e["new"].get("trial_id", []) for e in decoded])
        self._new = _concatenated([e["new"] for e in decoded], exclude="trial_id")
        logged = _ids([e["rows"].get("trial_id", []) for e in decoded])
        self._last = last_of(logged)
        self.ids = logged[self._last]
        self._rows = _concatenated([e["rows"] for e in decoded], exclude="trial_id")
        self.points: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        for key in sorted({k for e in decoded for k in e["points"]}):
            parts = [e["points"][key] for e in decoded if key in e["points"]]
            ids, steps = _ids([p[0] for p in parts]), _ids([p[1] for p in parts])
            values = np.array([v for p in parts for v in p[2]], dtype=np.float64)
            last = last_of((ids << 32) | steps)
            self.points[key] = (ids[last], steps[last], values[last])
        self.size = len(logged) + sum(len(p[1]) for e in decoded for p in e["points"].values())

    @property
    def names(self) -> set[str]:
        """The arrays the entries hold cells of (new and changing)."""
        return set(self._new) | set(self._rows)

    def new_cells(self, name: str) -> np.ndarray | None:
        """The fixed cells of array `name` of the new trials (None: `name` changes)."""
        if name == "trial_id":
            return self.new_ids
        if is_changing(name):
            return None
        cells = self._new.get(name)
        return cells_array(name, [missing_cell(name)] * len(self.new_ids) if cells is None else cells)

    def cells(self, name: str) -> np.ndarray:
        """The last logged cells of changing array `name`, one per trial of `ids`."""
        cells = self._rows.get(name)
        if cells is None:
            return cells_array(name, [missing_cell(name)] * len(self.ids))
        return cells_array(name, cells)[self._last]


def _ids(parts: list[list[int]]) -> np.ndarray:
    return np.array([i for part in parts for i in part], dtype=np.int64)


def _concatenated(parts: list[dict[str, list]], exclude: str) -> dict[str, list[Any]]:
    """Each array's cells over the entries `parts` (each a mapping of array name to cells,
    with as many cells as its ``trial_id``), the cells of an entry without the array missing."""
    names = sorted({name for part in parts for name in part} - {exclude})
    joined: dict[str, list[Any]] = {name: [] for name in names}
    for part in parts:
        count = len(part.get(exclude, []))
        for name in names:
            cells = part.get(name)
            joined[name].extend([missing_cell(name)] * count if cells is None else cells)
    return joined
