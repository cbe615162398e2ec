"""The checkpoint store: write-once training states on any fsspec filesystem.

A checkpoint is the state after ``step`` steps at point ``(node, step)`` of the search plan of
one model identity, so its address is made of ids and a step number only; no user text ever
enters a path::

    {root}/{identity}/checkpoints/{node}/{step:09d}/state-<sha256[:16]>.pt
    {root}/{identity}/checkpoints/{node}/{step:09d}/COMMIT

The state is serialized with ``torch.save`` and read back with
``torch.load(weights_only=True)``, which never unpickles arbitrary Python objects. A
checkpoint exists once its ``COMMIT`` marker does: the data file (named by its content hash)
is written completely first, the marker (JSON: format, data file, size, sha256) last and
exclusively, so a reader never sees a committed marker pointing to a missing or partial file,
and when two workers save the same point the first marker wins and the second writer yields
to it. Every load checks size and checksum. Deleting removes the marker first.

Atomicity comes from the filesystem: on a local disk files are written under a temporary
name, both fsynced (at once, on two threads: the marker names the data file by its hash),
then the data file renamed and the marker hard-linked into place, which fails if it exists,
so a marker is visible only once both files are durable; object
stores (S3, GCS, memory) make a whole object visible at once, and the marker is written with
fsspec's exclusive ``mode="create"`` (``If-None-Match`` on S3).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import errno
import functools
import hashlib
import io
import json
import math
import mmap
import os
import re
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

from dagtune.errors import DagtuneError, TrainerCheckError
from dagtune.records import CheckpointInfo
from dagtune.storage_retry import (
    DEFAULT_RETRY_SECONDS,
    RetryingFileSystem,
    StorageRetry,
    check_retry_seconds,
    single_attempt_options,
)
from dagtune.validation import check_int, is_int

__all__ = ["CheckpointError", "CheckpointInfo", "CheckpointStore", "UnsavableStateError", "process_token"]

FORMAT_VERSION = 1
MARKER = "COMMIT"

_ID = re.compile(r"^[0-9a-f]{8,64}$")
_DATA_FILE = re.compile(r"^state-[0-9a-f]{16}\.pt$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_STEP_DIR = re.compile(r"^[0-9]{9,}$")
_LOCAL_PROTOCOLS = ("file", "local")
_PROCESS = uuid.uuid4().hex  # this process, wherever it runs


def process_token() -> str:
    """An id of this process, unique across machines: two copies of a store with the same
    token share the process's memory."""
    return _PROCESS


class UnsavableStateError(TrainerCheckError, TypeError):
    """A trainer's state holds what ``torch.load(weights_only=True)`` can't read back (a numpy
    array, an object): the trainer's fault, not the storage's, and saving again fails again."""


class CheckpointError(DagtuneError):
    """A checkpoint that cannot be trusted: missing commit marker or data file, wrong size or
    checksum, unreadable contents. The message names the path and what is wrong."""


def _check_id(owner: str, value: Any) -> str:
    if not isinstance(value, str) or not _ID.match(value):
        raise ValueError(f"checkpoint {owner} must be 8 to 64 lowercase hex digits, got {value!r}")
    return value


def _check_step(value: Any) -> int:
    return check_int("checkpoint step", value, minimum=1)


class CheckpointStore:
    """Checkpoints of every model identity under one fsspec URL.

    `url` is a local directory (a plain path, made absolute here so that a copy shipped to a
    Dask worker means the same place) or any fsspec URL (``memory://runs``,
    ``s3://bucket/runs``); `storage_options` go to the filesystem (credentials, endpoint).
    The store pickles as its URL and options and opens the filesystem lazily, in the process
    that uses it. ``memory://`` storage is the memory of one process (`process_local`): a copy
    of such a store in another process refuses to open rather than use an empty memory of its
    own.

    On storage other than a local disk every operation is retried through outages of up to
    `retry_seconds` (`dagtune.storage_retry`; the filesystem is a `RetryingFileSystem`), in
    whatever process uses the store, Dask workers included.
    """

    def __init__(
        self,
        url: str | os.PathLike,
        storage_options: Mapping[str, Any] | None = None,
        *,
        retry_seconds: float = DEFAULT_RETRY_SECONDS,
    ):
        url = os.fspath(url)
        if not isinstance(url, str) or not url:
            raise ValueError(f"CheckpointStore needs a directory or fsspec URL, got {url!r}")
        if fsspec.utils.get_protocol(url) in _LOCAL_PROTOCOLS:
            url = LocalFileSystem._strip_protocol(url)  # absolute, posix
        self.url = url
        self.storage_options = dict(storage_options or {})
        self.retry_seconds = check_retry_seconds(retry_seconds)
        self._fs: fsspec.AbstractFileSystem | None = None
        self._root = ""
        self._process = _PROCESS  # where it was made

    def __repr__(self) -> str:  # storage options may hold credentials: never show them
        return f"CheckpointStore({self.url!r})"

    def __getstate__(self) -> dict:
        return {
            "url": self.url,
            "storage_options": self.storage_options,
            "process": self._process,
            "retry_seconds": self.retry_seconds,
        }

    def __setstate__(self, state: dict) -> None:
        self.url = state["url"]
        self.storage_options = state["storage_options"]
        self.retry_seconds = state.get("retry_seconds", DEFAULT_RETRY_SECONDS)
        self._process = state.get("process", _PROCESS)
        self._fs, self._root = None, ""

    @property
    def process_local(self) -> bool:
        """Whether only the process that made the store sees the storage (fsspec's
        ``memory://``): Dask workers in other processes can't share its checkpoints."""
        return fsspec.utils.get_protocol(self.url) == "memory"

    @property
    def fs(self) -> fsspec.AbstractFileSystem:
        """The filesystem, opened on first use (retrying through outages unless local)."""
        if self._fs is None:
            if self.process_local and self._process != _PROCESS:
                raise ValueError(
                    f"storage {self.url!r} is the memory of the process that made this store, not of "
                    "this one: its checkpoints can't be shared here (use a directory or an object store)"
                )
            retried = self.retry_seconds > 0  # then by dagtune alone (`single_attempt_options`)
            options = (
                single_attempt_options(self.url, self.storage_options) if retried else self.storage_options
            )
            fs, root = fsspec.core.url_to_fs(self.url, **options)
            if not isinstance(fs, LocalFileSystem):
                fs = RetryingFileSystem(fs, StorageRetry(self.url, self.retry_seconds))
            self._fs, self._root = fs, root.rstrip("/")
        return self._fs

    def make_root(self, wait: float) -> None:
        """Make the storage root, waiting at most `wait` seconds (or the store's retry bound,
        if shorter) for storage that can't be reached: a first contact, where an unreachable
        endpoint is more often a wrong one than an outage."""
        fs = self.fs
        if isinstance(fs, RetryingFileSystem):  # the same filesystem, with the shorter bound
            fs = RetryingFileSystem(fs.fs, StorageRetry(self.url, min(wait, self.retry_seconds)))
        fs.makedirs(self._root, exist_ok=True)

    @property
    def root(self) -> str:
        """The storage root as a path of `fs` (no protocol), for other files kept beside the
        checkpoints (search plan journals, study records)."""
        self.fs  # noqa: B018 - opens the filesystem, which sets the root
        return self._root

    @property
    def local(self) -> bool:
        """Whether the storage is a local disk (written with os calls, never retried)."""
        return isinstance(self.fs, LocalFileSystem)

    def directory(self, identity: str, node: str, step: int) -> str:
        """Where the checkpoint at ``(node, step)`` of `identity` lives (ids are checked)."""
        _check_id("identity", identity)
        _check_id("node", node)
        _check_step(step)
        self.fs  # noqa: B018 - opens the filesystem, which sets the root
        return f"{self._root}/{identity}/checkpoints/{node}/{step:09d}"

    # ------------------------------------------------------------------ reading

    def info(self, identity: str, node: str, step: int) -> CheckpointInfo | None:
        """Size and sha256 of the committed checkpoint, or None if there is none."""
        marker = self._read_marker(self.directory(identity, node, step))
        return None if marker is None else CheckpointInfo(marker["nbytes"], marker["sha256"])

    def load(self, identity: str, node: str, step: int, map_location: Any = None) -> dict:
        """The state saved at ``(node, step)``, verified against its commit marker.

        `map_location` goes to ``torch.load`` (e.g. ``"cpu"`` to load a GPU-saved state on a
        machine without that GPU). Raises `CheckpointError` if the checkpoint is missing,
        truncated, corrupted or holds anything ``torch.load(weights_only=True)`` refuses.
        """
        directory = self.directory(identity, node, step)
        marker = self._read_marker(directory)
        if marker is None:
            raise CheckpointError(f"no committed checkpoint at {directory}: the {MARKER} marker is missing")
        path = f"{directory}/{marker['file']}"
        if self.local:
            return _load_local(path, marker, map_location)
        # a retrying filesystem gives a large read the time its size needs (`dagtune.storage_retry`)
        sized = {"expected_bytes": marker["nbytes"]} if isinstance(self.fs, RetryingFileSystem) else {}
        try:
            data = self.fs.cat_file(path, **sized)  # one read: the bytes are hashed and loaded from it
        except FileNotFoundError:
            raise CheckpointError(f"{path}: data file missing, though {MARKER} names it") from None
        _check_size(path, len(data), marker)
        # hashed on the hash thread while torch reads the same bytes; what was loaded is given
        # back only if the hash matches
        digest = _Sha256()
        with digest.meanwhile(data):
            state, failure = _torch_load(io.BytesIO(data), map_location)
        return _verified(path, marker, digest.hexdigest(), state, failure)

    def points(self, identity: str) -> Iterator[tuple[str, int, CheckpointInfo]]:
        """Every committed checkpoint of `identity` as ``(node, step, info)``, in node and step
        order (e.g. to rebuild a search plan's checkpoints, or to collect garbage)."""
        _check_id("identity", identity)
        self.fs  # noqa: B018 - opens the filesystem, which sets the root
        return self._points(f"{self._root}/{identity}/checkpoints")

    def steps(self, identity: str, node: str) -> list[int]:
        """The steps of `node` that have a checkpoint directory, committed or not (`info`
        tells), ascending: one listing, for a task to find the checkpoints its path saved
        where no plan said (`PathTask.checkpoint_interval`)."""
        base = self.directory(identity, node, 1).rsplit("/", 1)[0]
        self.fs.invalidate_cache(base)
        try:
            names = self.fs.ls(base, detail=False)
        except FileNotFoundError:
            return []
        steps = (name.rstrip("/").rsplit("/", 1)[-1] for name in names)
        return sorted(int(step) for step in steps if _STEP_DIR.match(step) and int(step) > 0)

    def _points(self, base: str) -> Iterator[tuple[str, int, CheckpointInfo]]:
        self.fs.invalidate_cache(base)
        try:
            paths = self.fs.find(base)
        except FileNotFoundError:
            return
        found = []
        for path in paths:
            parts = path.rstrip("/").split("/")
            if len(parts) < 4 or parts[-4] != "checkpoints" or parts[-1] != MARKER:
                continue
            node, step = parts[-3], parts[-2]
            if _ID.match(node) and _STEP_DIR.match(step) and int(step) > 0:
                found.append((node, int(step)))
        for node, step in sorted(found):
            marker = self._read_marker(f"{base}/{node}/{step:09d}")
            if marker is not None:  # deleted meanwhile
                yield node, step, CheckpointInfo(marker["nbytes"], marker["sha256"])

    def sweep(self, identity: str, keep: set[tuple[str, int]], older_than: float) -> list[tuple[str, int]]:
        """Delete checkpoint directories of `identity` that are not in `keep` and whose newest
        file is older than `older_than` seconds: checkpoints no search plan knows (committed
        just before a coordinator died, or dropped from the plan but not deleted) and data
        files whose commit never happened. Returns the points deleted."""
        _check_id("identity", identity)
        self.fs  # noqa: B018 - opens the filesystem, which sets the root
        base = f"{self._root}/{identity}/checkpoints"
        self.fs.invalidate_cache(base)
        try:
            found = self.fs.find(base, detail=True)
        except FileNotFoundError:
            return []
        newest: dict[tuple[str, int], float] = {}
        for path, details in found.items():
            parts = path.rstrip("/").split("/")
            if len(parts) < 4 or parts[-4] != "checkpoints":
                continue
            node, step = parts[-3], parts[-2]
            if not (_ID.match(node) and _STEP_DIR.match(step) and int(step) > 0):
                continue
            point = (node, int(step))
            newest[point] = max(newest.get(point, -math.inf), _modified(details))
        cutoff = time.time() - older_than
        swept = [p for p, modified in sorted(newest.items()) if p not in keep and modified < cutoff]
        for node, step in swept:
            self.delete(identity, node, step)
        return swept

    def _read_marker(self, directory: str) -> dict | None:
        path = f"{directory}/{MARKER}"
        try:
            raw = self.fs.cat_file(path)
        except FileNotFoundError:
            return None
        try:
            marker = json.loads(raw)
        except ValueError as error:
            raise CheckpointError(f"{path}: commit marker is not valid JSON ({error})") from None
        if not isinstance(marker, dict) or marker.get("format") != FORMAT_VERSION:
            raise CheckpointError(f"{path}: not a format-{FORMAT_VERSION} commit marker: {marker!r}")
        name, nbytes, sha = marker.get("file"), marker.get("nbytes"), marker.get("sha256")
        if (
            not isinstance(name, str)
            or not _DATA_FILE.match(name)
            or not is_int(nbytes)
            or nbytes < 0
            or not isinstance(sha, str)
            or not _SHA256.match(sha)
        ):
            raise CheckpointError(f"{path}: malformed commit marker: {marker!r}")
        return marker

    # ------------------------------------------------------------------ writing

    def save(self, identity: str, node: str, step: int, state: dict) -> CheckpointInfo:
        """Save `state` at ``(node, step)`` unless a checkpoint is committed there already, in
        which case nothing is written and the existing checkpoint's info is returned.

        Raises TypeError if `state` is not a dict or holds an object that
        ``torch.load(weights_only=True)`` would refuse (the message names where).
        """
        directory = self.directory(identity, node, step)
        # on a local disk a directory made just now holds no marker: nothing to read
        fresh = self.local and _make_directory(directory)
        existing = None if fresh else self._read_marker(directory)
        if existing is not None:
            return CheckpointInfo(existing["nbytes"], existing["sha256"])
        checked = _checked(state)  # refused before anything is written
        if self.local:
            return self._save_local(directory, state, checked)
        buffer = io.BytesIO()
        writer = _HashingWriter(buffer)
        _save_into(state, checked, writer)
        sha, nbytes = writer.hexdigest(), writer.nbytes
        name = f"state-{sha[:16]}.pt"
        self.fs.makedirs(directory, exist_ok=True)
        # getvalue shares torch.save's buffer (no copy); the object appears whole at once
        self.fs.pipe_file(f"{directory}/{name}", buffer.getvalue())
        payload = _marker_payload(name, nbytes, sha)
        return self._commit(
            directory,
            name,
            CheckpointInfo(nbytes, sha),
            lambda: self._create_marker(f"{directory}/{MARKER}", payload),
        )

    def _commit(
        self, directory: str, name: str, info: CheckpointInfo, create: Callable[[], bool]
    ) -> CheckpointInfo:
        """Commit the data file `name` (of `info`) in `directory` by `create`, which makes the
        marker unless there is one and says whether it did. When another writer committed
        first, yield to it; a marker deleted meanwhile is tried again."""
        for _ in range(3):
            if create():
                return info
            winner = self._read_marker(directory)
            if winner is not None:  # another writer committed first: yield to it
                if winner["file"] != name:
                    self._remove(f"{directory}/{name}")
                return CheckpointInfo(winner["nbytes"], winner["sha256"])
        raise CheckpointError(
            f"{directory}: could not commit; the checkpoint is being saved and deleted concurrently"
        )

    def _save_local(self, directory: str, state: dict, checked: io.BytesIO | None) -> CheckpointInfo:
        """Save into `directory` on a local disk: torch.save streams into a temporary data
        file through a hashing writer (no copy of the bytes in memory), the marker is written
        into a temporary file of its own, both are fsynced at once (on two threads: the
        marker's names the data's hash, not its place on disk, so it need not wait), then the
        data file is renamed to its content-addressed name and the marker hard-linked into
        place, exclusively. A reader sees the marker only once both files are durable and the
        data file is in place, as when the two were synced one after the other."""
        token = uuid.uuid4().hex
        tmp, marker_tmp = f"{directory}/state.tmp-{token}", f"{directory}/{MARKER}.tmp-{token}"
        try:
            with open(tmp, "wb") as data:
                writer = _HashingWriter(data, sync_ahead=True)
                _save_into(state, checked, writer)
                data.flush()
                sha, nbytes = writer.hexdigest(), writer.nbytes
                name = f"state-{sha[:16]}.pt"
                with open(marker_tmp, "wb") as marker:
                    marker.write(_marker_payload(name, nbytes, sha))
                    marker.flush()
                    _fsync_both(data.fileno(), marker.fileno())
            path = f"{directory}/{name}"
            if not (os.path.exists(path) and os.path.getsize(path) == nbytes):
                os.replace(tmp, path)  # atomic: readers see no file or the whole file
            # else: the same content (the name is its hash), written completely by another writer
            return self._commit(
                directory, name, CheckpointInfo(nbytes, sha), lambda: _link_marker(marker_tmp, directory)
            )
        finally:
            for leftover in (tmp, marker_tmp):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(leftover)

    def _create_marker(self, path: str, payload: bytes) -> bool:
        """Write the marker (not on a local disk: `_link_marker`) if there is none; False if
        one exists already."""
        try:
            self.fs.pipe_file(path, payload, mode="create")
        except FileExistsError:
            return False
        except (TypeError, NotImplementedError):  # a filesystem without exclusive writes
            with contextlib.suppress(FileNotFoundError):
                self.fs.cat_file(path)
                return False
            self.fs.pipe_file(path, payload)
        finally:
            self.fs.invalidate_cache(path)
        return True

    def delete(self, identity: str, node: str, step: int) -> None:
        """Remove the checkpoint: the marker first (it stops being visible), then its files."""
        directory = self.directory(identity, node, step)
        self._remove(f"{directory}/{MARKER}")
        with contextlib.suppress(FileNotFoundError):
            self.fs.rm(directory, recursive=True)
        self.fs.invalidate_cache(directory)

    def _remove(self, path: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.fs.rm_file(path)
        self.fs.invalidate_cache(path)


def _modified(details: Mapping[str, Any]) -> float:
    """A file's modification time in seconds since the epoch, from fsspec's details (local:
    ``mtime``; S3: ``LastModified``; memory: ``created``); +inf if unknown, so an unknown
    age never makes a file look old enough to delete."""
    for key in ("mtime", "LastModified", "last_modified", "created"):
        value = details.get(key)
        if value is None:
            continue
        if hasattr(value, "timestamp"):
            return float(value.timestamp())
        with contextlib.suppress(TypeError, ValueError):
            return float(value)
    return math.inf


def _marker_payload(name: str, nbytes: int, sha: str) -> bytes:
    """A commit marker's contents: format, data file, size, sha256 (JSON)."""
    return json.dumps(
        {"format": FORMAT_VERSION, "file": name, "nbytes": nbytes, "sha256": sha}, sort_keys=True
    ).encode()


def _make_directory(directory: str) -> bool:
    """Make `directory` on a local disk, with its parents; whether it was made now (False:
    it existed). One mkdir where the parent exists, instead of checking each level first."""
    try:
        os.mkdir(directory)
    except FileExistsError:
        return False
    except FileNotFoundError:
        os.makedirs(os.path.dirname(directory), exist_ok=True)
        try:
            os.mkdir(directory)
        except FileExistsError:
            return False
    return True


def _fsync_both(first: int, second: int) -> None:
    """fsync two files at once: `first` on the hash thread (idle here), `second` on this one."""
    pending = _hash_thread().submit(os.fsync, first)
    try:
        os.fsync(second)
    finally:
        pending.result()


def _sync_data(fd: int) -> None:
    """Write the file's data to disk now (fdatasync where there is one, else fsync)."""
    if hasattr(os, "fdatasync"):
        os.fdatasync(fd)
    else:
        os.fsync(fd)


def _link_marker(tmp: str, directory: str) -> bool:
    """Put the written and synced marker `tmp` in place as `directory`'s marker on a local
    disk unless there is one; False if one exists already. `tmp` is left for the caller."""
    path = f"{directory}/{MARKER}"
    try:
        os.link(tmp, path)  # atomic and exclusive: fails if the marker exists
    except FileExistsError:
        return False
    except OSError as error:
        if error.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV):
            raise
        if os.path.exists(path):  # no hard links here: atomic, but only nearly exclusive
            return False
        os.replace(tmp, path)
    return True


# --------------------------------------------------------------------------- serialization


@functools.cache
def _plain_leaves() -> frozenset[type]:
    """The types torch.load(weights_only=True) always accepts; anything else is checked by loading."""
    import torch  # the checkpoints' format: reading a store's records and markers needs none

    return frozenset({bool, int, float, str, bytes, type(None), torch.Tensor, torch.nn.Parameter})


_CONTAINERS = frozenset({dict, OrderedDict, list, tuple})


def serialize_state(state: dict) -> bytes:
    """``torch.save`` of `state` into bytes, refused (TypeError) unless
    ``torch.load(weights_only=True)`` can read it back."""
    import torch  # the checkpoints' format: reading a store's records and markers needs none

    checked = _checked(state)
    if checked is not None:
        return checked.getvalue()
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getvalue()


def _save_into(state: dict, checked: io.BytesIO | None, sink: Any) -> None:
    """``torch.save`` of `state` into `sink` (a binary file-like object), given what
    `_checked` said of it."""
    if checked is None:
        import torch  # the checkpoints' format: reading a store's records and markers needs none

        torch.save(state, sink)
    else:
        sink.write(checked.getbuffer())


_REFUSAL = (
    "which torch.load(weights_only=True) refuses; a checkpoint state may hold only tensors, "
    "numbers, strings, bools, None and lists, tuples and dicts of those"
)


def _checked(state: dict) -> io.BytesIO | None:
    """Refuse (TypeError) a `state` that ``torch.load(weights_only=True)`` can't read back.
    None for a state of plain leaves and containers (torch.save may stream it wherever it
    goes); a state holding anything else is saved into memory and loaded back there to let
    torch decide, and that saved copy is returned."""
    if not isinstance(state, dict):
        raise UnsavableStateError(f"a checkpoint state must be a dict, got {type(state).__qualname__}")
    unusual = _first_unusual(state, "state")
    if unusual is None:
        return None
    where, kind = unusual[0], unusual[1].__qualname__
    fix = _conversion(unusual[1])
    import torch  # the checkpoints' format: reading a store's records and markers needs none

    buffer = io.BytesIO()
    try:
        torch.save(state, buffer)
    except Exception as error:
        raise UnsavableStateError(
            f"{where} is of type {kind}, {_REFUSAL} (torch.save: {_short(error)})"
        ) from error
    buffer.seek(0)
    try:
        torch.load(buffer, weights_only=True)
    except Exception as error:
        raise UnsavableStateError(f"{where} is of type {kind}, {_REFUSAL}: {fix} ({_short(error)})") from None
    return buffer


def _conversion(kind: type) -> str:
    """How to put a value of type `kind` into a checkpoint state instead (for the refusal)."""
    if kind.__module__.split(".")[0] == "numpy":
        if kind.__name__ == "ndarray":
            return "save torch.from_numpy(array) or array.tolist() instead"
        if kind.__name__ == "Generator":
            return "save generator.bit_generator.state (a dict) and set it back in load_state_dict()"
        return "save value.item() (a python number) instead"
    return "save what it holds (its state_dict(), plain values) and build it again in load_state_dict()"


#: a chunk this large is hashed on the hash thread while it is written (or read) elsewhere;
#: a smaller one is hashed at once (a hand-over would cost more than the hash)
_OVERLAP_BYTES = 1 << 20

#: at least this many bytes written and not yet synced are synced while a large chunk is
#: hashed (`_HashingWriter`): enough that the sync's fixed cost is small beside its data's
_SYNC_AHEAD_BYTES = 8 << 20

_POOL: tuple[int, concurrent.futures.ThreadPoolExecutor] | None = None  # (pid, the hash thread)
_POOL_LOCK = threading.Lock()


def _hash_thread() -> concurrent.futures.ThreadPoolExecutor:
    """This process's hash thread (hashlib releases the interpreter lock on large inputs, so
    it runs beside the I/O or torch.load of the same bytes); made again in a forked child."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None or _POOL[0] != os.getpid():
            _POOL = (os.getpid(), concurrent.futures.ThreadPoolExecutor(1, "dagtune-checkpoint-hash"))
        return _POOL[1]


class _Sha256:
    """A sha256 and the byte count of what it hashed, fed in order; a large input is hashed
    on the hash thread `meanwhile` the caller does something else with the same bytes."""

    def __init__(self) -> None:
        self._sha = hashlib.sha256()
        self.nbytes = 0

    @contextlib.contextmanager
    def meanwhile(self, data: bytes | memoryview | mmap.mmap) -> Iterator[None]:
        """Hash `data` while the ``with`` block runs; it is hashed when the block is left."""
        size = len(data) if not isinstance(data, memoryview) else data.nbytes
        if size < _OVERLAP_BYTES:
            self.update(data)
            yield
            return
        self.nbytes += size
        pending = _hash_thread().submit(self._sha.update, data)
        try:
            yield
        finally:
            pending.result()

    def update(self, data: bytes | memoryview | mmap.mmap) -> None:
        """Hash `data` at once (for an input under `_OVERLAP_BYTES`: a hand-over to the hash
        thread, or a context manager per chunk of torch.save's dozens, costs more)."""
        self.nbytes += data.nbytes if isinstance(data, memoryview) else len(data)
        self._sha.update(data)

    def hexdigest(self) -> str:
        return self._sha.hexdigest()


class _HashingWriter:
    """A binary file-like object that hashes each chunk on its way into `sink` (a file or a
    BytesIO): what ``torch.save`` writes is hashed as it is written, with no copy.

    With `sync_ahead` (`sink` a file on a local disk, to be fsynced once written) the writer
    also syncs what it wrote so far while the hash thread hashes a large chunk, once at least
    `_SYNC_AHEAD_BYTES` are unsynced: the disk writes while the CPU hashes, and the final
    fsync has only the rest to wait for (a 100 MB state: about 40 ms less here)."""

    def __init__(self, sink: Any, *, sync_ahead: bool = False):
        self.sink = sink
        self.digest = _Sha256()
        self.sync_ahead = sync_ahead
        self._synced = 0  # bytes of the sink already on disk

    def write(self, data: bytes | memoryview) -> int:
        view = memoryview(data)
        if view.nbytes < _OVERLAP_BYTES:  # torch.save writes many tiny records: no context each
            self.digest.update(view)
            self.sink.write(view)
        else:
            with self.digest.meanwhile(view):
                self.sink.write(view)
                if self.sync_ahead and self.digest.nbytes - self._synced >= _SYNC_AHEAD_BYTES:
                    self.sink.flush()
                    _sync_data(self.sink.fileno())
                    self._synced = self.digest.nbytes
        return view.nbytes

    def flush(self) -> None:
        self.sink.flush()

    @property
    def nbytes(self) -> int:
        return self.digest.nbytes

    def hexdigest(self) -> str:
        return self.digest.hexdigest()


def _load_local(path: str, marker: Mapping[str, Any], map_location: Any) -> dict:
    """Load the data file at `path` on a local disk: torch.load reads it from the open file
    (no copy of its bytes in memory) while the hash thread hashes the same file, mapped
    into memory; the state is given back only if size and hash match the marker."""
    try:
        file = open(path, "rb")  # noqa: SIM115 - closed below, after the mapping
    except FileNotFoundError:
        raise CheckpointError(f"{path}: data file missing, though {MARKER} names it") from None
    with file:
        _check_size(path, os.fstat(file.fileno()).st_size, marker)
        digest = _Sha256()
        if marker["nbytes"] == 0:  # nothing to map; torch.load says what is wrong
            state, failure = _torch_load(file, map_location)
        else:
            with (
                mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as mapped,
                digest.meanwhile(mapped),
            ):
                state, failure = _torch_load(file, map_location)
        return _verified(path, marker, digest.hexdigest(), state, failure)


def _check_size(path: str, nbytes: int, marker: Mapping[str, Any]) -> None:
    if nbytes != marker["nbytes"]:
        raise CheckpointError(
            f"{path}: has {nbytes} bytes, the {MARKER} marker says {marker['nbytes']} "
            "(truncated or overwritten)"
        )


def _torch_load(source: Any, map_location: Any) -> tuple[Any, Exception | None]:
    """``torch.load(weights_only=True)`` of `source`, or its failure (reported only once the
    hash is known: a corrupted file is called corrupted, not unloadable)."""
    import torch  # the checkpoints' format: reading a store's records and markers needs none

    try:
        return torch.load(source, weights_only=True, map_location=map_location), None
    except Exception as error:
        return None, error


def _verified(path: str, marker: Mapping[str, Any], sha: str, state: Any, failure: Exception | None) -> dict:
    """`state`, loaded from `path`, if its bytes hashed to the marker's sha256 and it loaded."""
    if sha != marker["sha256"]:
        raise CheckpointError(
            f"{path}: sha256 is {sha}, the {MARKER} marker says {marker['sha256']} (corrupted)"
        )
    if failure is not None:
        raise CheckpointError(
            f"{path}: cannot be loaded with weights_only=True: {_short(failure)}"
        ) from failure
    return state


_GLOBAL = re.compile(r"GLOBAL ([\w.]+)")


def _short(error: Exception) -> str:
    """The telling part of an error: for torch's weights_only refusal (a page of advice) the
    global it refused and its reason, else the error's first line."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    reason = next((line for line in lines if _GLOBAL.search(line)), None)
    if reason is not None:
        return f"refused global {_GLOBAL.search(reason)[1]} ({reason})"
    reason = next((line for line in lines if "WeightsUnpickler error" in line), None)
    return reason or (lines[0] if lines else type(error).__name__)


def _first_unusual(value: Any, where: str) -> tuple[str, type] | None:
    """The first part of `value` that is not a plain leaf or container, as (where, type).
    Plain leaves are passed over where they are met, without making their place's name (a
    state's RNG holds hundreds of ints)."""
    kind = type(value)
    if kind in _plain_leaves():
        return None
    if kind not in _CONTAINERS:
        return where, kind
    if kind in (list, tuple):
        parts = (
            (lambda i=i: f"{where}[{i}]", item)
            for i, item in enumerate(value)
            if type(item) not in _plain_leaves()
        )
    else:
        parts = (
            pair
            for key, item in value.items()
            for pair in (
                (lambda key=key: f"{where} key {key!r}", key),
                (lambda key=key: f"{where}[{key!r}]", item),
            )
            if type(pair[1]) not in _plain_leaves()
        )
    for place, part in parts:
        found = _first_unusual(part, place())
        if found is not None:
            return found
    return None
