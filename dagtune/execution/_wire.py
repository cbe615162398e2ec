"""How a Dask task's events cross the scheduler: one ``log_event`` message per batch, its
events packed into one msgpack ``bytes`` (`pack`) that the study unpacks (`unpack`).

Dask walks every object of a message it sends: the worker checks that it can be dumped,
and the worker and the scheduler, forwarding it to the study's client, each estimate its
size (``dask.sizeof``, a Python call per object) to decide whether to serialize it on
another thread. A one-step stage's message is its five or six events as dicts (`to_wire`),
about 80 objects: those walks cost about 0.2 ms each of the worker's and the scheduler's CPU
per stage (perf/RESULTS.md section 5). One ``bytes`` is one object to each of them, and it
is what Dask's own msgpack would have made of the dicts: the same types come back (msgpack
as Dask packs and unpacks it: ``use_bin_type``, keys that are not strings allowed), so the
events are unchanged. A batch msgpack can't pack (a value of a type it does not know) travels
as its dicts, as every batch did before, and Dask packs it its own way.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import msgpack

from dagtune.events import TaskEvent, from_wire, to_wire

__all__ = ["pack", "unpack"]


def pack(events: Iterable[TaskEvent]) -> bytes | list[dict]:
    """`events` as one msgpack ``bytes`` (their `to_wire` dicts, in order), or as the dicts
    themselves where msgpack can't pack one of their values."""
    wires = [to_wire(event) for event in events]
    try:
        return msgpack.packb(wires, use_bin_type=True)
    except (TypeError, ValueError, OverflowError):  # Dask falls back to pickle for what msgpack can't carry
        return wires


def unpack(payload: bytes | Sequence[dict]) -> list[TaskEvent]:
    """The events `pack` made `payload` from (a ValueError names a payload that is not one)."""
    wires = (
        msgpack.unpackb(payload, use_list=False, strict_map_key=False)
        if isinstance(payload, bytes | bytearray | memoryview)
        else payload
    )
    if not isinstance(wires, Sequence) or not all(isinstance(wire, dict) for wire in wires):
        raise ValueError(f"not a packed batch of task events: {type(wires).__name__}")
    return [from_wire(wire) for wire in wires]
