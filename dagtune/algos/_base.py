"""The interface every tuning algorithm implements.

An algorithm is a policy: it sees results and answers with decisions, as values. The study
is the mechanism: it turns decisions into requests in the search plan, runs them on the
stage tree, and calls the algorithm back. So an algorithm never trains, waits or talks to
Dask, works unchanged on the Dask and the simulated executor, and is deterministic for a
given seed and order of results.

Decisions:

- ``Submit(config, steps, tag=None)``: a new trial. Everything it shares with earlier
  trials (of this study or any other of the same model) is not trained again.
- ``Extend(trial_id, steps)``: train a completed trial further (a promotion): it continues
  from its checkpoint as a child stage.
- ``Stop(trial_id)``: cancel a pending trial; stages other trials need keep running.

A minimal algorithm::

    class TopHalf(Algorithm):
        def start(self, ctx):
            return [Submit(c, 10) for c in self.space]

        def on_complete(self, trial):
            done = [t for t in self.trials if t.status == "completed" and t.steps == 10]
            if len(done) < len(self.trials):
                return []
            return [Extend(t.id, 40) for t in self.top(done, len(done) // 2)]
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable, Iterator, Sized
from dataclasses import dataclass
from typing import Any

from dagtune.config import Config, normalize_config
from dagtune.errors import DagtuneWarning
from dagtune.records import COMPLETED, Trial
from dagtune.space import SearchSpace
from dagtune.validation import check_int

__all__ = ["Algorithm", "Context", "Decision", "Extend", "MissingMetricWarning", "Stop", "Submit"]


class MissingMetricWarning(DagtuneWarning):
    """A result lacks the algorithm's metric after the first had it: the algorithm counts
    it as the worst value (a trainer that returns the metric only at some steps)."""


@dataclass(frozen=True)
class Submit:
    config: Any
    steps: int
    tag: Any = None


@dataclass(frozen=True)
class Extend:
    trial: int
    steps: int


@dataclass(frozen=True)
class Stop:
    trial: int


Decision = Submit | Extend | Stop


@dataclass(frozen=True)
class Context:
    """What an algorithm may know about where it runs."""

    slots: int  # tasks the executor can run at once (workers, or GPUs / GPUs per task)
    seed: int  # the study's seed


class Algorithm:
    """Base class of tuning algorithms: override `start` and the callbacks you need.

    `metric` names the metric to optimize and `mode` is ``"max"`` or ``"min"``. Callbacks
    return a list of decisions (or None for none). ``self.trials`` lists the trials this
    algorithm submitted, in order.
    """

    def __init__(self, metric: str, mode: str = "max"):
        if not isinstance(metric, str) or not metric:
            raise ValueError(f"metric must be a metric name, got {metric!r}")
        if mode not in ("max", "min"):
            raise ValueError(f"mode must be 'max' or 'min', got {mode!r}")
        self.metric = metric
        self.mode = mode
        self.trials: list[Trial] = []
        self._checked_metric = False
        self._warned_missing = False  # MissingMetricWarning given

    # ---- the callbacks

    def start(self, ctx: Context) -> Iterable[Decision] | None:
        """The first decisions, when the study starts running this algorithm."""
        return None

    def on_result(self, trial: Trial, step: int, metrics: dict[str, float]) -> Iterable[Decision] | None:
        """A trial reported metrics after `step` steps."""
        return None

    def on_complete(self, trial: Trial) -> Iterable[Decision] | None:
        """A trial reached its requested steps (it may be extended later)."""
        return None

    def on_end(self, trial: Trial) -> Iterable[Decision] | None:
        """A trial stopped, failed or diverged. An override should call
        ``self.check_ended(trial)`` first, as this default does."""
        self.check_ended(trial)
        return None

    def on_idle(self, free: int) -> Iterable[Decision] | None:
        """`free` worker slots have nothing to run. Trials that share prefixes leave workers
        idle that a trial-based system would keep busy; an asynchronous algorithm (ASHA) can
        start more trials here. Called again after every change while slots stay free."""
        return None

    def prospects(self) -> Iterable[Any]:
        """Configs this algorithm may still submit, asked once when the run starts (optional).

        An algorithm that submits configs lazily (ASHA) and promotes trials later knows more
        of its space than the search plan does; shared stages save a checkpoint where one of
        these would branch off, so its trial later trains nothing twice.
        """
        return ()

    def best_trial(self) -> Trial | None:
        """The trial the algorithm considers its answer (`Result.best`), or None to let the
        result pick the best final metric."""
        return None

    def is_finished(self) -> bool:
        """True to end the run now (pending trials are stopped). The run also ends by itself
        when no trial of the algorithm is pending and the last callbacks decided nothing."""
        return False

    # ---- helpers for subclasses

    def score(self, metrics: dict[str, float] | None) -> float:
        """The metric as a number to maximize (negated for ``min``); -inf if missing/NaN."""
        if not metrics:
            return -math.inf
        value = metrics.get(self.metric)
        if value is None or math.isnan(value):
            return -math.inf
        return value if self.mode == "max" else -value

    def better(self, a: float, b: float) -> bool:
        """Whether metric value `a` is better than `b` under `mode`."""
        return a > b if self.mode == "max" else a < b

    def top(self, trials: Iterable[Trial], k: int) -> list[Trial]:
        """The `k` best trials by their latest metrics (ties broken by trial id)."""
        return sorted(trials, key=lambda t: (-self.score(t.metrics), t.id))[:k]

    def check_metric(self, metrics: dict[str, float]) -> None:
        """Raise a clear error if the first result lacks `metric` (misspelled, or not returned
        at every step); warn once (`MissingMetricWarning`) if a later one does: `score`
        counts it as the worst value, which would otherwise stop or pass over a trial silently."""
        if not self._checked_metric:
            if self.metric not in metrics:
                raise ValueError(
                    f"{type(self).__name__}: metric {self.metric!r} is not among the reported "
                    f"metrics {sorted(metrics)} of the first result: is it misspelled, or does the "
                    "trainer return it only at some steps? evaluate() (or train()) must return it "
                    "at every step"
                )
            self._checked_metric = True
        elif self.metric not in metrics and not self._warned_missing:
            self._warned_missing = True
            warnings.warn(
                f"{type(self).__name__}: a result lacks metric {self.metric!r} (it has "
                f"{sorted(metrics)}); the algorithm counts it as the worst value of "
                f"{self.metric!r}: evaluate() (or train()) must return it at every step",
                MissingMetricWarning,
                stacklevel=2,
            )

    def check_ended(self, trial: Trial) -> None:
        """`check_metric` for a trial that ended: a non-finite result never reaches
        `on_result` (the trial is diverged and `on_end` is called), so if every trial diverges
        at once only their last metrics, in ``trial.metrics``, show a misspelled metric."""
        if trial.metrics:
            self.check_metric(trial.metrics)

    @property
    def completed(self) -> list[Trial]:
        return [t for t in self.trials if t.status == COMPLETED]


def configs_of(space: Iterable[Any], owner: str) -> Iterator[Config]:
    """Normalized configs from a search space (whose configs are normalized already) or any
    iterable of config dicts, one at a time."""
    if isinstance(space, SearchSpace):
        yield from space
        return
    for config in space:
        yield normalize_config(config, owner=owner)


def is_finite(space: Iterable[Any]) -> bool:
    """Whether `space` ends: a finite `SearchSpace`, or any sized iterable (a list); answered
    without counting it (``len`` of a filtered grid is a pass over the product)."""
    return space.finite if isinstance(space, SearchSpace) else isinstance(space, Sized)


def check_positive(owner: str, **values: Any) -> None:
    for name, value in values.items():
        if value is not None:
            check_int(f"{owner}.{name}", value, minimum=1)
