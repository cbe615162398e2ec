"""Population-based training (Jaderberg et al. 2017) as sequences on the stage tree.

In PBT a poor member copies a good member's weights (*exploit*) and goes on with perturbed
hyper-parameters (*explore*). Here hyper-parameters are sequences, so an exploit is simply a
new trial whose config follows the donor's sequences up to step t and new values from t on:
``Piecewise((0, donor_sequence), (t, new_sequence))``. Its prefix equals the donor's, so the
search plan branches it at t from the donor's checkpoint: no file is copied, nothing is
trained again, and every member's lineage is an ordinary, reproducible config.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from dagtune.algos._base import Algorithm, Context, Decision, Extend, Submit, check_positive
from dagtune.algos._halving import ConfigSource
from dagtune.config import Config
from dagtune.records import COMPLETED, Trial
from dagtune.sequences import Constant, Piecewise, Sequence
from dagtune.space import Random
from dagtune.validation import check_int, is_number

__all__ = ["PBT", "Exploit"]


@dataclass(frozen=True)
class Exploit:
    """The tag of a trial made by an exploit: it continues `donor` from `step` on, in place
    of the member `replaced`."""

    donor: int
    step: int
    replaced: int


def continued(sequence: Sequence, step: int, then: Sequence) -> Piecewise:
    """`sequence` until `step`, then `then` (restarting its clock at `step`), flat."""
    if isinstance(sequence, Piecewise):
        items = [(m, s) for m, s in sequence.items if m < step]
    else:
        items = [(0, sequence)]
    return Piecewise(*items, (step, then))


class PBT(Algorithm):
    """Synchronous population-based training with sequences as lineages.

    The first `population` configs of `space` train for `interval` steps. Every `interval`
    steps, once every member has paused there (its request ends at the interval, with a
    checkpoint), the members are ranked by `metric`. Each member in the bottom `quantile`
    (and any member that failed or diverged) is replaced by a new trial exploiting a member
    drawn uniformly from the top `quantile`: the donor's config up to step t and, from t on,
    for every hyper-parameter in `mutate`, the donor's value at t multiplied by a factor
    drawn from `factors` (numbers; ints are rounded) or, with probability
    `resample_probability` and always for strings and booleans, a sequence drawn afresh from
    `space`. Hyper-parameters not in `mutate` keep the donor's sequence. The other members
    continue with `Extend`. Everything stops at `max_steps`.

    `space` is a `dt.Random` (redraws come from a sampler seeded by `seed`), a `dt.Grid` or
    any finite iterable of configs (redraws pick a config of it uniformly and take that
    hyper-parameter's sequence). `mutate` defaults to the hyper-parameters whose sequences
    differ within the initial population. Waiting for the whole population at each interval
    (as Ray Tune's ``PopulationBasedTraining(synch=True)``) makes every exploit see the same
    ranking and lets the search plan know every branch of a generation before it trains.
    `seed` (default: the study's) fixes the draws, so a run is deterministic for a given seed.
    """

    def __init__(
        self,
        space: Iterable[Any],
        metric: str,
        mode: str = "max",
        *,
        max_steps: int,
        interval: int,
        population: int = 8,
        quantile: float = 0.25,
        resample_probability: float = 0.25,
        factors: Iterable[float] = (0.8, 1.2),
        mutate: Iterable[str] | None = None,
        seed: int | None = None,
    ):
        super().__init__(metric, mode)
        owner = type(self).__name__
        check_positive(owner, max_steps=max_steps, interval=interval, population=population)
        if interval > max_steps:
            raise ValueError(f"{owner}: interval={interval} must not exceed max_steps={max_steps}")
        if not 0 < quantile <= 0.5:
            raise ValueError(f"{owner}.quantile must be in (0, 0.5], got {quantile!r}")
        if not 0 <= resample_probability <= 1:
            raise ValueError(f"{owner}.resample_probability must be in [0, 1], got {resample_probability!r}")
        self.factors = tuple(factors)
        if not self.factors or not all(is_number(f) and f > 0 for f in self.factors):
            raise ValueError(f"{owner}.factors must be positive numbers, got {factors!r}")
        check_int(f"{owner}.seed", seed, optional=True)
        self.space = space
        source = ConfigSource(space, owner)
        self.initial = source.take(population)
        if len(self.initial) < population:
            raise ValueError(
                f"{owner}: population={population} but the search space has only {len(self.initial)} configs"
            )
        names = self.initial[0].keys()
        if mutate is None:
            mutate = [n for n in names if len({c[n] for c in self.initial}) > 1]
        self.mutate = tuple(mutate)
        unknown = sorted(set(self.mutate) - set(names))
        if unknown:
            raise ValueError(
                f"{owner}.mutate names unknown hyper-parameters {unknown}; configs have {sorted(names)}"
            )
        self._pool = [] if isinstance(space, Random) else [*self.initial, *source.take()]
        self.max_steps, self.interval, self.quantile = max_steps, interval, quantile
        self.resample_probability = resample_probability
        self.seed = seed
        self.step = 0  # the step the current generation trains to
        self._waiting = 0  # decisions of this generation whose trial has not arrived yet
        self._arrived: list[Trial] = []
        self._rng = np.random.default_rng(0)
        self._sampler: Iterator[Config] | None = None

    def start(self, ctx: Context) -> list[Decision]:
        self._rng = np.random.default_rng(ctx.seed if self.seed is None else self.seed)
        if isinstance(self.space, Random):
            self._sampler = self.space.sampler(int(self._rng.integers(2**32)))
        self.step = min(self.interval, self.max_steps)
        return self._generation([Submit(config, self.step) for config in self.initial])

    def on_result(self, trial: Trial, step: int, metrics: dict[str, float]) -> None:
        self.check_metric(metrics)

    def on_complete(self, trial: Trial) -> list[Decision]:
        self._arrived.append(trial)
        self._waiting -= 1
        return self._next_generation() if self._waiting == 0 else []

    def on_end(self, trial: Trial) -> list[Decision]:
        self.check_ended(trial)
        return self.on_complete(trial)

    def _generation(self, decisions: list[Decision]) -> list[Decision]:
        self._waiting, self._arrived = len(decisions), []
        return decisions

    def _next_generation(self) -> list[Decision]:
        members = sorted(self._arrived, key=lambda t: (-self._rank_score(t), t.id))
        alive = [t for t in members if t.status == COMPLETED]
        if self.step >= self.max_steps or not alive:
            return []
        t, self.step = self.step, min(self.step + self.interval, self.max_steps)
        n = math.ceil(len(members) * self.quantile)
        n = min(n, len(members) // 2)
        top = alive[: max(n, 1)]
        bottom = set(members[len(members) - n :] if n else []) | {m for m in members if m.status != COMPLETED}
        decisions: list[Decision] = []
        for member in members:
            if member in bottom:
                donor = top[int(self._rng.integers(len(top)))]
                tag = Exploit(donor.id, t, member.id)
                decisions.append(Submit(self.explore(donor.config, t), self.step, tag))
            else:
                decisions.append(Extend(member.id, self.step))
        return self._generation(decisions)

    def _rank_score(self, trial: Trial) -> float:
        return self.score(trial.metrics) if trial.status == COMPLETED else -math.inf

    def explore(self, config: Config, step: int) -> Config:
        """The donor's `config` until `step`, mutated from `step` on."""
        explored = dict(config)
        for name in self.mutate:
            value = config[name](step)
            numeric = is_number(value)
            if not numeric or self._rng.random() < self.resample_probability:
                then = self._resample(name)
            else:
                factor = self.factors[int(self._rng.integers(len(self.factors)))]
                then = Constant(round(value * factor) if isinstance(value, int) else value * factor)
            explored[name] = continued(config[name], step, then)
        return explored

    def _resample(self, name: str) -> Sequence:
        """A sequence for `name` drawn afresh from the space."""
        if self._sampler is not None:
            return next(self._sampler)[name]
        return self._pool[int(self._rng.integers(len(self._pool)))][name]
