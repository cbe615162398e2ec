"""Chained stages as the chain deepens (issue 24; `perf/RESULTS.md` section 5): does a stage
cost more at depth 250 than at depth 10?

One trial extended a step at a time, as `perf/dispatch.py`'s chained stages do: each stage
is a new trial whose config is ``Steps(range(n + 1), range(1, n + 1))`` (made anew per stage,
equal but not identical, the worst case: the dispatch benchmark makes one per round) with
one step more than the previous. Three runs: on the simulator with a durable local store and
with none, counted (`config_first_difference` calls per stage: each walks the config pieces
between its bounds; the coordinator compared every earlier trial of the chain), and on an
embedded cluster (TLS, its default) of 2 workers with the durable default store (a local
directory: a study on Dask always has one), timed (wall and this process's CPU per stage, per
window of the depth).

    PYTHONPATH=$PWD python -m perf.chain_depth [--depth 300] [--window 50]

Not a section of `python -m perf`: a diagnostic that prints its figures.
"""

from __future__ import annotations

import argparse
import importlib
import tempfile
import time
from collections.abc import Callable, Iterator

import dagtune as dt
import dagtune.config
from dagtune.checkpoints import CheckpointStore
from dagtune.sim import SimulatedExecutor
from perf.dispatch import WORKERS, NoopTrainer


def chain(n: int) -> dict:
    """The config of every stage of a chain of `n` (a new object each call)."""
    return {"x": dt.Steps(list(range(n + 1)), list(range(1, n + 1)))}


def windows(
    study: dt.Study, n: int, window: int, measure: Callable[[], float]
) -> Iterator[tuple[int, float]]:
    """Extend a chain of `n` stage by stage; after each `window` stages, the depth reached
    and `measure`'s growth per stage over the window."""
    began = measure()
    for steps in range(1, n + 1):
        study.submit(chain(n), steps).result()
        if steps % window == 0:
            now = measure()
            yield steps, (now - began) / window
            began = now


def timed(storage: str, n: int, window: int) -> None:
    with dt.Study(NoopTrainer, name="chain", storage=storage, workers=WORKERS) as study:
        clock = time.perf_counter()
        for depth, cpu in windows(study, n, window, time.process_time):
            wall, clock = (time.perf_counter() - clock) / window, time.perf_counter()
            print(
                f"durable, depth {depth - window} to {depth}: "
                f"{1000 * wall:.1f} ms a stage, {1000 * cpu:.1f} ms of this process's CPU",
                flush=True,
            )


def counted(n: int, window: int, durable: bool) -> None:
    calls = 0
    compare = dagtune.config.config_first_difference

    def counting(*args):
        nonlocal calls
        calls += 1
        return compare(*args)

    patched = []
    for name in ("dagtune.coordinator._branches", "dagtune.coordinator._paused", "dagtune.plan._plan"):
        try:  # the modules that compare configs (an earlier commit has no `_paused`)
            module = importlib.import_module(name)
        except ModuleNotFoundError:
            continue
        if hasattr(module, "config_first_difference"):
            module.config_first_difference = counting
            patched.append(module)
    try:
        with tempfile.TemporaryDirectory() as directory:
            executor = SimulatedExecutor(WORKERS, store=CheckpointStore(directory) if durable else None)
            with dt.Study(NoopTrainer, name="chain", executor=executor) as study:
                for depth, per_stage in windows(study, n, window, lambda: calls):
                    print(
                        f"simulated, {'durable' if durable else 'no storage'}, depth {depth - window} to "
                        f"{depth}: {per_stage:.1f} config comparisons a stage"
                    )
    finally:
        for module in patched:
            module.config_first_difference = compare


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--depth", type=int, default=300)
    parser.add_argument("--window", type=int, default=50)
    args = parser.parse_args()
    counted(args.depth, args.window, durable=True)
    counted(args.depth, args.window, durable=False)
    with tempfile.TemporaryDirectory() as directory:
        timed(directory, args.depth, args.window)


if __name__ == "__main__":
    main()
