"""How much each hyper-parameter mattered to a metric over a study's trials.

The trials are those that completed with a finite value of the metric (as Optuna counts
completed trials; stopped, failed and diverged ones are left out), each with its final value.
Each hyper-parameter is one variable: a constant's value (numeric, on a log scale when all
its values are positive and span more than a factor of 10; strings and bools as categories),
or, where it is a schedule in some trial, the schedule itself as a category (its text). A
hyper-parameter with one value over those trials explains nothing and gets 0; one that alone
varies explains all that varies and gets 1 without an evaluator (Optuna's fANOVA takes time
exponential in a category's number of values: one of 22 values took 92 s on a busy 2-core
machine, one of 26 more than 300 s). For the same reason, when a varying category has more than
`FANOVA_MAX_CHOICES` values (many schedules), Optuna's mean decrease in impurity
(`MeanDecreaseImpurityImportanceEvaluator`, a random forest over one-hot categories) scores
them instead of fANOVA, and `method_of` says so.

With Optuna installed (``pip install 'dagtune[optuna]'``), the trials become Optuna trials
and Optuna's evaluator scores them: fANOVA (`optuna.importance.FanovaImportanceEvaluator`,
Hutter et al. 2014) by default, or the one given (``PedAnovaImportanceEvaluator()``,
``MeanDecreaseImpurityImportanceEvaluator()``, ...). Without Optuna, scikit-learn's random
forest's mean decrease in impurity stands in, and a warning says so. Either way the result
maps every hyper-parameter to a share, the shares sum to 1 (unless nothing varies), largest
first.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Iterable
from typing import Any

from dagtune.frames import is_constant, readable
from dagtune.records import COMPLETED, Trial
from dagtune.validation import is_number

__all__ = [
    "FALLBACK",
    "FANOVA_MAX_CHOICES",
    "hyperparameter_importance",
    "importance_columns",
    "method_of",
    "method_of_columns",
    "score_columns",
]

log = logging.getLogger("dagtune")

#: what scores importance without Optuna
FALLBACK = "random-forest impurity (scikit-learn; install optuna for fANOVA)"

#: the most values a category may have for fANOVA to score it (its time is exponential in them)
FANOVA_MAX_CHOICES = 12


def _finite(value: Any) -> bool:
    return is_number(value) and math.isfinite(value)


def _variables(trials: list[Trial]) -> dict[str, list[Any]]:
    """Each hyper-parameter's value per trial: a constant's value, else the schedule's text."""
    names = sorted({n for t in trials for n in t.config})
    columns = {}
    for name in names:
        sequences = [t.config[name] for t in trials]
        if all(is_constant(s) for s in sequences):
            columns[name] = [s(0) for s in sequences]
        else:
            columns[name] = [readable(s) for s in sequences]
    return columns


def _used(trials: Iterable[Trial], metric: str) -> list[Trial]:
    """The trials importance is scored on: completed with a finite value of `metric`."""
    return [t for t in trials if t.status == COMPLETED and t.metrics and _finite(t.metrics.get(metric))]


def _numeric(values: list[Any]) -> bool:
    return all(_finite(v) for v in values)


def _log_scale(values: list[Any]) -> bool:
    return min(values) > 0 and max(values) / min(values) > 10


def hyperparameter_importance(
    trials: Iterable[Trial], metric: str, mode: str = "max", *, evaluator: Any = None, seed: int = 0
) -> dict[str, float]:
    """The importance of each hyper-parameter for `metric` over `trials` (the module
    docstring says how); a ValueError when fewer than 2 completed trials reported it."""
    columns, values = importance_columns(trials, metric)
    return score_columns(columns, values, mode, evaluator=evaluator, seed=seed)


def importance_columns(trials: Iterable[Trial], metric: str) -> tuple[dict[str, list[Any]], list[float]]:
    """What `hyperparameter_importance` scores: each hyper-parameter's value per used trial
    (the module docstring says which trials and values) and the metric's value per used
    trial, all plain JSON values; a ValueError when fewer than 2 trials can be used."""
    used = _used(trials, metric)
    if len(used) < 2:
        raise ValueError(
            f"the importance of the hyper-parameters needs at least 2 completed trials with {metric!r}, "
            f"there are {len(used)}"
        )
    return _variables(used), [float(t.metrics[metric]) for t in used]


def score_columns(
    columns: dict[str, list[Any]],
    values: list[float],
    mode: str = "max",
    *,
    evaluator: Any = None,
    seed: int = 0,
) -> dict[str, float]:
    """`hyperparameter_importance` of the variables and values `importance_columns` gives."""
    varying = _varying(columns)
    scores = dict.fromkeys(columns, 0.0)
    if len(varying) == 1:
        scores[varying[0]] = 1.0
    elif varying:
        try:
            import optuna  # noqa: F401
        except ImportError:
            if evaluator is not None:
                raise ImportError(
                    "an importance evaluator needs optuna: pip install 'dagtune[optuna]'"
                ) from None
            log.warning("dagtune: optuna is not installed: hyper-parameter importance by %s", FALLBACK)
            scores.update(_forest(columns, varying, values, seed))
        else:
            scores.update(_optuna(columns, varying, values, mode, evaluator, seed))
    return dict(sorted(scores.items(), key=lambda item: (-item[1], item[0])))


def _optuna(
    columns: dict[str, list[Any]],
    varying: list[str],
    values: list[float],
    mode: str,
    evaluator: Any,
    seed: int,
) -> dict[str, float]:
    import optuna

    distributions = {}
    for name in varying:
        column = columns[name]
        if _numeric(column):
            distributions[name] = optuna.distributions.FloatDistribution(
                float(min(column)), float(max(column)), log=_log_scale(column)
            )
        else:
            distributions[name] = optuna.distributions.CategoricalDistribution(sorted(set(map(str, column))))
    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # no "a new study created" line
    try:
        study = optuna.create_study(direction="maximize" if mode == "max" else "minimize")
    finally:
        optuna.logging.set_verbosity(verbosity)
    for i, value in enumerate(values):
        params = {
            name: float(columns[name][i]) if _numeric(columns[name]) else str(columns[name][i])
            for name in varying
        }
        study.add_trial(optuna.trial.create_trial(params=params, distributions=distributions, value=value))
    if evaluator is None and _widest_category(columns, varying) > FANOVA_MAX_CHOICES:
        evaluator = optuna.importance.MeanDecreaseImpurityImportanceEvaluator(seed=seed)
    elif evaluator is None:
        evaluator = optuna.importance.FanovaImportanceEvaluator(seed=seed)
    found = optuna.importance.get_param_importances(
        study, evaluator=evaluator, params=varying, normalize=True
    )
    return {name: float(score) for name, score in found.items()}


def _varying(columns: dict[str, list[Any]]) -> list[str]:
    return [name for name, column in columns.items() if len(set(map(json.dumps, column))) > 1]


def _widest_category(columns: dict[str, list[Any]], varying: list[str]) -> int:
    """The most values of a varying non-numeric hyper-parameter (0 if none)."""
    return max((len(set(map(str, columns[n]))) for n in varying if not _numeric(columns[n])), default=0)


def method_of(evaluator: Any = None, trials: Iterable[Trial] | None = None, metric: str | None = None) -> str:
    """What scores importance: the evaluator's name, Optuna's fANOVA (or its mean decrease
    in impurity for `trials` whose categories are too wide for fANOVA), or the fallback."""
    if evaluator is not None:
        return type(evaluator).__name__
    columns: dict[str, list[Any]] = {}
    if trials is not None and metric is not None:
        columns = _variables(_used(trials, metric))
    return method_of_columns(columns)


def method_of_columns(columns: dict[str, list[Any]]) -> str:
    """`method_of` (no evaluator) for the variables `importance_columns` gives."""
    try:
        import optuna  # noqa: F401
    except ImportError:
        return FALLBACK
    varying = _varying(columns)
    widest = _widest_category(columns, varying)
    if len(varying) > 1 and widest > FANOVA_MAX_CHOICES:
        return f"mean decrease in impurity (optuna; fANOVA is exponential in a category's {widest} values)"
    return "fANOVA (optuna)"


def _forest(
    columns: dict[str, list[Any]], varying: list[str], values: list[float], seed: int
) -> dict[str, float]:
    import numpy as np
    from sklearn.ensemble import RandomForestRegressor

    features, owners = [], []
    for name in varying:
        column = columns[name]
        if _numeric(column):
            numbers = np.log(np.asarray(column, float)) if _log_scale(column) else np.asarray(column, float)
            features.append(numbers)
            owners.append(name)
        else:  # one-hot: a category's share goes to its hyper-parameter
            for category in sorted(set(map(str, column))):
                features.append(np.asarray([str(v) == category for v in column], float))
                owners.append(name)
    forest = RandomForestRegressor(n_estimators=64, random_state=seed).fit(np.column_stack(features), values)
    scores = dict.fromkeys(varying, 0.0)
    for owner, share in zip(owners, forest.feature_importances_):
        scores[owner] += float(share)
    total = sum(scores.values())
    return {name: score / total if total else 0.0 for name, score in scores.items()}
