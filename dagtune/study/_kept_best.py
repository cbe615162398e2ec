"""The best trial of a study's view and the metric guessed from its trials, kept as trials
change (`KeptBest`), so that a page's snapshot after a few trials changed does not rank every
trial (`dagtune.summary.best_of` walked all of them at every snapshot; issue 24)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping

from sortedcontainers import SortedList

from dagtune.records import COMPLETED, TrialSnapshot
from dagtune.summary import best_key, pick_metric

__all__ = ["KeptBest"]


class KeptBest:
    """`dagtune.summary.best_of` of the trials in `trials` (a mapping kept by the caller) by one
    metric and mode, and `dagtune.summary.metric_of` of them, kept as each trial changes
    (`change`, with its snapshot before and after).

    Kept: how many points of the trials report each metric name; for the metric and mode
    last asked (`best`), each scored trial's rank (`dagtune.summary.best_key`) in two sorted
    lists, the completed trials' and all of them (`best_of` takes the best completed one, else
    the best of all). Asking for another metric or mode ranks every trial again, once.

    `read` counts the trials read (each change, and every trial of a ranking from scratch),
    for the tests that count what a view costs."""

    def __init__(self, trials: Mapping[int, TrialSnapshot]) -> None:
        self.trials = trials
        self._names: Counter[str] = Counter()
        self._by: tuple[str | None, str] | None = None  # the metric and mode ranked by
        self._ranks: dict[int, tuple[tuple, bool]] = {}  # trial id -> (rank, completed)
        self._completed = SortedList()  # (rank, id) of the completed scored trials
        self._scored = SortedList()  # (rank, id) of every scored trial
        self.read = 0

    def change(self, old: TrialSnapshot | None, new: TrialSnapshot) -> None:
        """A trial changed from `old` (None: it is new) to `new`."""
        self.read += 1
        if old is not None:
            self._names.subtract(self._names_of(old))
            self._unrank(old.id)
        self._names.update(self._names_of(new))
        if self._by is not None:
            self._rank(new)

    @staticmethod
    def _names_of(trial: TrialSnapshot) -> Iterable[str]:
        return (name for point in trial.points for name in point.names)

    def metric(self) -> tuple[str | None, str]:
        """`dagtune.summary.metric_of` of the trials: the metric a view shows when no
        algorithm named one, and its mode."""
        return pick_metric(name for name, count in self._names.items() if count > 0)

    def best(self, metric: str | None, mode: str) -> TrialSnapshot | None:
        """`dagtune.summary.best_of` of the trials by `metric` and `mode`."""
        if self._by != (metric, mode):
            self._by = (metric, mode)
            self._ranks.clear()
            self._completed.clear()
            self._scored.clear()
            for trial in self.trials.values():
                self._rank(trial)
            self.read += len(self.trials)
        pool = self._completed or self._scored
        return self.trials[pool[-1][-1]] if pool else None

    def _rank(self, trial: TrialSnapshot) -> None:
        assert self._by is not None
        rank = best_key(trial, *self._by)
        if rank is None:
            return
        completed = trial.status == COMPLETED
        self._ranks[trial.id] = (rank, completed)
        self._scored.add((rank, trial.id))
        if completed:
            self._completed.add((rank, trial.id))

    def _unrank(self, trial_id: int) -> None:
        found = self._ranks.pop(trial_id, None)
        if found is not None:
            rank, completed = found
            self._scored.remove((rank, trial_id))
            if completed:
                self._completed.remove((rank, trial_id))
