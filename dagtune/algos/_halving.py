"""Successive halving on the stage tree: `SuccessiveHalving`, `Hyperband` and `ASHA`.

All three train configs in *rungs* of increasing steps and keep the best 1/eta of each rung.
On a trial-based system a promoted trial either restarts or copies a checkpoint; here a
promotion is an `Extend`: the trial's request simply grows, and the stage tree continues it
from the checkpoint its rung ended at (a request's end always has one). Configs that share a
prefix share its training in every rung, and Hyperband's brackets, which run concurrently,
share prefixes with each other through the search plan.

Promotions add no training beyond the unique steps, wherever configs branch. A stage that
passes a step where another config branches off saves a checkpoint there, so that config's
trial, promoted later, resumes at its branch step instead of retraining the shared prefix:
the coordinator knows the branch steps of the trials paused at a rung, and `ASHA`, which
draws configs lazily, names the configs it has not submitted yet as its `prospects` (for an
endless space, the next `ASHA.lookahead` configs it would draw; a config beyond those that
branches between rungs from a trial promoted earlier resumes from the latest checkpoint
before its branch step). `SuccessiveHalving` and `Hyperband` submit every config at the
start, so the search plan sees all their branch steps from the outset.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator
from typing import Any

from sortedcontainers import SortedList

from dagtune.algos._base import (
    Algorithm,
    Context,
    Decision,
    Extend,
    Submit,
    check_positive,
    configs_of,
    is_finite,
)
from dagtune.config import Config
from dagtune.records import COMPLETED, PENDING, Trial
from dagtune.validation import check_int

__all__ = ["ASHA", "ConfigSource", "Hyperband", "SuccessiveHalving"]


# --------------------------------------------------------------------------- shared helpers


class ConfigSource:
    """The configs of a search space, drawn lazily and in order.

    `sized` tells whether the space has a length (a `Grid`, a `Random` with ``n``, a list);
    an endless space (``Random(n=None)``, a generator) needs a step budget. An empty space is
    an error at construction, when the algorithm is built, not when it runs.
    """

    def __init__(self, space: Iterable[Any], owner: str):
        self.sized = is_finite(space)
        self._stream: Iterator[Config] = iter(configs_of(space, owner))
        self._ahead: deque[Config] = deque()  # configs drawn by `peek`, not taken yet
        self._next = next(self._stream, None)
        if self._next is None:
            raise ValueError(f"{owner}: the search space is empty")

    def next(self) -> Config | None:
        """The next config, or None once the space is exhausted."""
        if self._ahead:
            return self._ahead.popleft()
        config, self._next = self._next, None
        if config is not None:
            self._next = next(self._stream, None)
        return config

    def peek(self, n: int | None = None) -> list[Config]:
        """The next `n` configs (all that are left for None) without taking them: `next`
        still returns them, in order. An endless space needs `n`."""
        if n is None and not self.sized:
            raise ValueError("an endless search space can only be looked ahead a bounded number of configs")
        while n is None or len(self._ahead) < n:
            config, self._next = self._next, None
            if config is None:
                break
            self._next = next(self._stream, None)
            self._ahead.append(config)
        return list(self._ahead)[:n]

    def take(self, n: int | None = None) -> list[Config]:
        """The next `n` configs (fewer if the space runs out; all of them for None)."""
        configs: list[Config] = []
        while n is None or len(configs) < n:
            config = self.next()
            if config is None:
                break
            configs.append(config)
        return configs


def check_steps(owner: str, min_steps: int, max_steps: int, eta: int | None = None) -> None:
    """Validate a rung schedule's arguments, naming the offending one."""
    check_positive(owner, min_steps=min_steps, max_steps=max_steps)
    if min_steps > max_steps:
        raise ValueError(f"{owner}: min_steps={min_steps} must not exceed max_steps={max_steps}")
    if eta is not None:
        check_int(f"{owner}.eta", eta, minimum=2)


def rung_steps(min_steps: int, max_steps: int, eta: int) -> list[int]:
    """``min_steps * eta**k`` for k = 0, 1, ... below `max_steps`, then `max_steps`."""
    rungs, steps = [], min_steps
    while steps < max_steps:
        rungs.append(steps)
        steps *= eta
    return [*rungs, max_steps]


def hyperband_brackets(min_steps: int, max_steps: int, eta: int) -> list[tuple[int, list[int]]]:
    """Hyperband's brackets s = s_max..0 (Li et al. 2018) as ``(n, rung steps)``.

    ``s_max`` is the largest s with ``min_steps * eta**s <= max_steps``; bracket s starts
    ``n = ceil((s_max + 1) / (s + 1) * eta**s)`` configs at ``max_steps * eta**-s`` steps and
    its rung i trains to ``max_steps * eta**(i - s)`` (rounded to whole steps).
    """
    s_max = 0
    while min_steps * eta ** (s_max + 1) <= max_steps:
        s_max += 1
    brackets = []
    for s in range(s_max, -1, -1):
        n = -(-(s_max + 1) * eta**s // (s + 1))
        rungs = [(2 * max_steps + eta**j) // (2 * eta**j) for j in range(s, -1, -1)]
        brackets.append((n, rungs))
    return brackets


def _reached(trial: Trial, steps: int) -> bool:
    """The trial is done with a request of `steps` (completed there, or ended)."""
    return trial.status != PENDING and (trial.status != COMPLETED or trial.steps >= steps)


# --------------------------------------------------------------------------- synchronous


class _Bracket:
    """One synchronous successive-halving bracket: its configs go through `rungs` together,
    the best ``max(1, floor(n_k / eta))`` of rung k's n_k trials continuing to rung k + 1."""

    def __init__(self, algorithm: Algorithm, tag: int, configs: list[Config], rungs: list[int], eta: int):
        self.algorithm = algorithm
        self.tag = tag
        self.configs = configs
        self.rungs = rungs
        self.eta = eta
        self.rung = 0
        self.members: list[Trial] = []  # the trials of the current rung (rung 0: as they arrive)
        self.size = len(configs)  # how many the current rung has

    def start(self) -> list[Decision]:
        return [Submit(config, self.rungs[0], self.tag) for config in self.configs]

    def on_done(self, trial: Trial) -> list[Decision]:
        """A trial of this bracket completed or ended; promote once the whole rung is done."""
        if self.rung == 0 and trial not in self.members:
            self.members.append(trial)
        steps = self.rungs[self.rung]
        if len(self.members) < self.size or not all(_reached(t, steps) for t in self.members):
            return []
        if self.rung == len(self.rungs) - 1:
            return []
        completed = [t for t in self.members if t.status == COMPLETED]
        survivors = self.algorithm.top(completed, max(1, len(self.members) // self.eta))
        self.rung += 1
        self.members, self.size = survivors, len(survivors)
        return [Extend(t.id, self.rungs[self.rung]) for t in survivors]


class _Synchronous(Algorithm):
    """Runs synchronous brackets side by side; a trial's tag names its bracket."""

    brackets: list[_Bracket]

    def start(self, ctx: Context) -> list[Decision]:
        return [decision for bracket in self.brackets for decision in bracket.start()]

    def on_result(self, trial: Trial, step: int, metrics: dict[str, float]) -> None:
        self.check_metric(metrics)

    def on_complete(self, trial: Trial) -> list[Decision]:
        return self.brackets[trial.tag].on_done(trial)

    def on_end(self, trial: Trial) -> list[Decision]:
        self.check_ended(trial)
        return self.brackets[trial.tag].on_done(trial)


class SuccessiveHalving(_Synchronous):
    """Synchronous successive halving (Jamieson & Talwalkar 2016; Li et al. 2020, Alg. 1).

    `n` configs of `space` (default: all of a finite space) train to ``min_steps``; rung k
    trains the survivors to ``r_k = min_steps * eta**k`` steps, capped at `max_steps` (the
    last rung is `max_steps`). Once every trial of a rung is done, the best
    ``max(1, floor(n_k / eta))`` are promoted with `Extend`: they continue from their
    checkpoint at ``r_k``, never restart. So rung k holds ``max(1, floor(n / eta**k))``
    trials and costs ``n_k * (r_k - r_{k-1})`` steps.
    """

    def __init__(
        self,
        space: Iterable[Any],
        metric: str,
        mode: str = "max",
        *,
        max_steps: int,
        min_steps: int = 1,
        eta: int = 3,
        n: int | None = None,
    ):
        super().__init__(metric, mode)
        owner = type(self).__name__
        check_steps(owner, min_steps, max_steps, eta)
        check_positive(owner, n=n)
        source = ConfigSource(space, owner)
        if n is None and not source.sized:
            raise ValueError(f"{owner}: an endless search space needs n (how many configs to draw)")
        self.rungs = rung_steps(min_steps, max_steps, eta)
        self.brackets = [_Bracket(self, 0, source.take(n), self.rungs, eta)]


class Hyperband(_Synchronous):
    """Hyperband (Li et al. 2018): successive-halving brackets from aggressive to none.

    Bracket s = s_max..0 draws ``n = ceil((s_max + 1) / (s + 1) * eta**s)`` configs from
    `space` (in order, bracket s_max first) and runs successive halving from
    ``r = max_steps * eta**-s`` steps to `max_steps`, keeping ``floor(n_i / eta)`` per rung.
    All brackets start at once and run concurrently: their configs share prefixes through
    the search plan, so a config two brackets both train is trained once. If a finite space
    runs out, the later brackets get fewer configs (or none).

    With the defaults (``min_steps=1, max_steps=81, eta=3``; 143 configs, 1,581 trial steps)
    the brackets are, as ``n_i x r_i`` per rung::

        s=4:  81x1   27x3   9x9   3x27   1x81
        s=3:  34x3   11x9   3x27  1x81
        s=2:  15x9    5x27  1x81
        s=1:   8x27   2x81
        s=0:   5x81
    """

    def __init__(
        self,
        space: Iterable[Any],
        metric: str,
        mode: str = "max",
        *,
        max_steps: int = 81,
        min_steps: int = 1,
        eta: int = 3,
    ):
        super().__init__(metric, mode)
        check_steps(type(self).__name__, min_steps, max_steps, eta)
        source = ConfigSource(space, type(self).__name__)
        self.brackets = []
        for n, rungs in hyperband_brackets(min_steps, max_steps, eta):
            configs = source.take(n)
            if configs:
                self.brackets.append(_Bracket(self, len(self.brackets), configs, rungs, eta))


# --------------------------------------------------------------------------- asynchronous


class ASHA(Algorithm):
    """Asynchronous successive halving (Li et al. 2020, Alg. 2), promotion-based.

    Rungs are as in `SuccessiveHalving`: ``r_k = min_steps * eta**k``, capped at `max_steps`.
    ASHA keeps ``ctx.slots`` trials working, and more while workers are idle (trials sharing
    prefixes run as fewer stages than trials). Whenever one completes a rung (or ends), or a
    worker is idle, each free slot gets a promotion if there is one, from the highest rung down: a trial among
    the top ``floor(n_k / eta)`` of the n_k results of rung k so far, not yet promoted, is
    extended to ``r_{k+1}``; otherwise a new config from `space` starts at ``r_0``. Ranks use
    each trial's metrics at the rung's step.

    Ray Tune's ASHA can only stop a trial (a promotion missed is lost); here a trial pauses
    at its rung, holding a checkpoint, and is promoted later if others do worse. When the
    space (or `budget`: total trial steps it may request, promotions included) is exhausted
    and nothing is working, each rung that has promoted no trial yet promotes its best, as
    `SuccessiveHalving` keeps at least one: so even a small space gets a config to
    `max_steps`. The run ends when nothing is promotable and nothing is pending. An endless
    space needs a `budget`.

    Its `prospects` are the configs of `space` it has not submitted yet (of an endless space,
    the next ``min(lookahead, budget // min_steps)``), so a stage that a promotion trains
    past the branch step of a config submitted later saves a checkpoint there, and that
    config's own promotion later trains nothing twice.
    """

    lookahead = 1000  # prospects drawn ahead of an endless space

    def __init__(
        self,
        space: Iterable[Any],
        metric: str,
        mode: str = "max",
        *,
        max_steps: int,
        min_steps: int = 1,
        eta: int = 3,
        budget: int | None = None,
    ):
        super().__init__(metric, mode)
        owner = type(self).__name__
        check_steps(owner, min_steps, max_steps, eta)
        check_positive(owner, budget=budget)
        self.source = ConfigSource(space, owner)
        if budget is None and not self.source.sized:
            raise ValueError(f"{owner}: an endless search space needs a budget (total trial steps)")
        self.rungs = rung_steps(min_steps, max_steps, eta)
        self.eta = eta
        self.budget = budget
        self.requested = 0  # trial steps requested so far
        self.results: list[dict[int, float]] = [{} for _ in self.rungs]  # rung -> trial id -> score
        self.promoted: list[set[int]] = [set() for _ in self.rungs]
        # per rung, (-score, trial id) of every result and of those not promoted yet, sorted: a
        # promotion reads the best waiting one and its rank instead of sorting the rung
        self._ranked = [SortedList() for _ in self.rungs]
        self._waiting = [SortedList() for _ in self.rungs]
        self._working = 0  # decisions whose trial has not completed or ended yet
        self._slots = 1

    def start(self, ctx: Context) -> list[Decision]:
        self._slots = ctx.slots
        return self._fill()

    def prospects(self) -> list[Config]:
        """The configs not submitted yet (a bounded look-ahead of an endless space)."""
        if self.source.sized:
            return self.source.peek()
        assert self.budget is not None
        return self.source.peek(min(self.lookahead, (self.budget - self.requested) // self.rungs[0]))

    def on_result(self, trial: Trial, step: int, metrics: dict[str, float]) -> None:
        self.check_metric(metrics)

    def on_complete(self, trial: Trial) -> list[Decision]:
        self._working -= 1
        self._record(self.rungs.index(trial.steps), trial.id, self.score(trial.metrics))
        return self._fill()

    def _record(self, rung: int, trial_id: int, score: float) -> None:
        old = self.results[rung].get(trial_id)
        if old is not None:
            self._ranked[rung].remove((-old, trial_id))
            self._waiting[rung].discard((-old, trial_id))
        self.results[rung][trial_id] = score
        key = (-score, trial_id)  # one tuple for both lists (a trial never promoted keeps both)
        self._ranked[rung].add(key)
        if trial_id not in self.promoted[rung]:
            self._waiting[rung].add(key)

    def on_end(self, trial: Trial) -> list[Decision]:
        self.check_ended(trial)
        self._working -= 1
        return self._fill()

    def on_idle(self, free: int) -> list[Decision]:
        """Workers idle although `ctx.slots` trials work (they share prefixes): like a free
        worker in ASHA, each gets a promotion or a new config."""
        decisions: list[Decision] = []
        for _ in range(free):
            decision = self._next_decision()
            if decision is None:
                break
            self._working += 1
            decisions.append(decision)
        return decisions

    def promotable(self, rung: int, at_least: int = 0) -> list[int]:
        """Trials of `rung` in its top ``max(at_least, floor(n / eta))`` so far and not yet
        promoted, best first."""
        return list(self._promotable(rung, at_least))

    def _promotable(self, rung: int, at_least: int) -> Iterator[int]:
        """`promotable`, lazily: O(log n) per trial read."""
        ranked = self._ranked[rung]
        top = max(at_least, len(ranked) // self.eta)
        for key in self._waiting[rung]:
            if ranked.bisect_left(key) >= top:  # every better result is promoted: its rank
                return
            yield key[1]

    def _affordable(self, steps: int) -> bool:
        return self.budget is None or self.requested + steps <= self.budget

    def _promotion(self, at_least: int = 0) -> Extend | None:
        for rung in range(len(self.rungs) - 2, -1, -1):
            steps = self.rungs[rung + 1] - self.rungs[rung]
            best = next(self._promotable(rung, at_least), None)
            if best is not None and self._affordable(steps):
                self.promoted[rung].add(best)
                self._waiting[rung].remove((-self.results[rung][best], best))
                self.requested += steps
                return Extend(best, self.rungs[rung + 1])
        return None

    def _new_config(self) -> Submit | None:
        config = self.source.next() if self._affordable(self.rungs[0]) else None
        if config is None:
            return None
        self.requested += self.rungs[0]
        return Submit(config, self.rungs[0])

    def _next_decision(self) -> Decision | None:
        decision = self._promotion() or self._new_config()
        if decision is None and self._working == 0:
            decision = self._promotion(at_least=1)  # nothing else left: the best goes on
        return decision

    def _fill(self) -> list[Decision]:
        decisions: list[Decision] = []
        while self._working < self._slots:
            decision = self._next_decision()
            if decision is None:
                break
            self._working += 1
            decisions.append(decision)
        return decisions
