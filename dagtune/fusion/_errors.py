"""`FusionError`: trials that cannot train as one fused group."""

from __future__ import annotations

from dagtune.errors import DagtuneError

__all__ = ["FusionError"]


class FusionError(DagtuneError, ValueError):
    """Trials that cannot train as one fused group (the message says what differs)."""
