"""`WorkerMemory`: which trainer each worker keeps live in memory (the point where its last
task stopped), so that a task resuming from that point is sent there and continues
without reading storage, and which launched task a worker is promised to."""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["WorkerMemory"]


class WorkerMemory:
    """The live trainers of the workers, and the tasks promised the trainer a running task
    will leave live (see the module docstring)."""

    def __init__(self) -> None:
        self._live: dict[str, tuple[str, int] | None] = {}  # worker -> point it holds in memory
        self._holders: dict[tuple[str, int], dict[str, None]] = {}  # point -> workers holding it
        # worker -> the task launched to continue the trainer a task still running there will
        # leave live: once that task ends, its point is taken, not free for a second task
        self._promised: dict[str, str] = {}
        self._promise_of: dict[str, str] = {}  # the same, task -> worker

    def hold(self, worker: str, point: tuple[str, int] | None) -> None:
        """`worker` holds the trainer at `point` in memory now (None: nothing to reuse)."""
        old = self._live.get(worker)
        if old is not None:
            holders = self._holders[old]
            del holders[worker]
            if not holders:
                del self._holders[old]
        self._live[worker] = point
        if point is not None:
            self._holders.setdefault(point, {})[worker] = None

    def prefer(self, key: str, source: tuple[str, int] | None, ending: Iterable[str | None]) -> str | None:
        """The worker task `key`, which starts from `source`, should run on: one holding
        `source` live, else the first of `ending` (the workers of tasks about to end there);
        that worker is promised to `key` (no second task may count on it)."""
        if source is None:
            return None
        prefer = next(iter(self._holders.get(source, ())), None)
        if prefer is None:
            prefer = next((worker for worker in ending if worker is not None), None)
        if prefer is not None:
            self.hold(prefer, None)
            earlier = self._promised.get(prefer)
            if earlier is not None:
                del self._promise_of[earlier]
            self._promised[prefer] = key
            self._promise_of[key] = prefer
        return prefer

    def promised(self, worker: str) -> bool:
        """A launched task counts on `worker` (what ends there leaves nothing free)."""
        return worker in self._promised

    def release(self, key: str) -> None:
        """Task `key` started or ended: its promise is kept or void."""
        worker = self._promise_of.pop(key, None)
        if worker is not None:
            del self._promised[worker]
