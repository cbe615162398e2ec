"""`Collections`: what Python's cyclic garbage collector cost while it listened (`gc.callbacks`),
the one listener of the benchmarks (the scale runs' longest full collection, the page's and the
resume's collector share)."""

from __future__ import annotations

import gc
import time

__all__ = ["Collections"]


class Collections:
    """CPU seconds of the collector's runs (`seconds`), its full (generation-2) runs (`full`)
    and the longest of those (`longest`, CPU seconds) while it listens, until `close`."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.full = 0
        self.longest = 0.0
        self._began = 0.0
        gc.callbacks.append(self._heard)

    def _heard(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._began = time.process_time()
            return
        spent = time.process_time() - self._began
        self.seconds += spent
        if info["generation"] == 2:
            self.full += 1
            self.longest = max(self.longest, spent)

    def close(self) -> None:
        gc.callbacks.remove(self._heard)
