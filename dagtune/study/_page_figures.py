"""The page's figures of a study's trials, kept as trials change (`PageFigures`): the best
trial, the metric guessed from the trials, the trials by status, the failed ones and the
hyper-parameters' names, so that a page's snapshot after a few trials changed does not read
every trial for them (`dagtune.summary`'s `best_of`, `status_counts` and `failures` walked all
of them at every snapshot; issue 24)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping

from sortedcontainers import SortedList

from dagtune.records import COMPLETED, FAILED, STATUSES, TrialSnapshot
from dagtune.summary import best_key, pick_metric

__all__ = ["PageFigures"]


class PageFigures:
    """Of the trials in `trials` (a mapping kept by the caller), kept as each trial changes
    (`change`, with its snapshot before and after): `dagtune.summary.best_of` by one metric
    and mode, `dagtune.summary.metric_of`, `dagtune.summary.status_counts`, the failed trials
    (`dagtune.summary.failures`: how many, and the first by id) and the hyper-parameters'
    names.

    Kept: how many points of the trials report each metric name (a trial's points grow: only
    those new since its last snapshot are counted, unless they were replaced); the trials by
    status; the failed trials' ids, sorted; how many configs name each hyper-parameter; for the
    metric and mode
    last asked (`best`), each scored trial's rank (`dagtune.summary.best_key`) in two sorted
    lists, the completed trials' and all of them (`best_of` takes the best completed one, else
    the best of all). Asking for another metric or mode ranks every trial again, once.

    `read` counts the trials read (each change, and every trial of a ranking from scratch),
    for the tests that count what a view costs."""

    def __init__(self, trials: Mapping[int, TrialSnapshot]) -> None:
        self.trials = trials
        self._names: Counter[str] = Counter()
        self._statuses: dict[str, int] = dict.fromkeys(STATUSES, 0)
        self._failed = SortedList()  # ids of the failed trials
        self._hp: Counter[str] = Counter()
        self._by: tuple[str | None, str] | None = None  # the metric and mode ranked by
        self._ranks: dict[int, tuple[tuple, bool]] = {}  # trial id -> (rank, completed)
        self._completed = SortedList()  # (rank, id) of the completed scored trials
        self._scored = SortedList()  # (rank, id) of every scored trial
        self.read = 0

    def change(self, old: TrialSnapshot | None, new: TrialSnapshot) -> None:
        """A trial changed from `old` (None: it is new) to `new`."""
        self.read += 1
        if old is not None:
            self._count(old, -1)
            self._unrank(old.id)
        self._count(new, 1)
        seen = 0 if old is None else len(old.points)
        if seen and not (seen <= len(new.points) and new.points[seen - 1] is old.points[-1]):
            self._names.subtract(self._names_of(old.points))  # replaced, not grown
            seen = 0
        self._names.update(self._names_of(new.points[seen:]))
        if self._by is not None:
            self._rank(new)

    def _count(self, trial: TrialSnapshot, sign: int) -> None:
        self._statuses[trial.status] = self._statuses.get(trial.status, 0) + sign
        if trial.status == FAILED:
            if sign > 0:
                self._failed.add(trial.id)
            else:
                self._failed.remove(trial.id)
        for name in trial.config:
            self._hp[name] += sign

    @staticmethod
    def _names_of(points: Iterable) -> Iterable[str]:
        return (name for point in points for name in point.names)

    def statuses(self) -> dict[str, int]:
        """`dagtune.summary.status_counts` of the trials."""
        return {s: n for s, n in self._statuses.items() if n or s in STATUSES}

    def failed(self) -> tuple[int, TrialSnapshot | None]:
        """How many trials failed, and the first of them by id (None if none)."""
        return len(self._failed), self.trials[self._failed[0]] if self._failed else None

    def hyper_parameters(self) -> tuple[str, ...]:
        """The names of the trials' hyper-parameters, sorted."""
        return tuple(sorted(name for name, count in self._hp.items() if count > 0))

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
