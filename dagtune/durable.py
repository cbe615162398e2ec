"""What a study keeps in storage: the shared search plan, its own trial records, its results.

Layout under the storage URL (a directory, ``s3://bucket/prefix``, any fsspec URL)::

    {identity}/checkpoints/{node}/{step:09d}/...   checkpoints (dagtune.checkpoints)
    {identity}/plan/{writer}.jsonl                 search plan journal, one file per writer
    {identity}/plan/{writer}-{seq:08d}.jsonl       (object stores: numbered segments instead)
    studies/{name}/journal/...                     the study's trial records, same format
    studies/{name}/results.zarr                    trials and learning curves (dagtune.results)

Every study of one model identity (trainer, its arguments, seed, version) shares the plan:
what any of them trained, the next one reuses. A study's own records (one ``open`` record
per session, then ``submit`` / ``extend`` / ``end`` per trial) let the same study resume:
same name and storage. `Persistence` ties these to a study; the study calls `tick` from its
driver loop for the periodic work (flushes, picking up other writers' plan events, results).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from dagtune.checkpoints import CheckpointStore
from dagtune.coordinator import Coordinator, Trial
from dagtune.plan import SearchPlan
from dagtune.plan._journal import Journal, PlanJournal
from dagtune.results import ResultsWriter, results_url

__all__ = ["Persistence"]


class Persistence:
    """The durable side of one study session (see the module docstring).

    `describe` is the study's identity record (trainer, seed, version; never credentials).
    Raises ValueError if the study `name` already exists in storage for another identity.
    """

    def __init__(
        self,
        store: CheckpointStore,
        name: str,
        identity: str,
        describe: Mapping[str, Any],
        *,
        refresh_seconds: float = 2.0,
        results_seconds: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.store = store
        self.name = name
        self.identity = identity
        self.refresh_seconds = refresh_seconds
        self.results_seconds = results_seconds
        self.clock = clock
        root = store.root
        self.records = Journal(store.fs, f"{root}/studies/{name}/journal")
        self.earlier = [entry.record for entry in self.records.read_new()]
        self._check_identity(describe)
        self.plan_journal = PlanJournal(SearchPlan(), Journal(store.fs, f"{root}/{identity}/plan"))
        self.plan_journal.load()
        self.results = ResultsWriter(
            results_url(store.url, name), store.storage_options, study=name, identity=identity
        )
        self.records.append({"r": "open", "identity": identity, **describe}, sync=True)
        self._refreshed = self._results_at = clock()

    @property
    def plan(self) -> SearchPlan:
        return self.plan_journal.plan

    def _check_identity(self, describe: Mapping[str, Any]) -> None:
        for record in self.earlier:
            if record.get("r") == "open" and record.get("identity") != self.identity:
                theirs = {k: record.get(k) for k in describe}
                raise ValueError(
                    f"study {self.name!r} in {self.store.url} belongs to another model "
                    f"(identity {record.get('identity')}: {theirs}; this one is {self.identity}: "
                    f"{dict(describe)}). Resuming needs the same trainer, trainer arguments, seed "
                    "and version; give a new study another name."
                )

    def attach(self, coordinator: Coordinator) -> list[Trial]:
        """Record the coordinator's trial changes from now on and restore the trials of
        earlier sessions; returns the restored trials."""
        coordinator.store = self.store
        restored = coordinator.restore(self.earlier)
        coordinator.recorders.append(self._record)
        return restored

    def _record(self, record: dict) -> None:
        if record["r"] == "end":  # a finished trial: what it needs from the plan goes first
            self.plan_journal.journal.flush()
        self.records.append(record, sync=record["r"] == "end")

    @property
    def incidents(self) -> list[str]:
        return [*self.plan_journal.journal.incidents, *self.records.incidents]

    def tick(self, coordinator: Coordinator, *, force: bool = False) -> None:
        """Periodic work: flush what waited long enough, bring in other writers' plan events
        every `refresh_seconds`, write results every `results_seconds` (all of it with
        `force`)."""
        now = self.clock()
        if force or now - self._refreshed >= self.refresh_seconds:
            self._refreshed = now
            coordinator.absorb(self.plan_journal.refresh())
        if force or now - self._results_at >= self.results_seconds:
            self._results_at = now
            self.results.write(coordinator.trials)
        if force:
            self.plan_journal.journal.flush()
            self.records.flush()
        else:
            self.plan_journal.journal.maybe_flush()
            self.records.maybe_flush()
