"""What the results-writer tests share: the table and curve a study's trials should read back
as, what `open_results` reads, and a count of the keys the zarr store is asked to set or
get."""

from __future__ import annotations

import zarr
import zarr.storage

from dagtune.frames import row_of, trials_table
from dagtune.records import Trial
from dagtune.results import open_results


def expected_table(trials: dict[int, Trial]):
    """The trials table `open_results` should read for `trials`."""
    return trials_table(row_of(t) for t in trials.values())


def curve_of(trials: dict[int, Trial]) -> dict[tuple[int, int], float]:
    """Every trial's 'loss' points by (trial, step index)."""
    return {(i, s - 1): v["loss"] for i, t in trials.items() for s, v in t.curve}


def read_curve(path) -> dict[tuple[int, int], float]:
    """The 'loss' points study 's' stored at `path` reads back, by (trial, step index)."""
    curve = open_results(str(path), "s").curve("loss")
    return {(i, s): v for (i, s), v in curve.stack().items() if v == v}


def count_stored_keys(monkeypatch) -> list[str]:
    """The keys the zarr store is asked to set from now on (metadata and chunks), in a list
    that grows as they are set."""
    keys: list[str] = []
    original = zarr.storage.LocalStore.set

    async def counting(self, key, value):
        keys.append(key)
        return await original(self, key, value)

    monkeypatch.setattr(zarr.storage.LocalStore, "set", counting)
    return keys


def count_read_keys(monkeypatch) -> list[str]:
    """The keys the zarr store is asked to get from now on (metadata and chunks), in a list
    that grows as they are read."""
    keys: list[str] = []
    original = zarr.storage.LocalStore.get

    async def counting(self, key, *args, **kwargs):
        keys.append(key)
        return await original(self, key, *args, **kwargs)

    monkeypatch.setattr(zarr.storage.LocalStore, "get", counting)
    return keys
