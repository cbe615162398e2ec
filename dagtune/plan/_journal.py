"""Append-only journals on any fsspec filesystem, one per writer, merged on read.

A journal is a directory of JSON records. Every writer (one per coordinator session) owns
its own files, so concurrent writers never touch the same bytes and need no lock:

- on a local disk a writer appends to ``{writer}.jsonl`` and fsyncs after each batch (the
  file held open between batches, and opened again by its name if the file of that name is
  no longer the one held: removed or replaced underneath);
- object stores cannot append, so a writer puts numbered segments
  ``{writer}-{seq:08d}.jsonl``, one per batch (never rewriting an earlier one).

Records are committed in groups (`GroupCommit`): a record is written, and fsynced on a local
disk, at most `COMMIT_SECONDS` (50 ms) after it was appended, together with every record
appended meanwhile, by a background thread (one per `GroupCommit`, kept while groups keep
coming); a caller that needs it on disk before it goes on asks with ``sync=True`` or
`flush`. So a burst of events costs one write and one fsync
per journal per 50 ms rather than one per event, a killed writer loses at most the records
of its last 50 ms, and the journal is never rewritten. Journals that share a `GroupCommit`
are written in the order they joined it, in every commit, so a record of a later journal is
never on disk before a record of an earlier one appended before it (a study's trial records
never run ahead of the search plan events they need).

A journal may have a *header* (e.g. the model identity of a search plan): every file starts
with a ``{"h": header}`` line, and a reader that knows the header skips (and reports) a whole
file that carries another one or none, such as a file copied from another model's plan.

Each line checks itself: ``dj1 <crc32 of the JSON, 8 hex digits> <JSON>``. A line that
does not start with the format tag, fails its checksum, is not a JSON object or has a time
stamp that is not a finite number is reported as ``file:line`` with the reason (in
`incidents`) and skipped, never guessed at; so is a line whose fields are not what dagtune
writes (`dagtune.records` checks them). Readers
merge all writers' records by their time stamp, keeping each writer's own order, and can
`read_new` later to pick up what other writers appended since.

`PlanJournal` persists a `SearchPlan` this way: it loads every writer's events (applying an
event whose node is not known yet once the node appears), appends each new event of the
plan, and brings in other writers' events on `refresh`.
"""

from __future__ import annotations

import contextlib
import heapq
import json
import logging
import math
import os
import re
import threading
import time
import uuid
import weakref
import zlib
from collections.abc import Callable
from dataclasses import dataclass

import fsspec
from fsspec.implementations.local import LocalFileSystem

from dagtune.plan._plan import SearchPlan
from dagtune.records import RecordError, parse_plan_event
from dagtune.validation import check_number, is_number

__all__ = [
    "COMMIT_SECONDS",
    "Entry",
    "GroupCommit",
    "Journal",
    "PlanJournal",
    "commit_seconds",
    "plan_header",
    "records_header",
]

log = logging.getLogger("dagtune")

TAG = "dj1"
#: at most this long between appending a record and its commit (write, and fsync on a local disk)
COMMIT_SECONDS = 0.05
#: an environment variable that sets another bound, in seconds (0: commit at every append)
COMMIT_VARIABLE = "DAGTUNE_COMMIT_SECONDS"
_FILE = re.compile(r"^(?P<writer>[0-9a-f]{32})(?:-(?P<seq>[0-9]{8}))?\.jsonl$")


def plan_header(identity: str) -> dict:
    """The header of the search plan journal of model `identity`."""
    return {"journal": "plan", "identity": identity}


def records_header(name: str) -> dict:
    """The header of study `name`'s trial records (`dagtune.durable` keeps them)."""
    return {"journal": "study", "name": name}


@dataclass(frozen=True)
class Entry:
    """One record read back, with where it came from (for reports)."""

    record: dict
    where: str  # "file:line"
    writer: str


#: encodes a record's JSON (made once: `json.dumps` with options makes an encoder per call)
_ENCODER = json.JSONEncoder(sort_keys=True, separators=(",", ":"))
#: the same encoding by the C encoder made once (`JSONEncoder.encode` makes one per call,
#: a third of a record's encoding); without the circular-reference check: a record is a
#: tree of plain values. None where the C accelerator is missing.
_C_ENCODE = (
    None
    if json.encoder.c_make_encoder is None
    else json.encoder.c_make_encoder(
        None, _ENCODER.default, json.encoder.encode_basestring_ascii, None, ":", ",", True, False, True
    )
)
_TAG = TAG.encode()


def encode_line(record: dict) -> bytes:
    """One self-checking journal line for `record`."""
    body = ("".join(_C_ENCODE(record, 0)) if _C_ENCODE is not None else _ENCODER.encode(record)).encode()
    return b"%s %08x %s\n" % (_TAG, zlib.crc32(body), body)


def decode_line(line: bytes) -> dict:
    """The record of one line; ValueError says what is wrong with it."""
    parts = line.split(b" ", 2)
    if len(parts) != 3 or parts[0] != TAG.encode():
        raise ValueError(f"not a dagtune journal line (expected {TAG!r} format): {line[:60]!r}")
    checksum, body = parts[1], parts[2]
    try:
        expected = int(checksum, 16)
    except ValueError:
        raise ValueError(f"malformed checksum {checksum[:16]!r}") from None
    if len(checksum) != 8 or zlib.crc32(body) != expected:
        raise ValueError("checksum mismatch (corrupted line)")
    try:
        record = json.loads(body)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None
    if not isinstance(record, dict):
        raise ValueError("not a JSON object")
    stamp = record.get("t", 0.0)
    if not is_number(stamp) or not math.isfinite(stamp):
        raise ValueError(f"time stamp 't' must be a finite number, got {str(stamp)[:40]!r}")
    return record


def commit_seconds(value: float | str | None = None) -> float:
    """The commit bound: `value`, else the environment's ``DAGTUNE_COMMIT_SECONDS``, else
    `COMMIT_SECONDS`; a ValueError names it unless it is a finite number of seconds >= 0."""
    source = "commit_seconds"
    if value is None:
        value, source = os.environ.get(COMMIT_VARIABLE), COMMIT_VARIABLE
    if value is None:
        return COMMIT_SECONDS
    if isinstance(value, str):  # the environment's text: a number, or refused as it is
        with contextlib.suppress(ValueError):
            value = float(value)
    return float(check_number(source, value, minimum=0, expected="a finite number of seconds >= 0"))


class GroupCommit:
    """Commits what one or more journals buffered, together: at most `delay` seconds after
    the first record of a group was appended (by one background committer thread, started
    with the first group and kept while groups keep coming: it ends after `IDLE_SECONDS`
    without one, or on `close`), or at once on `commit`. The journals are written in the
    order they joined, so ordering between them holds on disk. `commits` counts the groups
    written and `failures` the background commits that failed; a failed write keeps its
    records for the next commit and its error is raised to the next caller that appends (a
    commit tries the write again instead: see `commit`)."""

    #: a committer with nothing to commit for this long ends (the next group starts another)
    IDLE_SECONDS = 1.0

    def __init__(self, delay: float | None = None):
        self.delay = commit_seconds(delay)
        self.journals: list[Journal] = []
        self.commits = 0
        self.failures = 0
        self._lock = threading.Lock()  # the journals' buffers and the schedule
        self._writing = threading.Lock()  # held while a group is written: groups keep their order
        self._wake = threading.Condition(self._lock)
        self._due: float | None = None
        self._thread: threading.Thread | None = None
        self._stopping = False  # `close` asked the committer to end
        self._error: BaseException | None = None

    def join(self, journal: Journal) -> None:
        with self._lock:
            self.journals.append(journal)

    def add(self, journal: Journal, line: bytes, *, now: bool) -> None:
        """Buffer `line` of `journal`; committed within `delay`, or before returning with `now`."""
        with self._lock:
            journal._buffer.append(line)
            self._raise_failure()
            if not (now or self.delay == 0):
                if self._due is None:
                    self._due = time.monotonic() + self.delay
                    self._wake.notify()  # a waiting committer: this group is due then
                if self._thread is None:
                    self._stopping = False
                    self._thread = threading.Thread(
                        target=self._run, name="dagtune-journal-commit", daemon=True
                    )
                    self._thread.start()
                return
        self.commit()

    def commit(self) -> None:
        """Write (and fsync) every journal's buffered records now, in the journals' order.

        A failure kept from the background committer does not stop this try: its records
        are still buffered, so a write that succeeds now has written them and the failure is
        over (storage came back: closing a study after an outage saves its work); a write
        that fails raises its own error."""
        with self._writing:
            with self._lock:
                self._error = None
                self._due = None
                self._wake.notify()  # a committer waiting for this group's deadline: not due now
                batches = [(journal, journal._take()) for journal in self.journals]
            self._write(batches)

    def close(self) -> None:
        """End the committer thread (a group still due is committed first, by it, at once)
        and close the journals' files; the group stays usable: a later group starts a
        committer again and opens the files again."""
        with self._lock:
            thread, self._stopping = self._thread, True
            self._wake.notify_all()
        if thread is not None and thread is not threading.current_thread():
            thread.join()
        with self._writing:  # the journals' files held open between commits
            for journal in self.journals:
                journal.close()

    def _write(self, batches: list[tuple[Journal, list[bytes]]]) -> None:
        if not any(lines for _, lines in batches):
            return
        done = 0
        try:
            for journal, lines in batches:
                journal._write(lines)
                done += 1
        except BaseException:
            with self._lock:  # not written: first in line for the next commit
                for journal, lines in batches[done:]:
                    journal._buffer[:0] = lines
            raise
        self.commits += 1

    def _raise_failure(self) -> None:
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def _run(self) -> None:
        """The background committer: waits for each group's deadline and commits it; ends
        once nothing is due and `close` asked it to, or no group came for `IDLE_SECONDS`."""
        while True:
            with self._lock:
                idle_until = time.monotonic() + self.IDLE_SECONDS
                while True:
                    now = time.monotonic()
                    if self._due is not None:
                        if self._due <= now or self._stopping:
                            break  # commit it (a closing group does not wait for the deadline)
                        self._wake.wait(self._due - now)
                    elif self._stopping or now >= idle_until:
                        self._thread = None
                        return
                    else:
                        self._wake.wait(idle_until - now)
            try:
                self.commit()
            except Exception as error:  # kept for the next caller: records are never dropped
                log.warning("dagtune journal: a commit failed (%r); retried at the next one", error)
                with self._lock:
                    self._error, self._due = error, None
                    self.failures += 1


class Journal:
    """One directory of journal files: this process writes its own, reads everyone's.

    `fs` and `directory` locate it; `writer` is this writer's id (a fresh uuid by default);
    `header` names the journal (written at the top of every file, checked when reading; a
    reader without one accepts any header); `commit` is the `GroupCommit` that writes its
    records (its own, with the default bound, unless given). Problems found while reading
    are appended to `incidents` (and logged) as ``"path:line: reason"``. `guard`, if given, is
    called before every write and may raise to forbid it (a study's records:
    `dagtune.study_lease`); the commit that raised keeps its records and raises to its next caller.
    """

    def __init__(
        self,
        fs: fsspec.AbstractFileSystem,
        directory: str,
        *,
        writer: str | None = None,
        header: dict | None = None,
        guard: Callable[[], None] | None = None,
        commit: GroupCommit | None = None,
    ):
        self.fs = fs
        self._header = header
        #: the header line every file of this writer starts with, encoded once
        self._heading = encode_line({"h": header}) if header is not None else b""
        self.guard = guard
        self.directory = directory.rstrip("/")
        self.writer = writer or uuid.uuid4().hex
        self.incidents: list[str] = []
        self._local = isinstance(fs, LocalFileSystem)
        self._buffer: list[bytes] = []
        self._segment = 0
        self._offsets: dict[str, int] = {}  # file -> bytes consumed (and lines, for locations)
        self._seen: dict[str, int] = {}  # file -> its size when last read (a cut-short line included)
        self._lines: dict[str, int] = {}
        self._reported: set[str] = set()
        self._started = False  # this writer's local file has its header
        self._checked: set[str] = set()  # files whose header was read
        self._foreign: set[str] = set()  # files of another journal: never read
        self._written: dict[str, int] = {}  # this writer's files -> bytes written to them
        self._latest = -math.inf  # the latest time stamp of a record read
        self._open: tuple[int, tuple[int, int]] | None = None  # this writer's local file: fd, identity
        self._closer: weakref.finalize | None = None
        self._commit = commit
        if commit is not None:
            commit.join(self)

    @property
    def header(self) -> dict | None:
        """The journal's header (fixed: its line is encoded once, for every file written)."""
        return self._header

    # ------------------------------------------------------------------ writing

    @property
    def commit(self) -> GroupCommit:
        """The `GroupCommit` that writes this journal (made on the first append if none was given)."""
        if self._commit is None:
            self._commit = GroupCommit()
            self._commit.join(self)
        return self._commit

    def append(self, record: dict, *, sync: bool = False) -> None:
        """Add `record` (stamped with the time) to this writer's journal: committed with the
        records of its group within the commit bound, or before this returns with `sync`."""
        record = {**record, "t": time.time()}
        self.commit.add(self, encode_line(record), now=sync)

    def flush(self) -> None:
        """Commit now what this journal and the journals of its group buffered."""
        if self._commit is not None:
            self._commit.commit()

    def _take(self) -> list[bytes]:
        lines, self._buffer = self._buffer, []
        return lines

    def _write(self, lines: list[bytes]) -> None:
        """Write `lines`: appended and fsynced locally, a new segment elsewhere."""
        if not lines:
            return
        data = b"".join(lines)
        heading = self._heading
        if self.guard is not None:
            self.guard()
        if self._local:
            name = f"{self.writer}.jsonl"
            descriptor = self._descriptor(f"{self.directory}/{name}")
            chunk = data if self._started else heading + data
            view = memoryview(chunk)
            while view:  # a regular file takes it all at once; a short write goes on
                view = view[os.write(descriptor, view) :]
            self._started = True
            os.fsync(descriptor)
            self._written[name] = self._written.get(name, 0) + len(chunk)
        else:
            name = f"{self.writer}-{self._segment:08d}.jsonl"
            self.fs.pipe_file(f"{self.directory}/{name}", heading + data)  # a segment is a file of its own
            self.fs.invalidate_cache(self.directory)
            self._segment += 1
            self._written[name] = len(heading) + len(data)

    def _descriptor(self, path: str) -> int:
        """This writer's local file `path`, open for appending: kept open from one commit to
        the next (opening and closing it at every commit cost more than its write), and
        opened again by its path, as every commit did before, when the file at `path` is not
        the one held open (removed or replaced underneath: records never go to a file that
        no longer has that name). The identity compared is the device and inode number,
        which no other file can take while this one is open."""
        if self._open is not None:
            try:
                found = os.stat(path)
            except OSError:  # gone (or unreachable): opening it again says what is wrong
                found = None
            if found is not None and (found.st_dev, found.st_ino) == self._open[1]:
                return self._open[0]
            self.close()
        os.makedirs(self.directory, exist_ok=True)
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_BINARY", 0)
        descriptor = os.open(path, flags, 0o666)
        opened = os.fstat(descriptor)
        self._open = (descriptor, (opened.st_dev, opened.st_ino))
        self._closer = weakref.finalize(self, os.close, descriptor)  # a journal dropped unclosed
        return descriptor

    def close(self) -> None:
        """Close this writer's local file if it is held open (`GroupCommit.close` does, once
        its committer ended); a later commit opens it again."""
        if self._closer is not None:
            self._closer()  # closes the descriptor, once
        self._open = self._closer = None

    # ------------------------------------------------------------------ reading

    def covered(self) -> dict[str, int] | None:
        """What this journal's state holds, as file name -> bytes: each file read, with the
        size it had then (a cut-short last line is not read, but counted: it is the same
        bytes while the size is), and each file this writer wrote, whole. Two reads of the
        same journal that cover the same bytes fold the same records (files only grow and
        segments are written once), so a summary of a read stays true while the journal's
        files are exactly these, with these sizes (`dagtune.study_index`). None if a file
        was skipped as another journal's (its size was not kept)."""
        if self._foreign:
            return None
        covered = {path.rstrip("/").rsplit("/", 1)[-1]: size for path, size in self._seen.items()}
        covered.update(self._written)
        return covered

    def sizes(self) -> dict[str, int]:
        """Every file of this journal's directory now, as file name -> size (one listing)."""
        self.fs.invalidate_cache(self.directory)
        try:
            listed = self.fs.ls(self.directory, detail=True)
        except FileNotFoundError:
            return {}
        sizes = {}
        for info in listed:
            name = info["name"].rstrip("/").rsplit("/", 1)[-1]
            if _FILE.match(name) and info.get("type", "file") == "file":
                sizes[name] = int(info["size"])
        return sizes

    def read_new(self, *, others_only: bool = False) -> list[Entry]:
        """Records not read yet from every writer's files (or only other writers'), merged
        by time with each writer's order kept."""
        self.fs.invalidate_cache(self.directory)
        try:
            paths = sorted(self.fs.ls(self.directory, detail=False))
        except FileNotFoundError:
            return []
        per_writer: dict[str, list[Entry]] = {}
        for path in paths:
            name = path.rstrip("/").rsplit("/", 1)[-1]
            match = _FILE.match(name)
            if match is None:
                if not name.startswith(".") and ".tmp" not in name:
                    self.report(path, "not a journal file of this format; ignored")
                continue
            writer = match["writer"]
            if others_only and writer == self.writer:
                continue
            per_writer.setdefault(writer, []).extend(self._read_file(path, writer))
        # each writer's files and segments are read in order; merging keeps that order
        merged = list(heapq.merge(*per_writer.values(), key=lambda e: e.record.get("t", 0.0)))
        self._latest = max(self._latest, max((e.record.get("t", 0.0) for e in merged), default=-math.inf))
        return merged

    def read_state(self) -> dict:
        """What this journal's reading has consumed, as plain values (a copy): where each file
        was read to, what was reported, the latest time stamp read. `set_read_state` puts it
        back into a journal of the same directory (`dagtune.resume_state`), whose next
        `read_new` then reads only what was appended since."""
        return {
            "offsets": dict(self._offsets),
            "seen": dict(self._seen),
            "lines": dict(self._lines),
            "reported": set(self._reported),
            "checked": set(self._checked),
            "foreign": set(self._foreign),
            "incidents": list(self.incidents),
            "latest": self._latest,
        }

    def set_read_state(self, state: dict) -> None:
        """Continue reading where `state` (`read_state`) left off."""
        self._offsets, self._seen = dict(state["offsets"]), dict(state["seen"])
        self._lines, self._reported = dict(state["lines"]), set(state["reported"])
        self._checked, self._foreign = set(state["checked"]), set(state["foreign"])
        self.incidents, self._latest = list(state["incidents"]), float(state["latest"])

    @property
    def latest(self) -> float:
        """The latest time stamp of a record read so far (-inf before any)."""
        return self._latest

    def _read_file(self, path: str, writer: str) -> list[Entry]:
        if path in self._foreign:
            return []
        offset = self._offsets.get(path, 0)
        if not self._local and offset:
            return []  # a segment is written whole, once: already read
        try:
            data = self.fs.cat_file(path, start=offset) if offset else self.fs.cat_file(path)
        except FileNotFoundError:
            return []
        end = data.rfind(b"\n") + 1
        if end < len(data):  # a line being appended, or one a dead writer left unfinished
            line_number = self._lines.get(path, 0) + data[:end].count(b"\n") + 1
            self.report(f"{path}:{line_number}", "incomplete last line (a cut-short write); not read")
        entries = []
        number = self._lines.get(path, 0)
        for line in data[:end].splitlines():
            number += 1
            try:
                record = decode_line(line)
            except ValueError as error:
                self.report(f"{path}:{number}", str(error))
                continue
            if path not in self._checked:
                self._checked.add(path)
                if not self._belongs(path, record):
                    self._foreign.add(path)
                    return []
                if "h" in record:
                    continue
            entries.append(Entry(record, f"{path}:{number}", writer))
        self._offsets[path] = offset + end if self._local else len(data)
        self._seen[path] = offset + len(data)
        self._lines[path] = number
        return entries

    def _belongs(self, path: str, first: dict) -> bool:
        """Whether a file whose first record is `first` is part of this journal (reported
        if not)."""
        if self.header is None or first.get("h") == self.header:
            return True
        found = f"its header is {first['h']}" if "h" in first else "it has no header"
        self.report(path, f"a file of another journal ({found}, this one is {self.header}); skipped")
        return False

    def report(self, where: str, reason: str) -> None:
        """Record (and log) a problem at `where` (``path:line``), once per place."""
        if where in self._reported:
            return
        self._reported.add(where)
        self.incidents.append(f"{where}: {reason}")
        log.warning("dagtune journal: %s: %s", where, reason)


# --------------------------------------------------------------------------- the search plan


class PlanJournal:
    """Persists a `SearchPlan` in a `Journal` and merges in other writers' events.

    Events are committed in groups (`GroupCommit`: within 50 ms), in the order they
    happened, so a step's metrics are never on disk after a checkpoint event that covers
    them. A dropped checkpoint is committed before `drop_checkpoint` returns: the caller
    deletes the checkpoint next, and no process may read a plan that still has it after.
    """

    SYNC = frozenset({"drop_checkpoint"})

    def __init__(self, plan: SearchPlan, journal: Journal):
        self.plan = plan
        self.journal = journal
        self._waiting: dict[str, list[Entry]] = {}  # unknown node -> events that need it
        plan.listeners.append(self._on_event)

    def _on_event(self, event: dict) -> None:
        self.journal.append(event, sync=event["e"] in self.SYNC)

    def load(self) -> list[dict]:
        """Read every writer's events not read yet and apply them (not journaled again);
        returns the events that changed the plan."""
        return self.apply_entries(self.journal.read_new(others_only=True))

    def apply_entries(self, entries: list[Entry]) -> list[dict]:
        """Apply `entries` read from the journal (`load` reads them); the events that changed
        the plan."""
        applied: list[dict] = []
        for entry in entries:
            self._apply(entry, applied)
        for node, held in self._waiting.items():
            for entry in held:
                self.journal.report(
                    entry.where,
                    f"event refers to unknown node {node} (its node event is missing or corrupt); "
                    "held back until it appears",
                )
        return applied

    refresh = load

    @property
    def waiting(self) -> dict[str, list[Entry]]:
        """The events held back until their node appears: unknown node -> entries."""
        return self._waiting

    def _apply(self, entry: Entry, applied: list[dict]) -> None:
        try:
            parsed = parse_plan_event(entry.record)
        except RecordError as error:
            self.journal.report(entry.where, f"invalid search plan event ({error}); skipped")
            return
        needed = parsed.needs
        if needed is not None and needed not in self.plan.nodes:
            self._waiting.setdefault(needed, []).append(entry)
            return
        try:
            changed = self.plan.apply(parsed.event, emit=False, live_config=parsed.config)
        except ValueError as error:  # it does not fit the plan (e.g. a point before its node)
            self.journal.report(entry.where, f"invalid search plan event ({error}); skipped")
            return
        if changed:
            applied.append(parsed.event)
        if parsed.event["e"] == "node":
            for waiting in self._waiting.pop(parsed.event["id"], []):
                self._apply(waiting, applied)
