"""What a study keeps between its views (`KeptView`), so that a view taken again costs the
trials and plan nodes that changed since the previous one, not every trial (issue 24: a view
of 100,000 trials took 1.65 s of CPU under the study's lock, perf/RESULTS.md 9l)."""

from __future__ import annotations

from collections import Counter, deque
from itertools import islice
from types import MappingProxyType
from typing import Any

from dagtune.config import Config
from dagtune.coordinator import KeptFigures
from dagtune.records import TrialChanges, TrialSnapshot, ViewFigures
from dagtune.study._page_figures import PageFigures
from dagtune.summary import trained_to

__all__ = ["KeptView"]

#: how many of its last versions' changed trials a view carries (`TrialChanges.recent`): a
#: reader that missed more views than these (other readers took them) looks at every trial
CHANGES_KEPT = 64


class KeptView:
    """The frozen snapshot of each trial of one coordinator, and the config and steps trained
    of each plan node the trials' paths pass, kept between views and made again only for what
    changed: the trials the ledger says changed (`TrialLedger.changes`: every change of a
    trial's fields adds its id there) and the nodes the plan says changed (its `observers`:
    metrics and checkpoints recorded or dropped), and the coordinator's report of the trials
    and the page's figures of them from figures kept as each snapshot changes
    (`dagtune.coordinator.KeptFigures`, `PageFigures`). The first call snapshots every trial.
    Each call that snapshotted trials is a new version, and `changes` tells a reader which
    trials changed at the last `CHANGES_KEPT` versions (`dagtune.records.TrialChanges`); when
    every trial is snapshotted again, the keeper is new, so that no reader patches what it
    kept of the old one.

    `snapshotted` and `retrained` count the trials snapshotted and the nodes whose trained step
    was read again (what a view costs, for the tests that count it). Used under the study's
    lock, as the coordinator's changes are made."""

    def __init__(self, coordinator: Any) -> None:
        self.coordinator = coordinator
        self.plan = coordinator.plan
        self._trials = coordinator.trials
        self._changed = coordinator.ledger.watch_changes()
        self._snapshots: dict[int, TrialSnapshot] = {}
        self._figures = KeptFigures(self._snapshots)
        self._page = PageFigures(self._snapshots)
        self._tuple: tuple[TrialSnapshot, ...] = ()
        self._uses: Counter[str] = Counter()  # node -> trials whose segments pass it
        self._configs: dict[str, Config] = {}
        self._trained: dict[str, int] = {}
        self._nodes_changed: set[str] = set()
        self.plan.observers.append(self._observe)
        self._shown: tuple[MappingProxyType, MappingProxyType] | None = None  # the last copies
        self._keeper = object()
        self._version = 0
        self._recent: deque[tuple[TrialSnapshot, ...]] = deque(maxlen=CHANGES_KEPT)
        self.snapshotted = 0
        self.retrained = 0

    def close(self) -> None:
        """Stop listening (the study's coordinator was replaced)."""
        self.coordinator.ledger.unwatch_changes(self._changed)
        if self._observe in self.plan.observers:
            self.plan.observers.remove(self._observe)

    def _observe(self, what: str, node: str, step: int | None) -> None:
        if what in ("metrics", "checkpoint"):
            self._nodes_changed.add(node)

    def trials(self) -> tuple[TrialSnapshot, ...]:
        """Every trial's snapshot, in the coordinator's order of its trials."""
        changed, trials, kept = self._changed, self._trials, self._snapshots
        if not changed and len(kept) == len(trials):
            return self._tuple
        ids = set(changed)
        changed.clear()
        added = [i for i in ids if i not in kept]
        # trials only come at the end of the coordinator's: the new ones are its last ones
        tail = list(islice(reversed(trials), len(added)))[::-1]
        if len(kept) + len(added) != len(trials) or set(tail) != set(added):
            # trials came that the ledger did not tell of (the first view): snapshot them all
            for snapshot in kept.values():
                self._forget(snapshot)
            kept.clear()
            self._figures, self._page = KeptFigures(kept), PageFigures(kept)
            ids, tail = set(trials), list(trials)
            self._keeper, self._version = object(), 0
            self._recent.clear()
        for trial_id in tail:
            kept[trial_id] = None  # type: ignore[assignment]  # its place in the order
        for trial_id in ids:
            old = kept[trial_id]
            if old is not None:
                self._forget(old)
            new = kept[trial_id] = trials[trial_id].snapshot()
            self._use(new)
            self._figures.change(old, new)
            self._page.change(old, new)
        self.snapshotted += len(ids)
        self._tuple = tuple(kept.values())
        self._version += 1
        self._recent.append(tuple(kept[i] for i in ids))
        return self._tuple

    def changes(self) -> TrialChanges:
        """Which trials changed at the last versions, up to the last `trials`."""
        return TrialChanges(keeper=self._keeper, version=self._version, recent=tuple(self._recent))

    def report(self) -> MappingProxyType:
        """The coordinator's report (`Coordinator.report`) of the trials (as of the last
        `trials`), from figures kept as they change (`KeptFigures`)."""
        return MappingProxyType(self._figures.figures(**self.coordinator.dispatcher.work({})))

    def figures(self, metric: str | None, mode: str) -> ViewFigures:
        """The page's figures of the trials (as of the last `trials`): the best by `metric` and
        `mode` (where `metric` is None, by the metric guessed from the trials'), the live merge
        rate and the trials it is over, the trials by status, the failed ones and the
        hyper-parameters' names, from what is kept as they change."""
        page = self._page
        if metric is None:
            metric, mode = page.metric()
        rate, ended = self._figures.merge_rate_ended()
        failed, first = page.failed()
        return ViewFigures(
            metric=metric,
            mode=mode,
            best=page.best(metric, mode),
            merge_rate_ended=rate,
            ended=ended,
            statuses=MappingProxyType(page.statuses()),
            failed=failed,
            first_failed=first,
            hyper_parameters=page.hyper_parameters(),
        )

    def _forget(self, snapshot: TrialSnapshot) -> None:
        uses = self._uses
        for node, _, _ in snapshot.segments:
            uses[node] -= 1
            if not uses[node]:
                del uses[node]
                if node in self._configs:
                    del self._configs[node], self._trained[node]
                    self._shown = None

    def _use(self, snapshot: TrialSnapshot) -> None:
        uses, nodes = self._uses, self.plan.nodes
        for node, _, _ in snapshot.segments:
            uses[node] += 1
            if node not in self._configs and node in nodes:
                self._configs[node] = nodes[node].config
                self._trained[node] = trained_to(nodes[node])
                self.retrained += 1
                self._shown = None

    def nodes(self) -> tuple[MappingProxyType, MappingProxyType]:
        """The config and the last step trained of each plan node the trials' paths pass (as
        of the last `trials`), as read-only copies."""
        nodes, trained = self.plan.nodes, self._trained
        for node in self._nodes_changed:
            if node in trained:
                step = trained_to(nodes[node])
                self.retrained += 1
                if step != trained[node]:
                    trained[node] = step
                    self._shown = None
        self._nodes_changed.clear()
        if self._shown is None:  # something changed since the last copies
            self._shown = MappingProxyType(dict(self._configs)), MappingProxyType(dict(trained))
        return self._shown
