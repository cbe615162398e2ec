"""`IdsByNode`: trial ids grouped by node, compact for the common case of one per node.

The ledger keeps, for each node, the pending trials passing through it (the completed
trials ending on it are kept by config: `dagtune.coordinator._paused`); a study of 100,000
trials has about as many nodes, most of them with one trial. A set per node costs 216 bytes, and one left empty
after its last trial went stays allocated: here a node with one trial holds the bare id, a
set only from the second, and a node whose last id goes is forgotten.
"""

from __future__ import annotations

from collections.abc import Collection

__all__ = ["IdsByNode"]


class IdsByNode:
    """Node -> a collection of trial ids; every operation is O(1)."""

    def __init__(self) -> None:
        self._held: dict[str, int | set[int]] = {}

    def add(self, node: str, trial_id: int) -> None:
        held = self._held.get(node)
        if held is None:
            self._held[node] = trial_id
        elif isinstance(held, set):
            held.add(trial_id)
        elif held != trial_id:
            self._held[node] = {held, trial_id}

    def discard(self, node: str, trial_id: int) -> None:
        held = self._held.get(node)
        if held is None:
            return
        if isinstance(held, set):
            held.discard(trial_id)
            if not held:
                del self._held[node]
        elif held == trial_id:
            del self._held[node]
        else:
            return
        if not self._held:  # drained: its table, sized for the busiest moment, goes
            self._held = {}

    def get(self, node: str) -> Collection[int]:
        """The ids on `node` (empty if none)."""
        held = self._held.get(node)
        if held is None:
            return ()
        return held if isinstance(held, set) else (held,)

    def __len__(self) -> int:
        """The nodes holding an id."""
        return len(self._held)
