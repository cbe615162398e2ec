"""Bayesian optimization with a Gaussian process, optionally with ASHA-style early stopping.

`BayesOpt` models the metric over the numeric and categorical distributions of a
`dt.Random` space (see `ParamSpace`: the init of ``MultiStep(loguniform(...), ...)``, a
``uniform`` momentum, a ``choice`` of batch sizes, ...), encoded in the unit cube with log
scaling for `loguniform` and one-hot blocks for `choice`. It starts with `n_initial` random
trials, then suggests the point of maximum expected improvement under a scikit-learn
`GaussianProcessRegressor` (Matern 5/2 kernel with one length scale per column, plus white
noise), keeping one trial per executor slot in flight; the trials still running enter the
model as *kriging believers* (their predicted mean), so parallel suggestions spread out.

Targets are ranks, not raw values: each trial's rank is mapped to a standard-normal
quantile (a Gaussian copula). One diverging loss of 1e30 then cannot flatten the model,
and trials that have no final value still take a place in the order: completed trials
(by final metric) rank above trials stopped early (those stopped at a later rung above
those stopped sooner, then by their metric at that rung), which rank above diverged or
failed trials. So a stopped trial is a *penalized* point: the model learns that its region
is worse than every completed trial, which is what the early stop concluded, without
pretending to know its final value.

Early stopping (``early_stopping="asha"``) is the stopping form of ASHA: rungs at
``min_steps * eta**k`` steps; a trial reaching a rung is stopped unless its metric is in the
top ``1/eta`` of the values recorded at that rung so far (the ``1 - 1/eta`` quantile, as Ray
Tune's ASHA scheduler does). A stopped trial frees its slot for the next suggestion.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from dagtune.algos._base import Algorithm, Context, Decision, Stop, Submit, check_positive
from dagtune.algos._params import CATEGORICAL, ParamSpace
from dagtune.records import COMPLETED, STOPPED, Trial
from dagtune.space import Random
from dagtune.validation import check_int, check_number

if TYPE_CHECKING:
    from sklearn.gaussian_process import GaussianProcessRegressor
    from sklearn.gaussian_process.kernels import Kernel

# scipy and scikit-learn are imported where a model is fitted or scored: importing them costs
# almost a second, which every `dagtune run` and every process importing `dagtune.algos` would
# pay for an algorithm most studies do not use.

__all__ = ["BayesOpt", "expected_improvement"]

_LOCAL_SEEDS, _LOCAL_MOVES, _LOCAL_SCALE = 5, 64, 0.05


def expected_improvement(mean: np.ndarray, std: np.ndarray, best: float, xi: float = 0.0) -> np.ndarray:
    """Expected improvement over `best` of a maximized Gaussian prediction."""
    from scipy.stats import norm

    std = np.maximum(std, 1e-12)
    improvement = mean - best - xi
    z = improvement / std
    return improvement * norm.cdf(z) + std * norm.pdf(z)


def _copula(keys: list[tuple]) -> np.ndarray:
    """Standard-normal quantiles of the ranks of `keys` (ties share a rank)."""
    from scipy.stats import norm, rankdata

    order = {key: i for i, key in enumerate(sorted(set(keys)))}
    ranks = rankdata([order[key] for key in keys])
    return norm.ppf((ranks - 0.5) / len(keys))


class BayesOpt(Algorithm):
    """Gaussian-process Bayesian optimization of `n` trials of `steps` steps over `space`.

    `space` is a `dt.Random` (its `where` filter is honoured) or a dict of name ->
    distribution / template sequence. `n_initial` trials (default: ``max(4, 2 * columns)``,
    at most `n`) are random; `candidates` random points plus a local refinement around the
    best of them are scored by expected improvement (`xi` is its exploration margin, in
    units of the normalized target). ``early_stopping="asha"`` stops trials at rungs
    ``min_steps * eta**k`` (see the module docstring). Deterministic for a `seed` and an
    order of results.
    """

    def __init__(
        self,
        space: Random | Mapping[str, Any],
        metric: str,
        mode: str = "max",
        steps: int = 1,
        n: int = 20,
        n_initial: int | None = None,
        seed: int = 0,
        early_stopping: str | None = None,
        min_steps: int = 1,
        eta: int = 3,
        candidates: int = 1000,
        xi: float = 0.01,
    ):
        super().__init__(metric, mode)
        owner = type(self).__name__
        check_positive(
            owner, steps=steps, n=n, n_initial=n_initial, min_steps=min_steps, candidates=candidates
        )
        check_int(f"{owner}.seed", seed)
        if early_stopping not in (None, "asha"):
            raise ValueError(f"{owner}.early_stopping must be None or 'asha', got {early_stopping!r}")
        check_int(f"{owner}.eta", eta, minimum=2)
        if early_stopping and min_steps >= steps:
            raise ValueError(
                f"{owner}.min_steps must be less than steps={steps} to leave a rung, got {min_steps!r}"
            )
        check_number(f"{owner}.xi", xi, minimum=0, finite=False)
        self.params = ParamSpace(space, owner)
        self.steps = steps
        self.n = n
        self.n_initial = min(n, n_initial or max(4, 2 * self.params.dims))
        self.seed = seed
        self.candidates = candidates
        self.xi = float(xi)
        self.rungs: tuple[int, ...] = ()
        if early_stopping:
            rungs, rung = [], min_steps
            while rung < steps:
                rungs.append(rung)
                rung *= eta
            self.rungs = tuple(rungs)
        self.eta = eta
        self._rng = np.random.default_rng(seed)
        self._numeric = np.concatenate([np.full(p.width, p.kind != CATEGORICAL) for p in self.params.params])
        self._points: list[np.ndarray] = []  # by suggestion index (the trial's tag)
        self._outcomes: dict[int, tuple] = {}  # tag -> rank key (see `_copula`)
        self._in_flight: set[int] = set()
        self._slots = 1
        self._rung_scores: dict[int, list[float]] = {rung: [] for rung in self.rungs}
        self._stopped_at: dict[int, tuple[int, float]] = {}
        self._kernel: Kernel | None = None  # the last fitted kernel

    # ---- callbacks

    def start(self, ctx: Context) -> list[Decision]:
        self._slots = ctx.slots
        return self._refill()

    def on_result(self, trial: Trial, step: int, metrics: dict[str, float]) -> list[Decision]:
        self.check_metric(metrics)
        if step not in self._rung_scores:
            return []
        score = self.score(metrics)
        recorded = self._rung_scores[step]
        recorded.append(score)
        if score < np.quantile(recorded, 1.0 - 1.0 / self.eta):
            self._stopped_at[trial.tag] = (self.rungs.index(step), score)
            return [Stop(trial.id)]
        return []

    def on_complete(self, trial: Trial) -> list[Decision]:
        return self._finished(trial)

    def on_end(self, trial: Trial) -> list[Decision]:
        self.check_ended(trial)
        return self._finished(trial)

    # ---- bookkeeping

    def _finished(self, trial: Trial) -> list[Decision]:
        tag = trial.tag
        self._in_flight.discard(tag)
        if trial.status == COMPLETED:
            self._outcomes[tag] = (2, self.score(trial.metrics))
        elif trial.status == STOPPED and tag in self._stopped_at:
            self._outcomes[tag] = (1, *self._stopped_at[tag])
        else:  # diverged, failed
            self._outcomes[tag] = (0,)
        return self._refill()

    def _refill(self) -> list[Decision]:
        decisions: list[Decision] = []
        while len(self._in_flight) < self._slots and len(self._points) < self.n:
            tag = len(self._points)
            point, config = self._suggest()
            self._points.append(point)
            self._in_flight.add(tag)
            decisions.append(Submit(config, self.steps, tag=tag))
        return decisions

    # ---- the model

    def _random(self) -> tuple[np.ndarray, Any]:
        for _ in range(10_000):
            point = self.params.sample_unit(self._rng, 1)[0]
            config = self.params.config(self.params.decode(point))
            if self.params.accepts(config):
                return point, config
        raise ValueError("BayesOpt: the space's where= filter rejected 10000 random draws in a row")

    def _suggest(self) -> tuple[np.ndarray, Any]:
        tags = sorted(self._outcomes)
        if len(self._points) < self.n_initial or len({self._outcomes[t] for t in tags}) < 2:
            return self._random()
        x = np.array([self._points[t] for t in tags])
        y = _copula([self._outcomes[t] for t in tags])
        from threadpoolctl import threadpool_limits

        with threadpool_limits(1):  # tiny matrices: BLAS threads only add overhead (4x here)
            return self._maximize_improvement(x, y)

    def _maximize_improvement(self, x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, Any]:
        """The candidate of largest expected improvement that the space accepts."""
        from sklearn.gaussian_process import GaussianProcessRegressor

        gp = self._fit(x, y)
        pending = np.array([self._points[t] for t in sorted(self._in_flight)]).reshape(-1, x.shape[1])
        if len(pending):  # kriging believer: running trials are assumed to get their mean
            believed = GaussianProcessRegressor(kernel=gp.kernel_, optimizer=None, normalize_y=True)
            gp = believed.fit(np.vstack([x, pending]), np.concatenate([y, gp.predict(pending)]))
        best = float(np.max(y))
        pool = self.params.sample_unit(self._rng, self.candidates)
        scores = self._acquire(gp, pool, best)
        seeds = pool[np.argsort(-scores, kind="stable")[:_LOCAL_SEEDS]]
        moves = np.repeat(seeds, _LOCAL_MOVES, axis=0)
        moves[:, self._numeric] += self._rng.normal(0.0, _LOCAL_SCALE, size=(len(moves), self._numeric.sum()))
        moves = np.clip(moves, 0.0, 1.0)
        pool = np.vstack([pool, moves])
        scores = np.concatenate([scores, self._acquire(gp, moves, best)])
        for index in np.argsort(-scores, kind="stable"):
            config = self.params.config(self.params.decode(pool[index]))
            if self.params.accepts(config):
                return pool[index], config
        return self._random()

    def _fit(self, x: np.ndarray, y: np.ndarray) -> GaussianProcessRegressor:
        """A GP fitted to (x, y) by maximum likelihood, the kernel's hyper-parameters searched
        from the last fit's (they move little between suggestions) and from one random start."""
        from sklearn.exceptions import ConvergenceWarning
        from sklearn.gaussian_process import GaussianProcessRegressor
        from sklearn.gaussian_process.kernels import ConstantKernel, Matern, WhiteKernel

        kernel = self._kernel
        if kernel is None:
            matern = Matern(length_scale=np.full(x.shape[1], 0.3), length_scale_bounds=(1e-2, 1e1), nu=2.5)
            kernel = ConstantKernel(1.0, (1e-2, 1e2)) * matern + WhiteKernel(1e-2, (1e-6, 1.0))
        gp = GaussianProcessRegressor(
            kernel=kernel,
            normalize_y=True,
            n_restarts_optimizer=1,
            random_state=int(self._rng.integers(2**31)),
        )
        with warnings.catch_warnings():  # a length scale at its bound is not an error
            warnings.simplefilter("ignore", ConvergenceWarning)
            gp.fit(x, y)
        self._kernel = gp.kernel_
        return gp

    def _acquire(self, gp: GaussianProcessRegressor, points: np.ndarray, best: float) -> np.ndarray:
        mean, std = gp.predict(points, return_std=True)
        scores = expected_improvement(mean, std, best, self.xi)
        return np.where(np.isfinite(scores), scores, -math.inf)
