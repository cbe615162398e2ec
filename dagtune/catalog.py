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

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from dagtune.checkpoints import CheckpointStore
from dagtune.coordinator import trial_figures
from dagtune.durable import Leases, list_studies, plan_header, read_records, records_header
from dagtune.errors import DagtuneError
from dagtune.gc import collect
from dagtune.plan import Journal, PlanJournal, SearchPlan
from dagtune.records import PENDING, Trial, TrialState, is_study_name
from dagtune.summary import metric_of, trained_to

__all__ = [
    "StorageError",
    "StoredStudy",
    "StudyNameError",
    "check_study_name",
    "collect_garbage",
    "list_studies",
    "load_study",
    "open_storage",
]


class StorageError(DagtuneError, ValueError):
    """The storage URL can't be read as dagtune storage (the message says why)."""


class StudyNameError(StorageError):
    """A name that no study can have (so it can't name a directory in storage either)."""


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


def load_plan(store: CheckpointStore, identity: str) -> PlanJournal:
    """The search plan of `identity` read from every writer's journal (nothing written)."""
    journal = PlanJournal(
        SearchPlan(), Journal(store.fs, f"{store.root}/{identity}/plan", header=plan_header(identity))
    )
    journal.load()
    return journal


def load_study(store: CheckpointStore, name: str, plans: dict[str, PlanJournal] | None = None) -> StoredStudy:
    """Study `name` from `store`; `plans` caches plan journals by identity across calls.

    Every line is checked as it is read (`dagtune.records`): one that is not what dagtune
    writes is skipped and listed in the study's `incidents` as ``file:line: reason``."""
    check_study_name(name)
    journal = Journal(store.fs, f"{store.root}/studies/{name}/journal", header=records_header(name))
    records = read_records(journal)
    if not records.opened:
        known = ", ".join(list_studies(store)) or "none"
        raise StorageError(f"no study {name!r} in {store.url} (studies there: {known})")
    opened = records.opened[-1]
    describe = {
        "trainer": opened.trainer,
        "seed": opened.seed,
        "version": opened.version,
        "link": opened.link,
        "gpus": opened.gpus,
    }
    plans = {} if plans is None else plans
    if opened.identity not in plans:
        plans[opened.identity] = load_plan(store, opened.identity)
    plan_journal = plans[opened.identity]
    trials = _trials(records.trials.values(), plan_journal.plan)
    incidents = [*journal.incidents, *plan_journal.journal.incidents]
    return StoredStudy(
        name, opened.identity, describe, trials, plan_journal.plan, incidents, records.work_total()
    )


def _trials(states: Iterable[TrialState], plan: SearchPlan) -> list[Trial]:
    """Trials as a resumed coordinator would rebuild them, with their curves from the plan."""
    trials = []
    for state in sorted(states, key=lambda s: s.id):
        trial = Trial(
            state.id, state.config, state.steps, status=state.status, error=state.error, cause=state.cause
        )
        trial.node = plan.locate(state.config, state.steps, salt=state.salt) or ""  # reading writes nothing
        trial.segments = plan.segments(trial.node, trial.steps) if trial.node else []
        known = plan.curve(trial.node, trial.steps) if trial.node else []
        reached = state.reached
        if state.status == PENDING:  # as far as the plan has metrics, without a gap
            reached = next((i for i, (step, _) in enumerate(known) if step != i + 1), len(known))
        trial.curve = [(step, metrics) for step, metrics in known if step <= reached]
        trial.reported = reached
        trial.metrics = state.metrics or (trial.curve[-1][1] if trial.curve else None)
        trials.append(trial)
    return trials


def collect_garbage(store: CheckpointStore, policy: Any, *, dry_run: bool = False) -> list[dict]:
    """Collect checkpoints of every model identity in `store` by `policy` (a `GcPolicy`),
    as `Study.gc` does, over the trials of all the identity's studies. What pending trials
    resume from (the latest checkpoint before each one's point) and what the leases of live
    studies hold (their running stages' sources and checkpoints) is never deleted. Returns one
    summary per identity; with `dry_run`, deletes nothing."""
    plans: dict[str, PlanJournal] = {}
    by_identity: dict[str, list[Trial]] = {}
    for name in list_studies(store):
        try:
            study = load_study(store, name, plans)
        except StorageError:
            continue  # a study directory without records yet
        by_identity.setdefault(study.identity, []).extend(study.trials)
    summaries = []
    for identity, trials in sorted(by_identity.items()):
        journal = plans[identity]
        plan = journal.plan
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
