"""Lazy grids: a `dt.Grid` of 1,000,000 configs and a `GridSearch` over it, against holding
the grid's configs in a list (what building one used to do).

Measured side by side in this process: seconds, then Python heap peak (tracemalloc, in a
second call) to build
the grid and the algorithm, to read their first 1,000 configs, and to materialize all the
configs; then ``len`` of a grid with a ``where`` filter (one pass over the product).

    python perf/grid.py [--side N]       a side x side grid of learning rates and momenta
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import dagtune as dt
from dagtune.algos import GridSearch


def measure(call) -> tuple[float, float, object]:
    """Seconds of `call`, its heap peak in MiB (a second call, under tracemalloc, which slows
    Python down), and its result."""
    began = time.perf_counter()
    call()
    seconds = time.perf_counter() - began
    tracemalloc.start()
    result = call()
    peak = tracemalloc.get_traced_memory()[1] / 2**20
    tracemalloc.stop()
    return seconds, peak, result


def candidates(side: int) -> dict[str, list[float]]:
    return {"lr": [1e-4 * (i + 1) for i in range(side)], "momentum": [i / side for i in range(side)]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--side", type=int, default=1000)
    args = parser.parse_args()
    side = args.side
    dt.Grid(candidates(3))  # imports and first-use caches, not counted below
    rows = []

    seconds, peak, grid = measure(lambda: dt.Grid(candidates(side)))
    rows.append(("build the grid", seconds, peak))
    seconds, peak, _ = measure(lambda: GridSearch(grid, metric="val_acc", steps=2))
    rows.append(("build GridSearch on it", seconds, peak))
    seconds, peak, _ = measure(lambda: list(itertools.islice(iter(grid), 1000)))
    rows.append(("first 1,000 configs of the grid", seconds, peak))
    ctx = dt.algos.Context(slots=4, seed=0)
    seconds, peak, _ = measure(
        lambda: list(itertools.islice(GridSearch(grid, "val_acc", steps=2).start(ctx), 1000))
    )
    rows.append(("first 1,000 submissions of GridSearch", seconds, peak))
    seconds, peak, held = measure(lambda: list(grid))
    rows.append((f"all {len(held):,} configs in a list (the old way)", seconds, peak))
    del held
    filtered = dt.Grid(candidates(side), where=lambda c: c["momentum"] >= 0.5)
    seconds, peak, size = measure(lambda: len(filtered))
    rows.append((f"len of the grid with where= ({size:,} kept)", seconds, peak))

    print(f"| {side * side:,}-config grid | seconds | heap peak (MiB) |")
    print("|---|---|---|")
    for what, seconds, peak in rows:
        print(f"| {what} | {seconds:.4f} | {peak:.2f} |")
    build = rows[0][1] + rows[1][1]
    print(
        f"\nbuilding grid + GridSearch: {build:.3f} s; holding the configs: {rows[4][1]:.2f} s, "
        f"{rows[4][2]:.0f} MiB ({rows[4][1] / build:.0f}x the time)"
    )


if __name__ == "__main__":
    main()
