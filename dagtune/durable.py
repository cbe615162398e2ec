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
    {identity}/leases/{writer}.json                checkpoints a live study needs, and those
    {identity}/leases/{writer}-{n:06d}.json        added since (dagtune.checkpoint_leases)

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
import json
import logging
import os
import time
import uuid
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from fsspec.implementations.local import LocalFileSystem

from dagtune.checkpoint_leases import Leases, Point
from dagtune.checkpoints import CheckpointStore
from dagtune.collector_pause import collector_paused
from dagtune.config import config_dumps
from dagtune.identity import ModelNames
from dagtune.plan import GroupCommit, Journal, PlanJournal, SearchPlan, plan_header, records_header
from dagtune.records import (
    COMPLETED,
    OUTSIDE_THE_TRAINER,
    PENDING,
    FoldedTrial,
    Opened,
    RecordError,
    StudyRecords,
    Trial,
    TrialState,
    Worked,
    is_study_name,
    parse_trial_record,
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

#: the most of a study's time that writing its lease may take (its interval grows with it)
LEASE_SHARE = 0.02


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


def _only_module_differs(opened: Opened, names: ModelNames) -> bool:
    """Whether the session `opened` recorded this model with its trainer in another module:
    the same qualname, and the same identity once named as it was named there."""
    recorded = opened.trainer or ""
    return (
        recorded != names.name
        and recorded.endswith(f".{names.qualname}")
        and names.identity_as(recorded) == opened.identity
    )


def _moved_trainer_message(where: str, recorded: str, names: ModelNames) -> str:
    """The refusal of a study (`where`) whose trainer was recorded as `recorded`: the same
    model as this one but for the trainer's module."""
    theirs = recorded[: -len(names.qualname) - 1]
    head = (
        f"{where} was recorded with trainer {recorded}, this one is {names.name}: the same class "
        "name, trainer arguments, seed and version; only the module differs"
    )
    if theirs == "__main__":
        return (
            f"{head} (__main__ is where an earlier dagtune put a class of a script run as `python "
            "SCRIPT.py`, and where a notebook's or an interactive session's classes still are). "
            "Resume the study the way it was recorded: run that script with `python SCRIPT.py`, or "
            f"from that notebook or session; a new study name trains {names.name} anew."
        )
    return f"{head}. Give the study the class from module {theirs} (`from {theirs} import ...`)."


class Persistence:
    """The durable side of one study session (see the module docstring).

    `describe` is the study's identity record (trainer, seed, version; never credentials).
    `names` (`dagtune.identity.ModelNames`) tells the names its trainer may have been
    recorded under: a study recorded under its `legacy` name (a script's ``__main__`` class
    before dagtune named it by its file) opens under that name's identity, which `identity`
    then is, and a refusal says when only the trainer's module differs.
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
        names: ModelNames | None = None,
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
        self._names = names
        # the identities this study may have been recorded under, with what it records under
        # each: its own, then its trainer's legacy name's (a plan journal each, joined to the
        # commit before the records; the one not taken never holds a line to write)
        describes = {identity: dict(describe)}
        if names is not None and names.legacy is not None:
            describes.setdefault(names.identity_as(names.legacy), {**describe, "trainer": names.legacy})
        plans = {
            known: Journal(store.fs, f"{root}/{known}/plan", header=plan_header(known), commit=self.commit)
            for known in describes
        }
        self.records = Journal(
            guarded,
            f"{root}/studies/{name}/journal",
            header=records_header(name),
            writer=lease.session,
            guard=lease.ensure,
            commit=self.commit,
        )
        with collector_paused():
            self._open(describes, plans)
        describe = describes[self.identity]
        self._plan_at_open = self.plan_journal.journal.covered()  # other writers' plan files as found
        self.results = ResultsWriter(
            results_url(store.url, name),
            store.storage_options,
            study=name,
            identity=self.identity,
            retry=StorageRetry(store.url, store.retry_seconds),
            guard=lease.ensure,
        )
        self._work: tuple[int, float] | None = None
        self._write_work((0, 0.0))  # written with the open record: readers know it records its work
        self._opened = {"r": "open", "identity": self.identity, **describe}
        self.records.append(self._opened, sync=True)
        # the coordinator's trials once attached, and the metrics the records leave each
        # pending trial that has them (one that completed, then was extended; a reader shows
        # them until it ends again): what `session_study` folds the study from at close
        self._trials: Mapping[int, Trial] | None = None
        self._held: dict[int, dict[str, float]] = {}
        self.leases = Leases(store, self.identity, self.plan_journal.journal.writer)
        self._lease_version: int | None = None  # the coordinator's kept points last written
        self._left_at_whole = 0  # the kept points' `left` at the lease's last whole write
        self._refreshed = self._results_at = clock()
        #: before these times (`clock`, `time.monotonic`) a tick has nothing to do but check the
        #: study's lease: no refresh, results or checkpoint lease is due (`tick`)
        self._quiet_until = self._lease_quiet_until = -float("inf")
        #: the ids of the trials changed since the last results write, the ones it compares:
        #: a set of the coordinator's `TrialLedger.changes` once attached (its every change of
        #: a trial, restored ones included, adds the id), until the study closes
        self._changed: set[int] = set()
        self._ledger: Any = None  # the coordinator's ledger (`TrialLedger`), once attached

    def _open(self, describes: Mapping[str, Mapping[str, Any]], plans: Mapping[str, Journal]) -> None:
        """Fold the study's journals (its records, its model's search plan): from its resume
        state and what was appended since where it has a good one (`dagtune.resume_state`),
        else read whole. When the state is due again, the fold is pickled now, as it is,
        and written with what restoring the trials derives from it (`attach`). `restored`
        is what the state read gave (where its trials sit, their configs' texts), nothing
        if none was read; the state written replaces it.

        `plans` holds the plan journal of each identity the study may have been recorded
        under, its own first (`describes` says what each records): `identity` becomes the
        one whose resume state is good, else the one its records name (its own if none)."""
        with parsed_configs_shared():  # a trial's record and its plan node: one config parsed
            resumed = None
            for identity, plan in plans.items():
                resumed = read_state(self.store, self.name, identity, self.records, plan)
                if resumed is not None:
                    self.identity = identity
                    break
            if resumed is None:
                self.earlier = read_records(self.records)
                recorded = self.earlier.opened[0].identity if self.earlier.opened else None
                self.identity = recorded if recorded in plans else self.identity
                self.plan_journal = PlanJournal(SearchPlan(), plans[self.identity])
                self.plan_journal.load()
            else:
                self.earlier, self.plan_journal = resumed.earlier, resumed.plan_journal
        self.restored = Restored() if resumed is None else resumed.restored
        self._submitters = {t.id: t.submitted_by for t in self.earlier.trials.values()}
        self._check_identity(describes[self.identity])
        self._fold: bytes | None = None  # the fold pickled, while the state waits to be written
        if due(resumed, self.records, self.plan_journal.journal):
            self._fold = fold_bytes(
                self.store, self.name, self.identity, self.records, self.earlier, self.plan_journal
            )

    @property
    def plan(self) -> SearchPlan:
        return self.plan_journal.plan

    def _check_identity(self, describe: Mapping[str, Any]) -> None:
        for opened in self.earlier.opened:
            if opened.identity == self.identity:
                continue
            where = f"study {self.name!r} in {self.store.url}"
            if self._names is not None and _only_module_differs(opened, self._names):
                raise ValueError(_moved_trainer_message(where, opened.trainer or "", self._names))
            theirs = {k: getattr(opened, k, None) for k in describe}
            raise ValueError(
                f"{where} belongs to another model "
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
        self._ledger = coordinator.ledger
        self._changed = self._ledger.watch_changes()  # before `restore`: it marks the trials it restores
        self._trials = coordinator.trials
        self._held = {
            state.id: state.metrics
            for state in self.earlier.trials.values()
            if state.status == PENDING and state.metrics is not None
        }

        def retry(state: TrialState) -> bool:
            return retry_failed or state.cause in OUTSIDE_THE_TRAINER

        with collector_paused():
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
        elif kind == "extend":  # recorded before the trial changes (`TrialLedger.extend`)
            trial = self._trials[record["trial"]] if self._trials is not None else None
            if trial is not None and trial.status == COMPLETED:  # its end record's metrics stay
                self._held[trial.id] = trial.metrics
        elif kind in ("end", "retry"):  # ended: its own; retried: none
            self._held.pop(record["trial"], None)
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
        if not force and now < self._quiet_until and time.monotonic() < self._lease_quiet_until:
            return  # most ticks: a study's loop ticks at every event batch
        if force or now - self._refreshed >= self.refresh_seconds:
            self._refreshed = now
            coordinator.absorb(self.plan_journal.refresh())
        self._renew_lease(coordinator, force)
        leases = self.leases  # before this, no lease write is due, whatever changes (`_renew_lease`)
        self._lease_quiet_until = leases.renewed + min(
            max(1.0, leases.took / LEASE_SHARE), leases.ttl_seconds / 4
        )
        results_due = force or now - self._results_at >= self.results_seconds
        if results_due:
            self._results_at = now
            self._record_work(coordinator)
        if force:
            self.flush()
        if results_due:  # last: the journals never wait for the results
            self._write_results(coordinator, force)
        self._quiet_until = min(
            self._refreshed + self.refresh_seconds, self._results_at + self.results_seconds
        )

    def _write_results(self, coordinator: Coordinator, everything: bool) -> None:
        """Write the results of the trials that changed since the last write (`everything`:
        compare every trial, as the study's last writes do, whatever was marked; so is a
        coordinator whose ledger does not mark them for this session: not attached). The
        marks are cleared once the write succeeded: a failed one leaves them for the next."""
        marked = coordinator.ledger is self._ledger
        self.results.write(coordinator.trials, None if everything or not marked else self._changed)
        self._changed.clear()

    def _detach(self) -> None:
        """Stop marking changed trials (the study closes): its set leaves the ledger's
        `changes` (found by identity: another reader's set may hold the same ids)."""
        if self._ledger is not None:
            self._ledger.unwatch_changes(self._changed)
            self._ledger = None

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
        (`Coordinator.kept`): whether they changed costs nothing to ask, and the points that
        entered since the last write are logged, so a write publishes those only (`Leases.add`);
        every point is gathered only for a whole write (`Leases.whole_due`: at the heartbeat,
        or once the parts or the points that left are as many as the whole). A write comes at
        most once a second, and no more often than `LEASE_SHARE` of the time leaves for it."""
        leases, kept = self.leases, coordinator.kept
        since = time.monotonic() - leases.renewed
        version = kept.version
        changed = version != self._lease_version
        wait = max(1.0, leases.took / LEASE_SHARE)
        if not (force or (changed and since >= wait) or since >= leases.ttl_seconds / 4):
            return
        self._lease_version = version
        if leases.points is None:
            kept.follow()  # from now on: what enters is logged (gathered whole just below)
        entered = kept.take_entered()
        if leases.whole_due(len(entered), kept.left - self._left_at_whole):
            self._left_at_whole = kept.left
            leases.renew(coordinator.protected_points() | coordinator.latest_of_completed())
        else:
            leases.add(entered)

    def needed_elsewhere(self) -> set[Point]:
        """Checkpoints other studies of this model need: live ones' leases, and what the
        trial records of every other study in storage may resume or extend from."""
        held = Leases.held(self.store, self.identity, exclude=self.leases.writer)
        return held | needed_by_stored_studies(self.store, self.identity, self.plan, exclude=self.name)

    def session_study(
        self,
    ) -> tuple[StudyRecords, list[FoldedTrial], PlanJournal, dict[str, dict[str, int]]] | None:
        """The study as a reader of its journals now would fold it, from what this session
        holds, and what it covers (journal directory under the storage root -> file name ->
        size; `dagtune.plan.Journal.covered`): the records of earlier sessions as it folded
        them when it opened, its own ``open`` and latest ``work`` record, each trial as its
        own records leave it (`dagtune.catalog.FoldedTrial`: the coordinator's trial, whose
        every change it recorded, with the config and salt the earlier records give a trial
        they hold, and, while pending, the metrics its last ``end`` record left) and the
        plan (`_plan_read`); no line of the study's records is read. Call it after the last
        `flush`. None, for `read_back` to read instead, when the records journal holds
        other files or sizes than those this session read and wrote (another writer's lines,
        a lease lost; a reader's fold may differ), when it was never attached to a
        coordinator, or when a reader would skip its ``open`` or ``work`` record."""
        if self._trials is None:
            return None
        recorded = self.records.covered()
        if recorded is None or self.records.sizes() != recorded:
            return None
        records = StudyRecords(list(self.earlier.opened), {}, dict(self.earlier.work))
        own = [self._opened]
        if self._work is not None:
            steps, seconds = self._work
            own.append(
                {"r": "work", "session": self.records.writer, "executed_steps": steps, "gpu_seconds": seconds}
            )
        for record in own:  # as a reader gets them: JSON text parsed
            try:
                parsed = parse_trial_record(json.loads(json.dumps(record)))
            except (RecordError, ValueError):
                return None
            if isinstance(parsed, Worked):
                records.work[parsed.session] = parsed
            elif isinstance(parsed, Opened):
                records.opened.append(parsed)
        read = self._plan_read()
        if read is None:
            return None
        plan, planned = read
        covers = {f"studies/{self.name}/journal": recorded, f"{self.identity}/plan": planned}
        return records, self._folded(self._trials), plan, covers

    def _folded(self, trials: Mapping[int, Trial]) -> list[FoldedTrial]:
        """Each of `trials` as the records fold it (`session_study`)."""
        earlier = self.earlier.trials
        folded: list[FoldedTrial] = []
        for trial in trials.values():
            base = earlier.get(trial.id)
            config, salt = (trial.config, trial.salt) if base is None else (base.config, base.salt)
            if trial.status == PENDING:
                where = self.records.directory if base is None else base.where
                state = TrialState(
                    trial.id, config, trial.steps, where, salt=salt, metrics=self._held.get(trial.id)
                )
                folded.append(state)
            elif config is not trial.config or salt != trial.salt:  # a restored trial given a salt
                state = TrialState(
                    trial.id,
                    config,
                    trial.steps,
                    base.where,
                    salt=salt,
                    status=trial.status,
                    reached=trial.reached,
                    metrics=trial.metrics,
                    error=trial.error,
                    cause=trial.cause,
                )
                folded.append(state)
            else:
                folded.append(trial)
        return folded

    def read_back(self) -> tuple[StudyRecords, PlanJournal, dict[str, dict[str, int]]] | None:
        """The study as a reader of its journals now would fold it, without parsing again what
        this session read when it opened, and what it covers (`session_study`): this
        session's own records read back (the same bytes a reader gets) and folded after the
        earlier ones, and the plan (`_plan_read`). Call it after the last `flush`. None when
        the records journal has another writer's lines (the lease was lost: a reader's order
        may differ) or a file of another journal (its size is not kept)."""
        entries = self.records.read_new()
        if any(entry.writer != self.records.writer for entry in entries):
            return None
        for entry in entries:
            self.earlier.read(entry.record, entry.where)
        for where, reason in self.earlier.skipped:
            self.records.report(where, reason)
        read = self._plan_read()
        recorded = self.records.covered()
        if read is None or recorded is None:
            return None
        plan, planned = read
        covers = {f"studies/{self.name}/journal": recorded, f"{self.identity}/plan": planned}
        return self.earlier, plan, covers

    def _plan_read(self) -> tuple[PlanJournal, dict[str, int]] | None:
        """The search plan as a reader of its journal now would fold it (with its journal's
        incidents), and the files and sizes that covers: other writers' new events brought
        in, then the plan in memory
        when no other writer's plan files changed since the session opened (a reader orders
        writers' events by time; the plan then has them in that order), else the journal
        read afresh (events of writers that wrote meanwhile may be ordered otherwise). None
        when the journal has a file of another journal (its size is not kept)."""
        journal = self.plan_journal.journal
        self.plan_journal.refresh()
        planned = journal.covered()
        if planned is None or self._plan_at_open is None:
            return None
        if {k: v for k, v in planned.items() if not k.startswith(journal.writer)} == self._plan_at_open:
            return self.plan_journal, planned
        fresh = PlanJournal(SearchPlan(), Journal(journal.fs, journal.directory, header=journal.header))
        fresh.load()
        planned = fresh.journal.covered()
        return None if planned is None else (fresh, planned)

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
            self._detach()
            try:
                self._record_work(coordinator)  # done already unless the tick failed before it
                self.flush()
                self.commit.close()  # its committer ends (after a failed flush: once idle)
                if summarize is not None:
                    try:
                        with collector_paused():  # the index's trials and views: all alive till written
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
