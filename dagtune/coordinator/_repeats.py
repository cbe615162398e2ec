"""`Repeats`: which of the executor's events the dispatcher already handled, so that an
event delivered twice (streamed, then again with the task's result) counts once.

What it keeps is bounded by what runs, not by the study's history: a set of the events
handled per task that has not ended, and for the tasks that ended one bit each (by the
launch number that ends the dispatcher's task keys), since a task's `TaskEnded` (or its
`CheckpointCorrupt`) comes after all its other events: whatever of it arrives later is a
repeat. A task that failed keeps its set: a lost task's streamed events may still come,
and a timed-out one may still run (failures are few).
"""

from __future__ import annotations

from dagtune.events import TaskEvent

__all__ = ["Repeats"]


class Repeats:
    """The events handled (see the module docstring); `prefix` starts every task key the
    dispatcher makes, whose launch number follows the last ``-``."""

    __slots__ = ("_ended", "_live", "_prefix")

    def __init__(self, prefix: str):
        self._prefix = prefix
        self._live: dict[str, set[tuple[str, str, int]]] = {}  # task -> (attempt, kind, step)
        self._ended = bytearray()  # bit n: the task of launch number n ended

    def first(self, event: TaskEvent) -> bool:
        """Whether `event` is new (then it is recorded as handled), not a repeat."""
        if self._has_ended(event.task):
            return False
        seen = self._live.get(event.task)
        if seen is None:
            seen = self._live[event.task] = set()
        mark = (event.attempt, event.kind, event.step)
        if mark in seen:
            return False
        seen.add(mark)
        return True

    def ended(self, task: str) -> None:
        """Task `task` ended: all its events came; what arrives later repeats them. A key
        the dispatcher did not make keeps its set."""
        number = self._number(task)
        if number is None:
            return
        self._live.pop(task, None)
        byte, bit = divmod(number, 8)
        if byte >= len(self._ended):
            self._ended.extend(bytes(byte + 1 - len(self._ended)))
        self._ended[byte] |= 1 << bit

    def tasks_followed(self) -> int:
        """How many tasks have a set of their events (the running ones, and those that failed)."""
        return len(self._live)

    def _has_ended(self, task: str) -> bool:
        number = self._number(task)
        if number is None:
            return False
        byte, bit = divmod(number, 8)
        return byte < len(self._ended) and bool(self._ended[byte] >> bit & 1)

    def _number(self, task: str) -> int | None:
        if not task.startswith(self._prefix):
            return None
        tail = task.rpartition("-")[2]
        return int(tail) if tail.isascii() and tail.isdigit() else None
