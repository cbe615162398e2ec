"""The checkpoints live studies of one model identity need, published in storage so that
garbage collection by any study, or `dagtune gc`, never deletes them (`Leases`).

Layout under the storage URL (see `dagtune.durable`)::

    {identity}/leases/{writer}.json            every point a live study needs
    {identity}/leases/{writer}-{n:06d}.json    those added since (parts of it)
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
import uuid
from collections.abc import Iterable

from fsspec.implementations.local import LocalFileSystem

from dagtune.checkpoints import CheckpointStore

__all__ = ["Leases", "Point"]

log = logging.getLogger("dagtune")

Point = tuple[str, int]


class Leases:
    """The checkpoints live studies of one model identity need, so that garbage collection by
    any study (or `dagtune gc`) never deletes them: small JSON files per writer (each a lease
    of its own: writer, time written, ttl, points), renewed while the study lives and removed
    when it closes. A lease older than its ``ttl`` belongs to a study that died; it no
    longer protects anything. A reader takes every point of every live file.

    A writer publishes what changed, not every point each time: `renew` writes the whole
    set in ``{writer}.json`` (and removes the parts); `add` writes only the points that
    entered since, each time in a part ``{writer}-{n:06d}.json``. Points that left stay
    published until the next whole write: a lease may protect a point a while longer than
    needed, never one less. `whole_due` says when the whole set is to be written again:
    every quarter of the ttl (the heartbeat: each file is then at most half a ttl old), and
    once the parts hold as many points as the whole, number `MAX_PARTS`, or the points that
    left outnumber those that stay. On a local disk each file is written to a temporary name
    and renamed (a reader never sees part of one); elsewhere a put is whole."""

    #: parts beside the whole set at most (a reader reads each)
    MAX_PARTS = 64

    def __init__(self, store: CheckpointStore, identity: str, writer: str, *, ttl_seconds: float = 600.0):
        self.store = store
        self.directory = f"{store.root}/{identity}/leases"
        self.path = f"{self.directory}/{writer}.json"
        self.writer = writer
        self.ttl_seconds = ttl_seconds
        self.points: set[Point] | None = None  # every point the files hold (None: none written)
        self.renewed = -float("inf")  # the last write, whole or part (monotonic)
        self.took = 0.0  # seconds the last write took
        self.written_points = 0  # points written in all, whole and parts (tests count them)
        self._whole_at = -float("inf")
        self._whole_size = 0
        self._parts: list[str] = []
        self._part_points = 0
        self._sequence = 0

    def whole_due(self, entered: int, left: int) -> bool:
        """Whether the next write is to be the whole set, with `entered` points to add and
        `left` points left since the last whole write (see the class docstring)."""
        return (
            time.monotonic() - self._whole_at >= self.ttl_seconds / 4
            or len(self._parts) >= self.MAX_PARTS
            or self._part_points + entered > max(self._whole_size, self.MAX_PARTS)
            or 2 * left > self._whole_size + self._part_points
        )

    def renew(self, points: Iterable[Point]) -> None:
        """Write the lease for every one of `points` (with the time), then remove the parts."""
        began = time.perf_counter()
        points = set(points)
        self._put(self.path, points)
        for part in self._parts:
            with contextlib.suppress(FileNotFoundError):
                self.store.fs.rm_file(part)
        self.points, self._parts, self._part_points = points, [], 0
        self._whole_at, self._whole_size = time.monotonic(), len(points)
        self.renewed = self._whole_at
        self.took = time.perf_counter() - began

    def add(self, points: Iterable[Point]) -> None:
        """Publish `points` too: those the files do not hold yet, in a new part (nothing is
        written if there are none)."""
        began = time.perf_counter()
        if self.points is None:
            self.points = set()
        new = {point for point in points if point not in self.points}
        if new:
            part = f"{self.directory}/{self.writer}-{self._sequence:06d}.json"
            self._sequence += 1
            self._put(part, new)
            self._parts.append(part)
            self._part_points += len(new)
            self.points |= new
        self.renewed = time.monotonic()
        self.took = time.perf_counter() - began

    def _put(self, path: str, points: set[Point]) -> None:
        payload = {
            "writer": self.writer,
            "written": time.time(),
            "ttl": self.ttl_seconds,
            "points": list(points),
        }
        data = json.dumps(payload).encode()
        self.written_points += len(points)
        fs = self.store.fs
        if not isinstance(fs, LocalFileSystem):
            fs.makedirs(self.directory, exist_ok=True)
            fs.pipe_file(path, data)
            return
        os.makedirs(self.directory, exist_ok=True)
        temporary = f"{self.directory}/.{os.path.basename(path)}.{uuid.uuid4().hex}.tmp"
        try:  # not fsynced (as before): after a crash its trial records say what it needs
            with open(temporary, "wb") as file:
                file.write(data)
            os.replace(temporary, path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.remove(temporary)

    def release(self) -> None:
        for path in (*self._parts, self.path):  # every file: the study needs none of its points now
            with contextlib.suppress(FileNotFoundError):
                self.store.fs.rm_file(path)
        self.points, self._parts, self._part_points = None, [], 0

    @staticmethod
    def held(store: CheckpointStore, identity: str, *, exclude: str | None = None) -> set[Point]:
        """Every point a live lease of `identity` holds (all writers but `exclude`)."""
        directory = f"{store.root}/{identity}/leases"
        try:
            paths = store.fs.ls(directory, detail=False)
        except FileNotFoundError:
            return set()
        now, points = time.time(), set()
        for path in paths:
            if path.rstrip("/").rsplit("/", 1)[-1].startswith("."):
                continue  # a file being written (renamed to its name once whole)
            try:
                lease = json.loads(store.fs.cat_file(path))
                if lease["writer"] == exclude or now > float(lease["written"]) + float(lease["ttl"]):
                    continue
                points.update((str(node), int(step)) for node, step in lease["points"])
            except FileNotFoundError:
                continue  # released meanwhile
            except (ValueError, KeyError, TypeError) as error:
                log.warning("dagtune: unreadable lease %s (%r); ignored", path, error)
        return points
