"""A Dask task's events cross the scheduler packed into one bytes (`dagtune.execution._wire`)."""

from __future__ import annotations

import msgpack
import pytest
from distributed.protocol import dumps, loads
from test_coordinator_parts import EVENTS

from dagtune.events import MetricsReported, to_wire
from dagtune.execution._wire import pack, unpack


def test_a_batch_of_every_kind_crosses_dask_unchanged_as_one_bytes():
    """Packed, then carried by Dask's own protocol (as the worker sends it to the scheduler
    and the scheduler on to the study), every event comes back equal and of its type."""
    payload = pack(EVENTS)
    assert isinstance(payload, bytes)
    carried = loads(dumps({"op": "log-event", "topic": "t", "msg": payload}))["msg"]
    assert unpack(carried) == EVENTS
    assert [type(event) for event in unpack(carried)] == [type(event) for event in EVENTS]


def test_dask_sizes_a_packed_batch_without_walking_its_events(monkeypatch):
    """Dask estimates the size of every message it sends (worker and scheduler: to choose
    whether to serialize it on another thread), a Python call per object it visits: one for a
    packed batch however many events it holds, where the dicts cost one per dict, key and
    value (a one-step stage's message: about 80)."""
    import dask.sizeof

    real, visited = dask.sizeof.sizeof, []

    def counting(value):
        visited.append(value)
        return real(value)

    monkeypatch.setattr(dask.sizeof, "sizeof", counting)  # its recursion calls the module's name

    def visits(message):
        visited.clear()
        counting(message)
        return len(visited)

    assert visits(pack(EVENTS[:3])) == visits(pack(EVENTS)) == 1
    assert visits([to_wire(event) for event in EVENTS]) > 10 * len(EVENTS)  # how each batch travelled


def test_a_batch_msgpack_cannot_pack_travels_as_its_dicts():
    """A value msgpack does not know travels as before (Dask pickles it); unpack takes both."""
    odd = MetricsReported("t", "a", "n", 1, {"loss": complex(1, 2)})
    payload = pack([odd])
    assert payload == [to_wire(odd)]
    assert unpack(payload) == [odd]


def test_what_is_not_a_batch_of_events_is_refused():
    with pytest.raises(ValueError, match="not a packed batch of task events: int"):
        unpack(msgpack.packb(1))
    with pytest.raises(ValueError, match="not a task event: kind 'teleport'"):
        unpack(msgpack.packb([{"kind": "teleport", "task": "t"}]))
