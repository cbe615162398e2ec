"""Any Optuna sampler (TPE by default) as a dagtune algorithm, through Optuna's ask/tell API.

The distributions of the dagtune space (see `ParamSpace`) become Optuna distributions named
by their paths (``"lr.init"``, ``"momentum"``): `uniform` -> ``FloatDistribution``,
`loguniform` -> ``FloatDistribution(log=True)``, `randint(low, high)` ->
``IntDistribution(low, high - 1)`` (Optuna's high is inclusive), `quniform(low, high, q)` ->
``FloatDistribution`` (``IntDistribution`` for ints) over its multiples of q with
``step=q``, `qloguniform` -> ``FloatDistribution(log=True)`` whose suggestion is rounded to
a multiple of q (Optuna can't step a log scale), `normal` -> ``FloatDistribution(0, 1)`` of
the value's position under the normal CDF (the suggestion is mapped back through its
inverse; Optuna has no normal distribution), `choice` -> ``CategoricalDistribution`` of its
options (or of their indices when an option is a sequence, since Optuna only takes plain
values). Each dagtune trial is one asked Optuna
trial; every result is reported with ``trial.report`` so an Optuna pruner can stop it.

How outcomes are told: a completed trial with its final metric; a pruned trial as
``PRUNED`` (Optuna then uses its last reported value); a diverged trial as ``PRUNED`` too,
with the finite values it reported before diverging, so samplers such as TPE count it among
the bad trials rather than forget it (``FAIL`` would make TPE ignore it and sample the same
diverging region again); a failed trial (its trainer raised) as ``FAIL``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dagtune.algos._base import Algorithm, Context, Decision, Stop, Submit, check_positive
from dagtune.algos._params import CATEGORICAL, INT, LOG, NORMAL, Param, ParamSpace
from dagtune.records import FAILED, Trial
from dagtune.space import Random
from dagtune.validation import check_int

__all__ = ["OptunaSampler"]

_MAX_REJECTED = 1000


def _distribution(optuna: Any, param: Param) -> Any:
    if param.kind == CATEGORICAL:
        return optuna.distributions.CategoricalDistribution(param.choices)
    if param.kind == INT:
        return optuna.distributions.IntDistribution(int(param.low), int(param.high) - 1)
    if param.kind == NORMAL:
        return optuna.distributions.FloatDistribution(0.0, 1.0)
    q = param.quantized
    if q is not None and param.kind != LOG:
        first, last = q.multiple(q.first), q.multiple(q.last)
        if q.integral:
            return optuna.distributions.IntDistribution(first, last, step=q.q)
        return optuna.distributions.FloatDistribution(first, last, step=q.q)
    return optuna.distributions.FloatDistribution(param.low, param.high, log=param.kind == LOG)


def _value(param: Param, suggested: Any) -> Any:
    """A suggestion as the dagtune distribution gives values."""
    if param.kind == CATEGORICAL:
        return param.choices.index(suggested)
    if param.kind == NORMAL:
        return param.from_unit(suggested)
    return param.snap(suggested) if param.quantized is not None else suggested


class OptunaSampler(Algorithm):
    """`n` trials of `steps` steps over `space`, suggested by an Optuna `sampler`.

    `sampler` defaults to ``optuna.samplers.TPESampler(seed=seed)``; `pruner` (e.g.
    ``optuna.pruners.MedianPruner()``) stops trials early, and no pruner means none is
    stopped. The Optuna study is `self.study` (best params, plots, ...). Needs
    ``pip install 'dagtune[optuna]'``.
    """

    def __init__(
        self,
        space: Random | Mapping[str, Any],
        metric: str,
        mode: str = "max",
        steps: int = 1,
        n: int = 20,
        sampler: Any = None,
        pruner: Any = None,
        seed: int = 0,
    ):
        try:
            import optuna
        except ImportError as error:
            raise ImportError(
                "OptunaSampler needs optuna, which is not installed: pip install 'dagtune[optuna]'"
            ) from error
        super().__init__(metric, mode)
        owner = type(self).__name__
        check_positive(owner, steps=steps, n=n)
        check_int(f"{owner}.seed", seed)
        if sampler is not None and not isinstance(sampler, optuna.samplers.BaseSampler):
            raise ValueError(f"{owner}.sampler must be an optuna sampler, got {sampler!r}")
        if pruner is not None and not isinstance(pruner, optuna.pruners.BasePruner):
            raise ValueError(f"{owner}.pruner must be an optuna pruner, got {pruner!r}")
        self.params = ParamSpace(space, owner)
        self.steps = steps
        self.n = n
        self._optuna = optuna
        self._distributions = {p.path: _distribution(optuna, p) for p in self.params.params}
        self.study = optuna.create_study(
            direction="maximize" if mode == "max" else "minimize",
            sampler=sampler if sampler is not None else optuna.samplers.TPESampler(seed=seed),
            pruner=pruner if pruner is not None else optuna.pruners.NopPruner(),
        )
        self._asked: dict[int, Any] = {}  # Optuna trial number (the dagtune trial's tag) -> trial
        self._slots = 1
        self._submitted = 0

    def start(self, ctx: Context) -> list[Decision]:
        self._slots = ctx.slots
        return self._refill()

    def on_result(self, trial: Trial, step: int, metrics: dict[str, float]) -> list[Decision]:
        self.check_metric(metrics)
        asked = self._asked[trial.tag]
        asked.report(metrics[self.metric], step)
        if step < trial.steps and asked.should_prune():
            return [Stop(trial.id)]
        return []

    def on_complete(self, trial: Trial) -> list[Decision]:
        self.study.tell(self._asked.pop(trial.tag), trial.metrics[self.metric])
        return self._refill()

    def on_end(self, trial: Trial) -> list[Decision]:
        self.check_ended(trial)
        state = self._optuna.trial.TrialState
        self.study.tell(
            self._asked.pop(trial.tag), state=state.FAIL if trial.status == FAILED else state.PRUNED
        )
        return self._refill()

    def _refill(self) -> list[Decision]:
        decisions: list[Decision] = []
        while len(self._asked) < self._slots and self._submitted < self.n:
            asked, config = self._ask()
            self._asked[asked.number] = asked
            self._submitted += 1
            decisions.append(Submit(config, self.steps, tag=asked.number))
        return decisions

    def _ask(self) -> tuple[Any, Any]:
        """An Optuna trial and its config; configs the space's `where` rejects are told FAIL."""
        for _ in range(_MAX_REJECTED):
            asked = self.study.ask(self._distributions)
            values = {}
            for param in self.params.params:
                values[param.path] = _value(param, asked.params[param.path])
            config = self.params.config(values)
            if self.params.accepts(config):
                return asked, config
            self.study.tell(asked, state=self._optuna.trial.TrialState.FAIL)
        raise ValueError(
            f"OptunaSampler: the space's where= filter rejected {_MAX_REJECTED} suggestions in a row"
        )
