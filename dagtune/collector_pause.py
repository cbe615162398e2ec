"""Python's cyclic garbage collector kept from walking a large study's heap again and again.

Reading a large study's journals, or building its read index, makes hundreds of thousands of
objects that live on; each collection walks them all and frees nothing: `collector_paused`
turns the collector off meanwhile. A running study keeps a heap that grows with its trials,
and each full collection walks all of it: `survivors_frozen` sets aside what survived the
last one (issue 24). This module holds that one job so the persistence (`durable`), the read
index (`study_index`), the page's snapshot and the study's run share it.
"""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator

__all__ = ["collector_paused", "survivors_frozen"]


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off while a study's journals are replayed into
    objects that all stay alive (trials, configs, plan nodes), or its read index is built
    (its trials and views live until it is written): each collection walks every object
    made so far and finds nothing to free, about 40% of the CPU of reading a 100,000-trial
    study's journals (issue 24). Back on, as it was, afterwards.

    What the block made is moved to the collector's oldest generation on the way out (where
    nothing else keeps objects in its permanent one, `gc.freeze`): the young collections
    would each walk all of it once more before it got there (about 0.8 s of a 100,000-trial
    study's opening), and a full collection still looks at it, when one is due."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if gc.get_freeze_count() == 0:  # else another's frozen objects would be let go
            gc.freeze()
            gc.unfreeze()  # into the oldest generation, none of it walked
        if enabled:
            gc.enable()


class _SurvivorFreezer:
    """The one process-wide state of `survivors_frozen`: how many runs hold it, and the
    frozen count past which the next full collection looks at everything again."""

    def __init__(self) -> None:
        self._lock = threading.RLock()  # a collection may start inside the lock's own block
        self._holders = 0
        self._engaged = False
        self._limit = 0

    def enter(self) -> None:
        with self._lock:
            self._holders += 1
            if self._holders == 1 and gc.get_freeze_count() == 0:  # else another's frozen objects
                self._engaged, self._limit = True, 0
                gc.callbacks.append(self._after_collection)

    def exit(self) -> None:
        with self._lock:
            self._holders -= 1
            if self._holders == 0 and self._engaged:
                self._engaged = False
                gc.callbacks.remove(self._after_collection)
                gc.unfreeze()  # into the oldest generation: the next full collection sees it all

    def _after_collection(self, phase: str, info: dict) -> None:
        if phase != "stop" or info["generation"] != 2:
            return
        with self._lock:  # not past the last run's end, in another thread
            if self._engaged:
                self._set_aside()

    def _set_aside(self) -> None:
        """After a full collection: its survivors frozen, or all let go once they doubled."""
        frozen = gc.get_freeze_count()
        if self._limit and frozen > self._limit:
            # once per doubling, the next full collection walks everything: cyclic garbage
            # among objects frozen earlier is freed then, at a cost linear over the run
            gc.unfreeze()
            self._limit = 2 * frozen
        else:
            gc.freeze()
            self._limit = self._limit or 2 * gc.get_freeze_count()


_FREEZER = _SurvivorFreezer()


@contextlib.contextmanager
def survivors_frozen() -> Iterator[None]:
    """While a study runs, what survives each full collection is set aside from the next ones.

    A running study holds a heap that grows with its trials (trials, plan nodes, curves), and
    makes objects that live a while and then die (running tasks, events, pending results).
    Those move into the collector's oldest generation and set off its full collections, each
    of which walks every object the process holds: at 100,000 trials of an ASHA search the
    longest such pause of the coordinator's loop was 1.28 s (0.57 s with this; the CPU per
    trial did not move beyond noise: perf/RESULTS.md section 9o). Here each
    full collection's survivors are frozen (`gc.freeze`), so the next one walks only what
    came since; once the frozen objects have doubled they are let go (`gc.unfreeze`) for one
    full walk, which frees any cycle among them that died meanwhile, and the run's end lets
    them all go. What reference counting frees (nearly everything) is freed at once as
    always: only garbage in reference cycles among objects older than the last full
    collection waits, at most until the frozen objects double or the run ends.

    Nested and concurrent runs share one state; nothing is done if something else has frozen
    objects already (its `gc.freeze` is not this one's to undo)."""
    _FREEZER.enter()
    try:
        yield
    finally:
        _FREEZER.exit()
