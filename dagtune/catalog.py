"""What a storage URL holds, read without running anything: studies, trials, search plans.

The command line (`dagtune status`, `tree`, `gc`, `dashboard`) works on storage alone,
possibly while studies run elsewhere. This module reads the layout `dagtune.durable`
writes: each study's records (``studies/{name}/journal``) give its trials, the search plan
journal of its model identity (``{identity}/plan``) gives their paths, metrics and
checkpoints. Trials come back as `dagtune.records.Trial` records, as a resumed study would see
them, so every view and `dagtune.gc.collect` can use them unchanged. Nothing here writes,
except `collect_garbage` (which journals the checkpoints it deletes, as a study would).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from dagtune.checkpoint_leases import Leases
from dagtune.checkpoints import CheckpointStore
from dagtune.coordinator import trial_figures
from dagtune.durable import list_studies, plan_header, read_records, records_header
from dagtune.errors import DagtuneError
from dagtune.gc import collect
from dagtune.plan import Journal, PlanJournal, SearchPlan
from dagtune.records import (
    PENDING,
    FoldedTrial,
    StudyRecords,
    Trial,
    is_study_name,
    parsed_configs_shared,
)
from dagtune.summary import metric_of, trained_to

__all__ = [
    "NotDagtuneStorageError",
    "StorageError",
    "StorageReadError",
    "StoredStudy",
    "StudyNameError",
    "check_study_name",
    "collect_garbage",
    "list_studies",
    "load_study",
    "open_storage",
    "stored_studies",
    "stored_study",
]

_IDENTITY_DIR = re.compile(r"^[0-9a-f]{16}$")  # a model identity's directory (its plan, checkpoints)


class StorageError(DagtuneError, ValueError):
    """The storage URL can't be read as dagtune storage (the message says why)."""


class StudyNameError(StorageError):
    """A name that no study can have (so it can't name a directory in storage either)."""


class NotDagtuneStorageError(StorageError):
    """The storage exists but holds nothing a study writes (the message says what it holds)."""


class StorageReadError(StorageError):
    """Something in storage can't be read (permissions, a directory where a file belongs, an
    unreachable endpoint): the message names it and the error."""


@contextlib.contextmanager
def _reading(what: str, store: CheckpointStore) -> Iterator[None]:
    """Turn an OSError while reading `what` into a `StorageReadError` naming it."""
    try:
        yield
    except FileNotFoundError:
        raise
    except OSError as error:
        raise StorageReadError(
            f"cannot read {what} in {store.url}: {type(error).__name__}: {error}"
        ) from error


def check_study_name(name: str) -> str:
    """`name` if a `Study` could have it (the same rule), else `StudyNameError`."""
    if not is_study_name(name):
        raise StudyNameError(f"{name!r} is not a study name (1-128 letters, digits, '.', '_' or '-')")
    return name


def open_storage(url: str, storage_options: Mapping[str, Any] | None = None) -> CheckpointStore:
    """A store for `url`, checked to exist and to hold dagtune studies or plans."""
    try:
        store = CheckpointStore(url, storage_options)
        fs, root = store.fs, store.root
    except (ValueError, ImportError) as error:
        raise StorageError(f"cannot open storage {url!r}: {error}") from None
    try:
        exists = fs.isdir(root)
    except Exception as error:  # credentials, endpoint, network: the filesystem says which
        raise StorageError(f"cannot read storage {url!r}: {type(error).__name__}: {error}") from None
    if not exists:
        raise StorageError(f"storage {url!r} does not exist")
    return store


@dataclass
class StoredStudy:
    """One study as storage holds it: its identity record, trials and the shared plan."""

    name: str
    identity: str
    describe: dict[str, Any]
    trials: list[Trial]
    plan: SearchPlan
    incidents: list[str] = field(default_factory=list)
    work: dict[str, float] | None = None  # executed steps and GPU-seconds its sessions recorded
    # the journal files it was read from and their sizes (`dagtune.plan.Journal.covered`), by
    # directory under the storage root; None if unknown (`dagtune.study_index`)
    covers: dict[str, dict[str, int]] | None = None

    def report(self) -> dict[str, Any]:
        """Trial and unique steps of the trials, the steps the plan holds trained (every
        study of this model identity included) and, when its sessions recorded them, the
        steps it executed and their GPU-seconds."""
        trained = sum(trained_to(n) - n.start for n in self.plan.nodes.values())
        checkpoints = [i for n in self.plan.nodes.values() for i in n.checkpoints.values()]
        return {
            **trial_figures(self.trials),
            "plan_steps": trained,
            "checkpoints": len(checkpoints),
            "checkpoint_bytes": sum(i.nbytes for i in checkpoints),
            **(self.work or {}),
        }


def stored_studies(store: CheckpointStore) -> list[str]:
    """The names of the studies in `store` (directories ``studies/NAME`` holding records),
    sorted; `NotDagtuneStorageError` if it holds neither studies nor search plans."""
    with _reading("the list of studies (studies/)", store):
        names = list_studies(store)
        if names:
            return names
        found = sorted(p.rstrip("/").rsplit("/", 1)[-1] for p in store.fs.ls(store.root, detail=False))
        if not found or any(_IDENTITY_DIR.match(name) for name in found) or _opened_studies(store):
            return []  # empty, or dagtune's: search plans and checkpoints, studies opened but not written
    shown = ", ".join(found[:8]) + (f", ... ({len(found)} in all)" if len(found) > 8 else "")
    raise NotDagtuneStorageError(
        f"{store.url} is not dagtune storage: it holds no study records (studies/NAME/journal) or "
        f"search plans (MODEL/plan); it holds {shown}"
    )


def _opened_studies(store: CheckpointStore) -> bool:
    """Whether a study took its writer lease in `store` (``studies/NAME/lease``), records or not."""
    try:
        paths = store.fs.ls(f"{store.root}/studies", detail=False)
    except (FileNotFoundError, NotADirectoryError):
        return False
    return any(store.fs.isdir(f"{path.rstrip('/')}/lease") for path in paths)


def load_plan(store: CheckpointStore, identity: str) -> PlanJournal:
    """The search plan of `identity` read from every writer's journal (nothing written)."""
    journal = PlanJournal(
        SearchPlan(), Journal(store.fs, f"{store.root}/{identity}/plan", header=plan_header(identity))
    )
    with _reading(f"the search plan of model {identity} ({identity}/plan)", store):
        journal.load()
    return journal


def load_study(store: CheckpointStore, name: str, plans: dict[str, PlanJournal] | None = None) -> StoredStudy:
    """Study `name` from `store`; `plans` caches plan journals by identity across calls.

    Every line is checked as it is read (`dagtune.records`): one that is not what dagtune
    writes is skipped and listed in the study's `incidents` as ``file:line: reason``."""
    check_study_name(name)
    with parsed_configs_shared():  # the records' configs are the plan's nodes': each parsed once
        return _load_study(store, name, plans)


def _load_study(store: CheckpointStore, name: str, plans: dict[str, PlanJournal] | None) -> StoredStudy:
    directory = f"{store.root}/studies/{name}/journal"
    journal = Journal(store.fs, directory, header=records_header(name))
    with _reading(f"the records of study {name!r} (studies/{name}/journal)", store):
        records = read_records(journal)
        exists = bool(journal.incidents) or store.fs.exists(directory)
    if not records.opened and not exists:
        with _reading("the list of studies (studies/)", store):
            known = ", ".join(list_studies(store)) or "none"
        raise StorageError(f"no study {name!r} in {store.url} (studies there: {known})")
    if not records.opened:
        skipped = journal.incidents
        found = f"{len(skipped)} problem(s), the first: {skipped[0]}" if skipped else "no records at all"
        raise StorageError(
            f"studies/{name}/journal in {store.url} holds no study records dagtune can read ({found}): "
            "it was not written by dagtune, or is damaged"
        )
    plans = {} if plans is None else plans
    identity = records.opened[-1].identity
    if identity not in plans:
        plans[identity] = load_plan(store, identity)
    plan_journal = plans[identity]
    incidents = [*journal.incidents, *plan_journal.journal.incidents]
    stored = stored_study(name, records, plan_journal.plan, incidents)
    read, planned = journal.covered(), plan_journal.journal.covered()
    if read is not None and planned is not None:
        stored.covers = {f"studies/{name}/journal": read, f"{identity}/plan": planned}
    return stored


def stored_study(
    name: str,
    records: StudyRecords,
    plan: SearchPlan,
    incidents: list[str],
    folded: Iterable[FoldedTrial] | None = None,
) -> StoredStudy:
    """Study `name` as its folded `records` (with at least one ``open`` record) and its
    model's search `plan` give it: what `load_study` returns, and what a study's writer
    builds when it closes (`dagtune.study_index`); `folded`, if given, are the trials the
    records fold into (else ``records.trials``)."""
    opened = records.opened[-1]
    describe = {
        "trainer": opened.trainer,
        "seed": opened.seed,
        "version": opened.version,
        "link": opened.link,
        "gpus": opened.gpus,
    }
    trials = _trials(records.trials.values() if folded is None else folded, plan)
    return StoredStudy(name, opened.identity, describe, trials, plan, incidents, records.work_total())


def _trials(states: Iterable[FoldedTrial], plan: SearchPlan) -> list[Trial]:
    """Trials as a resumed coordinator would rebuild them, with their curves from the plan."""
    trials = []
    for state in sorted(states, key=lambda s: s.id):
        trial = Trial(
            state.id,
            state.config,
            state.steps,
            status=state.status,
            error=state.error,
            cause=state.cause,
            salt=state.salt,
        )
        trial.node = plan.locate(state.config, state.steps, salt=state.salt) or ""  # reading writes nothing
        trial.segments = plan.segments(trial.node, trial.steps) if trial.node else []
        known = plan.points_along(trial.segments)
        reached = state.reached
        if state.status == PENDING:  # as far as the plan has metrics, without a gap
            reached = next((i for i, point in enumerate(known) if point[0] != i + 1), len(known))
        trial.points = [point for point in known if point[0] <= reached]
        trial.reported = reached
        if state.metrics:
            trial.metrics = state.metrics
        else:
            trial.last = trial.points[-1] if trial.points else None
        trials.append(trial)
    return trials


@contextlib.contextmanager
def _deleting(what: str, store: CheckpointStore) -> Iterator[None]:
    """Turn an OSError while deleting `what` into a `StorageError` naming it."""
    try:
        yield
    except OSError as error:
        raise StorageReadError(
            f"cannot delete {what} in {store.url}: {type(error).__name__}: {error} (nothing after it was "
            "deleted; what was deleted before is journaled)"
        ) from error


def collect_garbage(store: CheckpointStore, policy: Any, *, dry_run: bool = False) -> list[dict]:
    """Collect checkpoints of every model identity in `store` by `policy` (a `GcPolicy`),
    as `Study.gc` does, over the trials of all the identity's studies. What pending trials
    resume from (the latest checkpoint before each one's point) and what the leases of live
    studies hold (their running stages' sources and checkpoints) is never deleted. Returns one
    summary per identity; with `dry_run`, deletes nothing."""
    plans: dict[str, PlanJournal] = {}
    by_identity: dict[str, list[Trial]] = {}
    for name in stored_studies(store):
        try:
            study = load_study(store, name, plans)
        except StorageReadError:
            raise  # its pending trials' checkpoints would look unneeded
        except StorageError:
            continue  # a study directory without records yet
        by_identity.setdefault(study.identity, []).extend(study.trials)
    summaries = []
    for identity, trials in sorted(by_identity.items()):
        journal = plans[identity]
        plan = journal.plan
        with _reading(f"the leases of model {identity} ({identity}/leases)", store):
            protected = Leases.held(store, identity)  # what live studies of the model need
        for trial in trials:
            if trial.status == PENDING:
                latest = plan.latest_checkpoint(trial.node, trial.steps)
                if latest is not None:
                    protected.add(latest)
        metric, mode = metric_of(trials)
        decision = collect(plan, trials, protected, policy, metric=metric, mode=mode)
        if not dry_run:
            for node, step in sorted(decision.delete):
                with _deleting(f"checkpoint {identity}/checkpoints/{node}/{step:09d}", store):
                    plan.drop_checkpoint(node, step)  # journaled first: no study loads it any more
                    journal.journal.flush()
                    store.delete(identity, node, step)
        summaries.append(
            {
                "identity": identity,
                "deleted": len(decision.delete),
                "kept": len(decision.keep),
                "protected": len(decision.protected),
                "bytes_before": decision.bytes_before,
                "bytes_after": decision.bytes_after,
            }
        )
    return summaries
