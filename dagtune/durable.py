"""What a study keeps in storage: the shared search plan, its own trial records, its results.

Layout under the storage URL (a directory, ``s3://bucket/prefix``, any fsspec URL)::

    {identity}/checkpoints/{node}/{step:09d}/...   checkpoints (dagtune.checkpoints)
    {identity}/plan/{writer}.jsonl                 search plan journal, one file per writer
    {identity}/plan/{writer}-{seq:08d}.jsonl       (object stores: numbered segments instead)
    studies/{name}/journal/...                     the study's trial records, same format
    studies/{name}/results.zarr                    trials and learning curves (dagtune.results)
    studies/{name}/lease/{generation}.json         the study's writer lease (dagtune.study_lease)
    studies/{name}/index.json.gz                   what the views show, as of the journals' sizes
                                                   it records (dagtune.study_index)
    studies/{name}/resume.pickle                   the journals as last folded: resuming reads it
                                                   and their tail (dagtune.resume_state)
    {identity}/leases/{writer}.json                checkpoints a live study needs (Leases)

Every study of one model identity (trainer, its arguments, seed, version) shares the plan:
what any of them trained, the next one reuses. A study's own records (one ``open`` record
per session, then ``submit`` / ``extend`` / ``end`` per trial) let the same study resume:
same name and storage. `Persistence` ties these to a study; the study calls `tick` from its
driver loop for the periodic work (flushes, picking up other writers' plan events, results).
A session writes its study's records and results only while it holds the study's writer
lease (`dagtune.study_lease`): every such write checks it first.
"""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import os
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from fsspec.implementations.local import LocalFileSystem

from dagtune.checkpoints import CheckpointStore
from dagtune.config import config_dumps
from dagtune.plan import GroupCommit, Journal, PlanJournal, SearchPlan, plan_header, records_header
from dagtune.records import (
    COMPLETED,
    OUTSIDE_THE_TRAINER,
    PENDING,
    StudyRecords,
    Trial,
    TrialState,
    is_study_name,
    parsed_configs_shared,
    read_study_records,
)
from dagtune.results import ResultsWriter, results_url
from dagtune.resume_state import Restored, due, fold_bytes, read_state, state_bytes, state_path
from dagtune.storage_retry import RetryingFileSystem, StorageRetry
from dagtune.study_lease import StudyLease

if TYPE_CHECKING:
    from dagtune.coordinator import Coordinator

__all__ = [
    "Leases",
    "Persistence",
    "index_path",
    "list_studies",
    "needed_by_stored_studies",
    "plan_header",
    "put_whole",
    "read_records",
    "records_header",
]

log = logging.getLogger("dagtune")

Point = tuple[str, int]

#: the most of a study's time that writing its lease may take (its interval grows with it)
LEASE_SHARE = 0.02


class Leases:
    """The checkpoints live studies of one model identity need, so that garbage collection by
    any study (or `dagtune gc`) never deletes them: one small JSON file per writer, renewed
    while the study lives and removed when it closes. A lease older than its ``ttl`` belongs
    to a study that died; it no longer protects anything."""

    def __init__(self, store: CheckpointStore, identity: str, writer: str, *, ttl_seconds: float = 600.0):
        self.store = store
        self.directory = f"{store.root}/{identity}/leases"
        self.path = f"{self.directory}/{writer}.json"
        self.writer = writer
        self.ttl_seconds = ttl_seconds
        self.points: frozenset[Point] | None = None
        self.renewed = -float("inf")
        self.took = 0.0  # seconds the last renewal took

    def renew(self, points: Iterable[Point]) -> None:
        """Write the lease for `points` (sorted, with the time)."""
        began = time.perf_counter()
        points = frozenset(points)
        payload = {
            "writer": self.writer,
            "written": time.time(),
            "ttl": self.ttl_seconds,
            "points": sorted(points),  # (node, step) pairs: JSON arrays, sorted as tuples twice as fast
        }
        self.store.fs.makedirs(self.directory, exist_ok=True)
        self.store.fs.pipe_file(self.path, json.dumps(payload).encode())
        self.points, self.renewed = points, time.monotonic()
        self.took = time.perf_counter() - began

    def release(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.store.fs.rm_file(self.path)
        self.points = None

    @staticmethod
    def held(store: CheckpointStore, identity: str, *, exclude: str | None = None) -> set[Point]:
        """Every point a live lease of `identity` holds (all writers but `exclude`)."""
        directory = f"{store.root}/{identity}/leases"
        store.fs.invalidate_cache(directory)
        try:
            paths = store.fs.ls(directory, detail=False)
        except FileNotFoundError:
            return set()
        now, points = time.time(), set()
        for path in paths:
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


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off while a study's journals are replayed into
    objects that all stay alive (trials, configs, plan nodes): each collection walks every
    object made so far and finds nothing to free, about 40% of the CPU of reading a
    100,000-trial study's journals (issue 24). Back on, as it was, afterwards.

    What the block made is moved to the collector's oldest generation on the way out (where
    nothing else keeps objects in its permanent one, `gc.freeze`): the young collections
    would each walk all of it once more before it got there (about 0.8 s of a 100,000-trial
    study's opening), and a full collection still looks at it, when one is due."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if gc.get_freeze_count() == 0:  # else another's frozen objects would be let go
            gc.freeze()
            gc.unfreeze()  # into the oldest generation, none of it walked
        if enabled:
            gc.enable()


def index_path(root: str, name: str) -> str:
    """Where study `name`'s read index lives under storage root `root` (`dagtune.study_index`)."""
    return f"{root}/studies/{name}/index.json.gz"


def put_whole(fs: Any, path: str, data: bytes) -> None:
    """Write `data` to `path` so that a reader sees the old file or the new one, never part
    of one: a temporary file renamed over it on a local disk (fsynced first), one put of the
    whole object elsewhere (object stores make a put visible whole)."""
    if not isinstance(fs, LocalFileSystem):
        fs.pipe_file(path, data)
        return
    directory = os.path.dirname(path)
    os.makedirs(directory, exist_ok=True)
    temporary = f"{directory}/.{os.path.basename(path)}.{uuid.uuid4().hex}.tmp"
    try:
        with open(temporary, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(temporary)


def read_records(journal: Journal) -> StudyRecords:
    """The records of `journal` not read yet, checked and folded (`dagtune.records`); the
    lines skipped are reported as the journal's incidents (``file:line: reason``)."""
    records = read_study_records((entry.record, entry.where) for entry in journal.read_new())
    for where, reason in records.skipped:
        journal.report(where, reason)
    return records


def list_studies(store: CheckpointStore) -> list[str]:
    """The names of the studies kept in `store` (directories ``studies/NAME`` with a records
    journal), sorted."""
    base = f"{store.root}/studies"
    store.fs.invalidate_cache(base)
    try:
        paths = store.fs.ls(base, detail=False)
    except FileNotFoundError:
        return []
    names = (p.rstrip("/").rsplit("/", 1)[-1] for p in paths if store.fs.isdir(f"{p.rstrip('/')}/journal"))
    return sorted(name for name in names if is_study_name(name))  # no study has another name


def needed_by_stored_studies(
    store: CheckpointStore, identity: str, plan: SearchPlan, exclude: str
) -> set[Point]:
    """Checkpoints the other studies of `identity` kept in `store` still need, read from
    their trial records: each completed trial's latest checkpoint (it may be extended) and
    the latest checkpoint before each pending trial's point (it resumes there)."""
    needed: set[Point] = set()
    for name in list_studies(store):
        if name == exclude:
            continue
        journal = Journal(store.fs, f"{store.root}/studies/{name}/journal", header=records_header(name))
        records = read_study_records((e.record, e.where) for e in journal.read_new())  # its own to report
        if not any(opened.identity == identity for opened in records.opened):
            continue
        for state in records.trials.values():
            if state.status not in (COMPLETED, PENDING):
                continue
            node = plan.locate(state.config, state.steps, salt=state.salt)
            latest = None if node is None else plan.latest_checkpoint(node, state.steps)
            if latest is not None:
                needed.add(latest)
    return needed


class Persistence:
    """The durable side of one study session (see the module docstring).

    `describe` is the study's identity record (trainer, seed, version; never credentials).
    `lease` is the study's writer lease, held (`StudyLease.acquire`): its session is the
    records journal's writer, and every write of the records and results checks it.
    `commit_seconds` bounds the time between journaling a record and its commit (default:
    ``DAGTUNE_COMMIT_SECONDS`` from the environment, else 50 ms; `dagtune.plan.GroupCommit`).
    Raises ValueError if the study `name` already exists in storage for another identity.
    """

    def __init__(
        self,
        store: CheckpointStore,
        name: str,
        identity: str,
        describe: Mapping[str, Any],
        *,
        lease: StudyLease,
        refresh_seconds: float = 2.0,
        results_seconds: float = 5.0,
        commit_seconds: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.store = store
        self.name = name
        self.identity = identity
        self.refresh_seconds = refresh_seconds
        self.results_seconds = results_seconds
        self.clock = clock
        root = store.root
        self.lease = lease
        guarded = store.fs.with_guard(lease.ensure) if isinstance(store.fs, RetryingFileSystem) else store.fs
        # one group commit for both journals, the plan's first: its events reach the disk no
        # later than the trial records that need them
        self.commit = GroupCommit(commit_seconds)
        plan = Journal(store.fs, f"{root}/{identity}/plan", header=plan_header(identity), commit=self.commit)
        self.records = Journal(
            guarded,
            f"{root}/studies/{name}/journal",
            header=records_header(name),
            writer=lease.session,
            guard=lease.ensure,
            commit=self.commit,
        )
        with _collector_paused():
            self._open(describe, plan)
        self._plan_at_open = plan.covered()  # other writers' plan files as this session found them
        self.results = ResultsWriter(
            results_url(store.url, name),
            store.storage_options,
            study=name,
            identity=identity,
            retry=StorageRetry(store.url, store.retry_seconds),
            guard=lease.ensure,
        )
        self._work: tuple[int, float] | None = None
        self._write_work((0, 0.0))  # written with the open record: readers know it records its work
        self.records.append({"r": "open", "identity": identity, **describe}, sync=True)
        self.leases = Leases(store, identity, self.plan_journal.journal.writer)
        self._lease_version: int | None = None  # the coordinator's kept points last written
        self._refreshed = self._results_at = clock()

    def _open(self, describe: Mapping[str, Any], plan: Journal) -> None:
        """Fold the study's journals (its records, its model's search plan): from its resume
        state and what was appended since where it has a good one (`dagtune.resume_state`),
        else read whole. When the state is due again, the fold is pickled now, as it is,
        and written with what restoring the trials derives from it (`attach`). `restored`
        is what the state read gave (where its trials sit, their configs' texts), nothing
        if none was read; the state written replaces it."""
        with parsed_configs_shared():  # a trial's record and its plan node: one config parsed
            resumed = read_state(self.store, self.name, self.identity, self.records, plan)
            if resumed is None:
                self.earlier = read_records(self.records)
                self.plan_journal = PlanJournal(SearchPlan(), plan)
                self.plan_journal.load()
            else:
                self.earlier, self.plan_journal = resumed.earlier, resumed.plan_journal
        self.restored = Restored() if resumed is None else resumed.restored
        self._submitters = {t.id: t.submitted_by for t in self.earlier.trials.values()}
        self._check_identity(describe)
        self._fold: bytes | None = None  # the fold pickled, while the state waits to be written
        if due(resumed, self.records, plan):
            self._fold = fold_bytes(
                self.store, self.name, self.identity, self.records, self.earlier, self.plan_journal
            )

    @property
    def plan(self) -> SearchPlan:
        return self.plan_journal.plan

    def _check_identity(self, describe: Mapping[str, Any]) -> None:
        for opened in self.earlier.opened:
            if opened.identity != self.identity:
                theirs = {k: getattr(opened, k, None) for k in describe}
                raise ValueError(
                    f"study {self.name!r} in {self.store.url} belongs to another model "
                    f"(identity {opened.identity}: {theirs}; this one is {self.identity}: "
                    f"{dict(describe)}). Resuming needs the same trainer, trainer arguments, seed "
                    "and version; give a new study another name."
                )

    def attach(self, coordinator: Coordinator, *, retry_failed: bool = False) -> list[Trial]:
        """Record the coordinator's trial changes from now on and restore the trials of
        earlier sessions (what restoring changes is recorded too: a pending trial whose
        results are known ends); returns the restored trials. A failed trial is pending
        again if it failed outside the trainer (`dagtune.records.OUTSIDE_THE_TRAINER`), or
        whatever failed it with `retry_failed`. Trials the resume state places in the plan
        are not located again; the state is written here when it is due."""
        coordinator.store = self.store
        coordinator.recorders.append(self._record)

        def retry(state: TrialState) -> bool:
            return retry_failed or state.cause in OUTSIDE_THE_TRAINER

        with _collector_paused():
            restored = coordinator.restore(self.earlier.trials.values(), retry, self.restored.placed)
            if self._fold is not None:
                self._write_state(restored)
        return restored

    def _write_state(self, restored: list[Trial]) -> None:
        """Write the resume state: the fold made at open and what restoring `restored` from
        it derived (where each trial sits in the plan, its config's text: made here for those
        the state read, if any, did not give)."""
        texts = self.restored.texts
        self.restored = Restored(
            {t.id: (t.steps, t.salt, t.node) for t in restored if t.node},
            self.plan.siblings,
            {t.id: texts.get(t.id) or config_dumps(t.config) for t in restored},
        )
        data = state_bytes(self._fold, self.restored)
        self._fold = None
        self.lease.ensure()
        put_whole(self.store.fs, state_path(self.store.root, self.name), data)

    def _record(self, record: dict) -> None:
        kind = record["r"]
        if kind == "submit":
            self._submitters[record["trial"]] = self.records.writer
        if kind in ("submit", "extend", "end", "retry"):  # whose trial it is (`dagtune.records`)
            submitter = self._submitters.get(record["trial"])
            if submitter is not None:
                record = {**record, "submitted_by": submitter}
        self.records.append(record)  # committed with (after) the plan events before it

    @property
    def incidents(self) -> list[str]:
        return [*self.plan_journal.journal.incidents, *self.records.incidents]

    def tick(self, coordinator: Coordinator, *, force: bool = False) -> None:
        """Periodic work: bring in other writers' plan events every `refresh_seconds`, write
        results every `results_seconds` (all of it, and a commit of the journals, with
        `force`; the journals commit on their own within `commit_seconds` otherwise)."""
        self.lease.ensure()  # a session that lost its lease stops here, whatever is due
        now = self.clock()
        if force or now - self._refreshed >= self.refresh_seconds:
            self._refreshed = now
            coordinator.absorb(self.plan_journal.refresh())
        self._renew_lease(coordinator, force)
        results_due = force or now - self._results_at >= self.results_seconds
        if results_due:
            self._results_at = now
            self._record_work(coordinator)
        if force:
            self.flush()
        if results_due:  # last: the journals never wait for the results
            self.results.write(coordinator.trials)

    def flush(self) -> None:
        """Commit both journals' buffered lines now: the plan's first (a trial's end record
        must never be read before the plan events it needs)."""
        self.commit.commit()

    def _record_work(self, coordinator: Coordinator) -> None:
        """What this session trained so far (executed steps, GPU-seconds of finished tasks),
        when it changed: the one thing storage can't rebuild, since the plan keeps what was
        trained but not how often. Readers sum the last record of each session."""
        self._write_work((coordinator.executed_steps, round(coordinator.gpu_seconds, 3)))

    def _write_work(self, work: tuple[int, float]) -> None:
        if work != self._work:
            self._work = work
            self.records.append(
                {
                    "r": "work",
                    "session": self.records.writer,
                    "executed_steps": work[0],
                    "gpu_seconds": work[1],
                }
            )

    def _renew_lease(self, coordinator: Coordinator, force: bool) -> None:
        """Publish what this study needs kept when it changed, and as a heartbeat every
        quarter of the lease's ttl. The coordinator keeps the points as things happen
        (`Coordinator.kept`): whether they changed costs nothing to ask; they are gathered
        only to be written, at most once a second, and no more often than
        `LEASE_SHARE` of the time leaves for writing them (a lease of 100,000 points takes
        tens of milliseconds: it is then written every few seconds)."""
        since = time.monotonic() - self.leases.renewed
        version = coordinator.kept.version
        changed = version != self._lease_version
        wait = max(1.0, self.leases.took / LEASE_SHARE)
        if force or (changed and since >= wait) or since >= self.leases.ttl_seconds / 4:
            self._lease_version = version
            self.leases.renew(coordinator.protected_points() | coordinator.latest_of_completed())

    def needed_elsewhere(self) -> set[Point]:
        """Checkpoints other studies of this model need: live ones' leases, and what the
        trial records of every other study in storage may resume or extend from."""
        held = Leases.held(self.store, self.identity, exclude=self.leases.writer)
        return held | needed_by_stored_studies(self.store, self.identity, self.plan, exclude=self.name)

    def read_back(self) -> tuple[StudyRecords, SearchPlan, dict[str, dict[str, int]]] | None:
        """The study as a reader of its journals now would fold it, without parsing again what
        this session read or wrote, and what it covers (journal directory under the storage
        root -> file name -> size; `dagtune.plan.Journal.covered`): this session's own records
        read back (the same bytes a reader gets) and folded after the earlier ones; the plan in
        memory when no other writer's plan files changed since the session opened (a reader
        orders writers' events by time; the plan then has them in that order), else read
        afresh. Call it after the last `flush`. None when the records journal has another
        writer's lines (the lease was lost: a reader's order may differ) or a file of another
        journal (its size is not kept)."""
        entries = self.records.read_new()
        if any(entry.writer != self.records.writer for entry in entries):
            return None
        for entry in entries:
            self.earlier.read(entry.record, entry.where)
        for where, reason in self.earlier.skipped:
            self.records.report(where, reason)
        journal = self.plan_journal.journal
        self.plan_journal.refresh()
        planned = journal.covered()
        if planned is None or self._plan_at_open is None:
            return None
        plan = self.plan
        if {k: v for k, v in planned.items() if not k.startswith(journal.writer)} != self._plan_at_open:
            fresh = PlanJournal(SearchPlan(), Journal(journal.fs, journal.directory, header=journal.header))
            fresh.load()
            plan, planned = fresh.plan, fresh.journal.covered()
        recorded = self.records.covered()
        if recorded is None or planned is None:
            return None
        covers = {f"studies/{self.name}/journal": recorded, f"{self.identity}/plan": planned}
        return self.earlier, plan, covers

    def close(self, coordinator: Coordinator, summarize: Callable[[Persistence], None] | None = None) -> None:
        """The study ends: its last work and results are written (the results' change log
        applied to them), both journals flushed and its leases released (what it keeps is in
        its trial records). `summarize`, if given, is
        called after the flush and before the leases go (the study's read index:
        `dagtune.study_index`); it failing is logged, not raised: the journals hold
        everything. The journals and the leases are seen to whatever fails before them; the
        first failure is raised after."""
        try:
            self.tick(coordinator, force=True)
            self.results.compact()  # the change log applied: a plain table to read
        finally:
            try:
                self._record_work(coordinator)  # done already unless the tick failed before it
                self.flush()
                self.commit.close()  # its committer ends (after a failed flush: once idle)
                if summarize is not None:
                    try:
                        summarize(self)
                    except Exception as error:
                        log.warning(
                            "dagtune: study %r: its read index was not written (%r)", self.name, error
                        )
            finally:
                try:
                    self.leases.release()
                finally:
                    self.lease.release()
