"""The cyclic garbage collector paused while a study builds objects that all stay alive.

Reading a large study's journals, or building its read index, makes hundreds of thousands of
objects that live on; each collection walks them all and frees nothing (issue 24). This module
holds that one job so the persistence (`durable`) and the read index (`study_index`) share it.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

__all__ = ["collector_paused"]


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
