"""Dask's draws from python's global random generator, given a generator of their own on
every worker, so that a trainer's `random.random()` draws are the ones `run_alone` makes.

dagtune seeds python's `random` before building a trainer and saves and restores its state
with every checkpoint, but a worker's other threads draw from it too: `dask.sizeof` samples
the items of every large dict or list it sizes (`random.sample`; the event loop sizes the
messages it sends and receives), and distributed jitters its retries and backoffs with it.
Those draws land at any time while the trainer's thread builds and trains, so a trainer
shuffling or augmenting with `random` trained differently on a worker from alone (and
failed the resume check, which compares two trainers' draws). Each of those modules
imports `random` and calls it by attribute, so each is handed a `random.Random` of its own:
what they draw is as random as before, and the global generator is the trainer's alone.
"""

from __future__ import annotations

import importlib
import random

__all__ = ["DASK_MODULES", "private_random_for_dask"]

# the modules of dask and distributed that draw from the global generator on a worker
DASK_MODULES = ("dask.sizeof", "distributed.utils_comm", "distributed.comm.core", "distributed.worker")


def private_random_for_dask() -> None:
    """Give each of `DASK_MODULES` its own `random.Random` in place of the `random` module
    (once per process: a module already given one is left alone)."""
    for name in DASK_MODULES:
        module = importlib.import_module(name)
        if getattr(module, "random", None) is random:
            module.random = random.Random()  # type: ignore[attr-defined]
