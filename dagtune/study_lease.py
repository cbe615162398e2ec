"""One writer per study: a lease in storage, held while a study session runs.

Two processes writing one study's trial records would number their trials alike and mix
their results, so a study session first takes the study's *writer lease* and keeps it
renewed; a second process opening the same study name on the same storage is refused
(`StudyInUseError`, naming the holder's host, pid and session and when its lease lapses) or,
if asked (``Study(wait_for_lease=seconds)``), waits for it. It works on any storage that can
create a file exclusively: a local disk (a hard link, which fails if the name exists) and
object stores (fsspec's ``pipe_file(..., mode="create")``, ``If-None-Match: *`` on S3).

The lease is a directory of numbered *generations*, ``studies/{name}/lease/{g:012d}.json``,
each created exclusively and never rewritten. The highest generation says who holds the
study: its session, host, pid, ttl, or that the holder released it. Every change of the
lease is the exclusive creation of the next number:

- **renewal**: the holder of generation g creates g+1, every ``ttl / 3`` seconds, from a
  heartbeat thread;
- **release**: the holder creates the next generation marked released, when the session
  closes;
- **takeover**: a process that found generation g at the top creates g+1 once g is free:
  released, or its holder's process is gone (same machine, same user: its pid no longer runs
  the process that wrote the lease), or g has lapsed: it is older than its ttl by the
  storage's own clock (the age of g's modification time measured against a file this
  process writes just then, so clocks of different machines never meet), or, where storage
  keeps no times, g stayed at the top for a ttl of this process's monotonic clock.

Why at most one process holds the study at any time:

1. *Exclusive creation decides every race.* Renewal and takeover of g both create g+1: if two
   processes try, one creation succeeds and the other fails with `FileExistsError`; so two
   contenders who both saw g lapse can't both win, and a holder can't renew past a takeover.
2. *A creation counts only if nothing higher exists*, checked by listing after creating.
   Old generations are deleted (all but the two newest) and the top one never is, so a
   process that wakes from a long pause and creates a low, deleted number sees the higher
   ones and has not won.
3. *A holder stops writing before anyone may take over.* The holder counts its lease valid
   for ``2 * ttl / 3`` from the moment it *began* the creation of its latest generation, by
   a clock that keeps counting while the machine sleeps (Linux ``CLOCK_BOOTTIME``; Python's
   monotonic clock stops there) and by the wall clock (whichever ran out first), and checks
   that before every write of the study's records and results
   (`ensure`, called before each attempt). The creation it began then was stamped by the
   storage no earlier, and a takeover needs that stamp to be a whole ttl old (on the
   storage's clock, or observed for a ttl here), so the holder's validity ends ``ttl / 3``
   before the earliest takeover. That margin absorbs a write begun just before the deadline
   and landing late, and clock rate differences.
4. *A holder that finds its lease taken* (its next creation fails, or a higher generation
   exists: a laptop that slept past its ttl) raises `StudyLeaseLostError` from every later write:
   the study stops and says so instead of writing beside the new holder.

Past its deadline a holder does not write until it has renewed; an outage longer than the
ttl therefore pauses writing, and the holder carries on if its renewal then succeeds (no one
else created the next generation meanwhile, so no one held the study).

What a lease can't prevent, a writer delayed between its check and its write by more than
``ttl / 3``, the trial records catch: every ``end`` and ``extend`` record names the session
that submitted its trial, and a reader never attaches one to a trial another session
submitted under the same number (`dagtune.records`).
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import math
import os
import re
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from dagtune.checkpoints import CheckpointStore
from dagtune.errors import DagtuneError
from dagtune.storage_retry import check_retry_seconds
from dagtune.validation import check_number

__all__ = [
    "DEFAULT_LEASE_TTL",
    "LeaseHolder",
    "StudyInUseError",
    "StudyLease",
    "StudyLeaseLostError",
    "check_lease_ttl",
    "suspend_aware_clock",
    "writer_status",
]

log = logging.getLogger("dagtune")

#: seconds a study's writer lease lasts without renewal (``Study(lease_ttl=...)``)
DEFAULT_LEASE_TTL = 45.0
MIN_LEASE_TTL = 3.0
RENEW_FRACTION = 1 / 3  # the holder renews every ttl / 3 ...
VALID_FRACTION = 2 / 3  # ... and writes only within 2 ttl / 3 of beginning its latest renewal
STAMP_SLACK = 2.0  # seconds: object stores keep modification times to the second
KEEP_GENERATIONS = 2

_GENERATION = re.compile(r"^(?P<generation>[0-9]{12})\.json$")


class StudyInUseError(RuntimeError, DagtuneError):
    """Another process holds the study's writer lease (the message names it and says when
    its lease lapses); `holder` is its `LeaseHolder`."""

    def __init__(self, message: str, holder: LeaseHolder | None):
        super().__init__(message)
        self.holder = holder


class StudyLeaseLostError(RuntimeError, DagtuneError):
    """This session's writer lease was taken over by another process (it lapsed, e.g. while
    the machine slept): the session stopped writing the study."""


def check_lease_ttl(value: Any) -> float:
    """`value` as a lease ttl in seconds (at least `MIN_LEASE_TTL`), else a ValueError."""
    expected = f"a number of seconds >= {MIN_LEASE_TTL:g}"
    return float(check_number("lease_ttl", value, minimum=MIN_LEASE_TTL, expected=expected))


@dataclass(frozen=True)
class LeaseHolder:
    """What one generation of a study's lease says about its holder."""

    session: str
    host: str
    pid: int
    ttl: float
    since: float  # when the holder took the study (wall clock, its machine's)
    written: float  # when it wrote this generation (wall clock, its machine's)
    released: bool = False
    machine: str | None = None  # boot id and pid namespace: where `pid` means something
    uid: int | None = None
    process: str | None = None  # the process's start time (Linux), so a reused pid is not it

    def describe(self) -> str:
        return f"session {self.session[:12]} on host {self.host}, pid {self.pid}"

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @staticmethod
    def from_json(data: bytes) -> LeaseHolder | None:
        """The holder a generation names, or None if it is not one dagtune wrote."""
        try:
            raw = json.loads(data)
            holder = LeaseHolder(
                session=str(raw["session"]),
                host=str(raw["host"]),
                pid=int(raw["pid"]),
                ttl=float(raw["ttl"]),
                since=float(raw["since"]),
                written=float(raw["written"]),
                released=bool(raw.get("released", False)),
                machine=None if raw.get("machine") is None else str(raw["machine"]),
                uid=None if raw.get("uid") is None else int(raw["uid"]),
                process=None if raw.get("process") is None else str(raw["process"]),
            )
        except (ValueError, KeyError, TypeError):
            return None
        return holder if math.isfinite(holder.ttl) and holder.ttl > 0 else None


def suspend_aware_clock() -> float:
    """Seconds on a clock that keeps counting while the machine sleeps (Linux
    ``CLOCK_BOOTTIME``; macOS ``CLOCK_MONOTONIC``), where there is one; else `time.monotonic`."""
    return time.clock_gettime(_CLOCK) if _CLOCK is not None else time.monotonic()


if hasattr(time, "CLOCK_BOOTTIME"):
    _CLOCK: int | None = time.CLOCK_BOOTTIME
elif sys.platform == "darwin":
    _CLOCK = time.CLOCK_MONOTONIC
else:
    _CLOCK = None


def _machine() -> str | None:
    """This kernel's boot and this pid namespace: two processes that agree on it see the
    same pids."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as file:
            boot = file.read().strip()
        return f"{boot}:{os.readlink('/proc/self/ns/pid')}"
    except OSError:
        return None


def _uid() -> int | None:
    getuid = getattr(os, "getuid", None)  # POSIX only
    return None if getuid is None else getuid()


def _process_start(pid: int) -> str | None:
    """When process `pid` started (clock ticks since boot, Linux); None if there is no such
    process; raises OSError if it can't be told."""
    try:
        with open(f"/proc/{pid}/stat") as file:
            stat = file.read()
    except FileNotFoundError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]  # field 22, counting the two before ')'


def _gone(holder: LeaseHolder) -> bool:
    """Whether `holder`'s process has certainly exited: it ran on this machine, as this
    user (whose processes this one can see), and its pid runs no process, or another one."""
    if holder.machine is None or holder.process is None or holder.machine != _machine():
        return False
    if holder.uid != _uid():
        return False
    try:
        return _process_start(holder.pid) != holder.process
    except OSError:
        return False


def _stamp(details: Mapping[str, Any]) -> float | None:
    """A file's modification time by the storage's clock, in seconds, if it keeps one."""
    for key in ("mtime", "LastModified", "last_modified", "created"):
        value = details.get(key)
        if value is None:
            continue
        if hasattr(value, "timestamp"):
            return float(value.timestamp())
        with contextlib.suppress(TypeError, ValueError):
            return float(value)
    return None


def _clock(stamp: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(stamp))


@dataclass(frozen=True)
class _Top:
    """The highest generation found, what it says, and its storage time stamp."""

    generation: int
    holder: LeaseHolder | None  # None: unreadable (not a lease dagtune wrote)
    stamp: float | None


class StudyLease:
    """The writer lease of study `name` in `store`, for session `session` (see the module
    docstring). `acquire` takes it (or raises `StudyInUseError`), `ensure` is the check
    before every write, `release` gives it up. `clock` (one that counts a machine's sleep)
    and `sleep` are injectable for tests."""

    def __init__(
        self,
        store: CheckpointStore,
        name: str,
        session: str | None = None,
        *,
        ttl: float = DEFAULT_LEASE_TTL,
        clock: Callable[[], float] = suspend_aware_clock,
        sleep: Callable[[float], Any] = time.sleep,
    ):
        self.store = store
        self.name = name
        self.session = session or uuid.uuid4().hex
        self.ttl = check_lease_ttl(ttl)
        self.clock = clock
        self.sleep = sleep
        self.directory = f"{store.root}/studies/{name}/lease"
        self.generation: int | None = None
        self.valid_until = -math.inf  # by `clock`
        self.valid_until_wall = -math.inf  # by the wall clock
        self.lost: str | None = None  # why the lease was lost, once it was
        self._since = time.time()
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._heartbeat: threading.Thread | None = None

    # ------------------------------------------------------------------ reading

    def _generations(self) -> list[int]:
        try:
            paths = self.store.fs.ls(self.directory, detail=False)
        except FileNotFoundError:
            return []
        found = (_GENERATION.match(p.rstrip("/").rsplit("/", 1)[-1]) for p in paths)
        return sorted(int(m["generation"]) for m in found if m is not None)

    def _path(self, generation: int) -> str:
        return f"{self.directory}/{generation:012d}.json"

    def _read(self, generation: int) -> tuple[LeaseHolder | None, float | None]:
        """What `generation` says and its storage time stamp; FileNotFoundError if gone."""
        path = self._path(generation)
        data = self.store.fs.cat_file(path)
        return LeaseHolder.from_json(data), _stamp(self.store.fs.info(path))

    def _top(self) -> _Top | None:
        for _ in range(10):  # a generation deleted between listing and reading: list again
            generations = self._generations()
            if not generations:
                return None
            try:
                holder, stamp = self._read(generations[-1])
            except FileNotFoundError:
                continue
            return _Top(generations[-1], holder, stamp)
        raise RuntimeError(f"the lease in {self.directory} keeps changing while it is read")

    def _storage_now(self) -> float | None:
        """The storage's clock now: the time stamp of a file written for it (None if the
        storage keeps none)."""
        path = f"{self.directory}/clock-{self.session}"
        self.store.fs.pipe_file(path, b"")
        stamp = _stamp(self.store.fs.info(path))
        with contextlib.suppress(OSError):
            self.store.fs.rm_file(path)
        return stamp

    # ------------------------------------------------------------------ writing

    def _holder(self, released: bool = False) -> LeaseHolder:
        return LeaseHolder(
            session=self.session,
            host=socket.gethostname(),
            pid=os.getpid(),
            ttl=self.ttl,
            since=self._since,
            written=time.time(),
            released=released,
            machine=_machine(),
            uid=_uid(),
            process=_process_start_or_none(os.getpid()),
        )

    def _create(self, generation: int, payload: bytes) -> bool:
        """Create `generation` exclusively; False if it exists (made by someone else: a
        creation of ours that reached storage before its answer was lost counts as ours)."""
        path = self._path(generation)
        if self.store.local:
            os.makedirs(self.directory, exist_ok=True)
            created = _create_local(path, payload)
        else:
            try:  # the lease's later reads ask the storage, not a cache (`RetryingFileSystem`)
                self.store.fs.pipe_file(path, payload, mode="create")
                created = True
            except FileExistsError:
                created = False
        if created:
            return True
        with contextlib.suppress(FileNotFoundError):
            holder, _ = self._read(generation)
            return holder is not None and holder.session == self.session and holder.to_json() == payload
        return False

    def _highest_is(self, generation: int) -> bool:
        generations = self._generations()
        return bool(generations) and generations[-1] == generation

    def _prune(self) -> None:
        """Delete all but the newest `KEEP_GENERATIONS` generations (never the top one)."""
        generations = self._generations()
        for old in generations[:-KEEP_GENERATIONS]:
            with contextlib.suppress(OSError):
                self.store.fs.rm_file(self._path(old))

    # ------------------------------------------------------------------ taking it

    def acquire(self, wait: float = 0.0) -> StudyLease:
        """Take the lease, waiting up to `wait` seconds for another holder's to end or lapse;
        `StudyInUseError` if it did not. Starts the heartbeat that renews it."""
        wait = check_retry_seconds(wait, "wait_for_lease")
        deadline = self.clock() + wait
        seen: dict[int, float] = {}  # generation -> when first seen at the top (monotonic)
        poll = max(0.2, min(1.0, self.ttl / 10))
        announced = False
        while True:
            top = self._top()
            began, began_wall = self.clock(), time.time()
            if top is None or self._free(top, seen):
                generation = 0 if top is None else top.generation + 1
                if self._create(generation, self._holder().to_json()) and self._highest_is(generation):
                    self.generation = generation
                    self._valid_from(began, began_wall)
                    self._prune()
                    self._start_heartbeat()
                    return self
                continue  # another process was quicker: look again
            left = deadline - self.clock()
            if left <= 0:
                raise self._in_use(top)
            if not announced:
                announced = True
                holder = "a lease dagtune can't read" if top.holder is None else top.holder.describe()
                log.warning(
                    "dagtune: study %r is open in %s; waiting up to %.0f s for it (wait_for_lease)",
                    self.name,
                    holder,
                    left,
                )
            self.sleep(min(poll, left))

    def _free(self, top: _Top, seen: dict[int, float]) -> bool:
        """Whether the generation at the top may be taken over (see the module docstring)."""
        holder = top.holder
        first = seen.setdefault(top.generation, self.clock())
        ttl = holder.ttl if holder is not None else self.ttl
        if holder is not None and (holder.released or _gone(holder)):
            return True
        if top.stamp is not None:
            now = self._storage_now()
            if now is not None and now - top.stamp >= ttl + STAMP_SLACK:
                return True
        return self.clock() - first >= ttl + STAMP_SLACK

    def _in_use(self, top: _Top) -> StudyInUseError:
        holder = top.holder
        where = f"study {self.name!r} in {self.store.url}"
        hint = (
            "Stop that process, or wait for it: Study(..., wait_for_lease=SECONDS) or "
            "`dagtune run --wait-for-lease SECONDS`."
        )
        if holder is None:
            return StudyInUseError(
                f"{where} has a writer lease dagtune can't read ({self._path(top.generation)}); it is "
                f"treated as held until it is {self.ttl:g} s old. {hint}",
                None,
            )
        if holder.pid == os.getpid() and holder.machine is not None and holder.machine == _machine():
            return StudyInUseError(
                f"{where} is already open in this process ({holder.describe()}, since "
                f"{_clock(holder.since)}): close that Study first (study.close(), or open studies with "
                "`with dt.Study(...) as study:`), then open it again",
                holder,
            )
        age = None
        if top.stamp is not None:
            now = self._storage_now()
            age = None if now is None else max(0.0, now - top.stamp)
        if age is None:
            lapses = f"lapses {holder.ttl:g} s after its last renewal if that process stops"
        else:
            left = max(0.0, holder.ttl + STAMP_SLACK - age)
            lapses = (
                f"renewed {age:.0f} s ago; it lapses in {left:.0f} s (about {_clock(time.time() + left)}) "
                "unless renewed, so if that process was killed, running again after that proceeds"
            )
        return StudyInUseError(
            f"{where} is open for writing in another process: {holder.describe()}, since "
            f"{_clock(holder.since)}. Its lease (ttl {holder.ttl:g} s) was {lapses}. {hint}",
            holder,
        )

    # ------------------------------------------------------------------ keeping it

    def ensure(self) -> None:
        """Return if this session holds the lease and may write now; renew it first if its
        validity ran out (e.g. after an outage); `StudyLeaseLostError` if another process took it."""
        if self.lost is not None:
            raise StudyLeaseLostError(self.lost)
        if self.generation is None:
            raise RuntimeError(f"the writer lease of study {self.name!r} is not held")
        if self._valid():
            return
        with self._lock:
            if self.lost is not None:
                raise StudyLeaseLostError(self.lost)
            if not self._valid():
                self._renew()

    def _valid(self) -> bool:
        return self.clock() < self.valid_until and time.time() < self.valid_until_wall

    def _valid_from(self, began: float, began_wall: float) -> None:
        self.valid_until = began + self.ttl * VALID_FRACTION
        self.valid_until_wall = began_wall + self.ttl * VALID_FRACTION

    def _renew(self, released: bool = False) -> None:
        """Create the next generation (with `released`: marked released); on success the
        lease is valid for ``2 ttl / 3`` from now, else it is lost."""
        assert self.generation is not None
        began, began_wall = self.clock(), time.time()
        generation = self.generation + 1
        if not (self._create(generation, self._holder(released).to_json()) and self._highest_is(generation)):
            top = self._top()
            holder = None if top is None else top.holder
            by = "an unreadable lease" if holder is None else holder.describe()
            self.lost = (
                f"study {self.name!r} in {self.store.url} was taken over by {by}: this session "
                f"({self.session[:12]}) had not renewed its writer lease (ttl {self.ttl:g} s) in time, "
                "e.g. because the machine slept or storage was unreachable, so it stopped writing. "
                "What it committed before is kept; the study goes on in the other process"
            )
            self._stop.set()
            raise StudyLeaseLostError(self.lost)
        self.generation = generation
        self._valid_from(began, began_wall)
        self._prune()

    def _start_heartbeat(self) -> None:
        self._stop.clear()
        self._heartbeat = threading.Thread(target=self._beat, name=f"dagtune-lease-{self.name}", daemon=True)
        self._heartbeat.start()

    def _beat(self) -> None:
        while not self._stop.wait(self.ttl * RENEW_FRACTION):
            try:
                with self._lock:
                    if self._stop.is_set() or self.lost is not None:
                        return
                    self._renew()
            except StudyLeaseLostError as lost:
                log.error("dagtune: %s", lost)
                return
            except Exception as error:  # storage trouble: the next beat, or `ensure`, tries again
                log.warning("dagtune: renewing the writer lease of study %r failed: %r", self.name, error)

    def release(self) -> None:
        """Stop renewing and mark the lease released, so the next session takes it at once
        (nothing is written if it was lost or never held)."""
        self._stop.set()
        if self._heartbeat is not None and self._heartbeat is not threading.current_thread():
            self._heartbeat.join(timeout=self.ttl)
        with self._lock:
            if self.generation is None or self.lost is not None:
                return
            try:
                self._renew(released=True)
            except StudyLeaseLostError:
                return
            finally:
                self.generation = None if self.lost is None else self.generation
                self.valid_until = self.valid_until_wall = -math.inf


def _process_start_or_none(pid: int) -> str | None:
    try:
        return _process_start(pid)
    except OSError:
        return None


def _create_local(path: str, payload: bytes) -> bool:
    """Create `path` with `payload` atomically and exclusively on a local disk: written
    under a temporary name, then hard-linked into place (fails if `path` exists)."""
    tmp = f"{path}.tmp-{uuid.uuid4().hex}"
    try:
        with open(tmp, "wb") as file:
            file.write(payload)
            file.flush()
            os.fsync(file.fileno())
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
        except OSError as error:
            if error.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV):
                raise
            # no hard links here: an exclusive open, whose content follows at once
            try:
                descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                return False
            with os.fdopen(descriptor, "wb") as file:
                file.write(payload)
                file.flush()
                os.fsync(file.fileno())
        return True
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def writer_status(store: CheckpointStore, name: str) -> str | None:
    """Who writes study `name` now, as a line for views (``dagtune status``): its holder and
    when it renewed its lease, or that it was closed or its holder stopped without closing;
    None if the study never had a lease. The age is measured against this machine's clock,
    so it is approximate. Reading writes nothing."""
    top = StudyLease(store, name, session="0" * 32)._top()
    if top is None:
        return None
    holder = top.holder
    if holder is None:
        return f"unknown (its lease {top.generation:012d}.json is not one dagtune wrote)"
    if holder.released:
        return f"none (last closed by {holder.describe()})"
    age = None if top.stamp is None else max(0.0, time.time() - top.stamp)
    if age is not None and age > holder.ttl + STAMP_SLACK:
        return (
            f"none (the lease of {holder.describe()} lapsed {age - holder.ttl:.0f} s ago: that process "
            "stopped without closing the study)"
        )
    return f"open in {holder.describe()}" + ("" if age is None else f", lease renewed {age:.0f} s ago")
