"""What a run gives back: `Result` (best trial, trials table, report, curves) and
`TrialResult`; `TrialError` when a trial's trainer raised."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dagtune.config import Config
from dagtune.errors import DagtuneError
from dagtune.frames import curves_table
from dagtune.importance import hyperparameter_importance
from dagtune.records import COMPLETED, DIVERGED, FAILED, Trial, TrialSnapshot
from dagtune.restore import Restorer, TrialPath
from dagtune.summary import best_of, trials_frame
from dagtune.trainer import Trainer

__all__ = ["Result", "TrialError", "TrialResult"]


class TrialError(DagtuneError, RuntimeError):
    """A trial's trainer raised (after the allowed retries); the message holds its traceback."""


#: where a study's trial models come from: trial id -> the restorer and the path to its last step
ModelSource = Callable[[int], tuple[Restorer, TrialPath]]


@dataclass(frozen=True)
class TrialResult:
    """A finished trial: its config, the steps it reached and its final metrics (and, for a
    failed one, the traceback of its trainer's `error`); from a study, also its model
    (`load_trainer`, `state_dict`)."""

    config: Config
    steps: int
    metrics: dict[str, float]
    id: int = -1
    status: str = COMPLETED
    error: str | None = None
    _models: ModelSource | None = field(default=None, repr=False, compare=False)

    def _model(self) -> tuple[Restorer, TrialPath]:
        if self._models is None:
            raise ValueError(
                "this TrialResult does not come from a study's run in this process (made by hand, or "
                "unpickled), so it has no model to load: use dt.open_results(storage, name).load_trainer(trial_id)"
            )
        return self._models(self.id)

    def __getstate__(self) -> dict[str, Any]:
        """Pickled without its tie to the study (which holds threads and locks)."""
        return {**self.__dict__, "_models": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        for name, value in state.items():
            object.__setattr__(self, name, value)

    def load_trainer(self, *, rng: bool = True) -> Trainer:
        """The trial's trainer, built in this process and restored at its last step
        (`steps`): its ``evaluate()`` gives the trial's final validation metrics exactly.

        The state comes from the checkpoint at that step; where there is none (garbage
        collection removed it, or the trial stopped between checkpoints), it is rebuilt by
        training from the nearest checkpoint before it, here, exactly as the study would
        (`dagtune.restore`: identical wherever this process computes as the workers did).
        With `rng`, the global random generators are left as they were at that step, so
        ``train()`` continues the trial exactly. (A fused study's trainer is unfused: its
        metrics agree with the fused ones within rounding.)"""
        restorer, path = self._model()
        return restorer.trainer(path, rng=rng, what=f"trial {self.id}")

    def state_dict(self) -> dict[str, Any]:
        """The trainer's ``state_dict()`` at the trial's last step (as `load_trainer`, but
        read from the checkpoint without building the trainer when there is one)."""
        restorer, path = self._model()
        return restorer.state(path, what=f"trial {self.id}")["trainer"]


def _as_result(trial: Trial, models: ModelSource | None = None) -> TrialResult:
    return TrialResult(
        trial.config, trial.reached, dict(trial.metrics or {}), trial.id, trial.status, trial.error, models
    )


class Result:
    """What a run produced: `best`, `trials` (a DataFrame), `report`, learning `curves`, and
    the trials whose trainer raised (`failed`).

    `report` holds the run's figures (its trials, the work done while it ran), defined in
    `dagtune.coordinator.report_figures`; `gpus` is how many GPUs each of its stages asked
    for (0: none, so its ``gpu_seconds`` are worker-seconds)."""

    def __init__(
        self,
        trials: list[Trial],
        report: dict,
        metric: str | None,
        mode: str = "max",
        chosen: Trial | None = None,
        models: ModelSource | None = None,
        *,
        gpus: float = 0.0,
    ):
        self._trials = trials
        self.gpus = gpus
        self.report = report
        self.metric = metric
        self.mode = mode
        self._chosen = chosen
        self._models = models

    def __getstate__(self) -> dict[str, Any]:
        """Pickled without its tie to the study (which holds threads and locks)."""
        return {**self.__dict__, "_models": None}

    @property
    def best(self) -> TrialResult | None:
        """The algorithm's answer if it names one (`Algorithm.best_trial`), else
        `dagtune.summary.best_of`: the completed trial with the best final finite `metric`
        (longest trials first on ties; a NaN or infinite value is never the best), as every
        view shows it."""
        if self._chosen is not None and self._chosen.metrics:
            return _as_result(self._chosen, self._models)
        best = best_of(self._trials, self.metric, self.mode)
        return None if best is None else _as_result(best, self._models)

    def trial(self, trial_id: int) -> TrialResult:
        """The `TrialResult` of trial `trial_id` of this run."""
        for trial in self._trials:
            if trial.id == trial_id:
                return _as_result(trial, self._models)
        raise KeyError(f"no trial {trial_id!r} in this result (trials {sorted(t.id for t in self._trials)})")

    def load_trainer(self, trial_id: int | None = None, *, rng: bool = True) -> Trainer:
        """`TrialResult.load_trainer` of trial `trial_id` (default: the best trial)."""
        return self._pick(trial_id).load_trainer(rng=rng)

    def state_dict(self, trial_id: int | None = None) -> dict[str, Any]:
        """`TrialResult.state_dict` of trial `trial_id` (default: the best trial)."""
        return self._pick(trial_id).state_dict()

    def _pick(self, trial_id: int | None) -> TrialResult:
        if trial_id is not None:
            return self.trial(trial_id)
        best = self.best
        if best is None:
            raise ValueError(f"no trial reported {self.metric!r}: give a trial id")
        return best

    @property
    def records(self) -> tuple[TrialSnapshot, ...]:
        """The run's trials as frozen records (`dagtune.records.TrialSnapshot`): what the
        notebook views and the page read of a result."""
        return tuple(trial.snapshot() for trial in self._trials)

    @property
    def failed(self) -> list[TrialResult]:
        """The trials that failed (their trainer raised, after the allowed retries), each with
        its traceback in ``error``, in trial order."""
        return [
            _as_result(t, self._models)
            for t in sorted(self._trials, key=lambda t: t.id)
            if t.status == FAILED
        ]

    @property
    def diverged(self) -> list[TrialResult]:
        """The trials that diverged (a metric was NaN or infinite at their last step, which
        ended them there), in trial order."""
        return [
            _as_result(t, self._models)
            for t in sorted(self._trials, key=lambda t: t.id)
            if t.status == DIVERGED
        ]

    @property
    def trials(self):
        """A DataFrame indexed by trial id: status, steps reached, final metrics, one column
        per hyper-parameter (a constant's value; a schedule's text with ``NAME/first`` and
        ``NAME/last``, its values at the first and last step trained), error and config
        (canonical JSON). ``dt.open_results(storage, name).trials`` has the same columns;
        `dagtune.frames` defines them."""
        return trials_frame(self._trials)

    def importance(
        self, metric: str | None = None, mode: str | None = None, *, evaluator: Any = None, seed: int = 0
    ) -> dict[str, float]:
        """How much each hyper-parameter mattered to `metric` (default: the run's) over the
        run's completed trials, as shares summing to 1, largest first: Optuna's fANOVA when
        optuna is installed (or the Optuna `evaluator` given, e.g.
        ``optuna.importance.PedAnovaImportanceEvaluator()``), else scikit-learn's random
        forest with a warning. `dagtune.importance` says how trials and schedules count."""
        metric = metric or self.metric
        if metric is None:
            raise ValueError("no metric: give importance(metric=...)")
        mode = mode or (self.mode if metric == self.metric else "max")
        return hyperparameter_importance(self._trials, metric, mode, evaluator=evaluator, seed=seed)

    def curve(self, metric: str):
        """A DataFrame of `metric`: one row per trial, one column per step from 0 (column
        ``s``: the metric evaluated right after step ``s``; NaN where it was not), as
        ``dt.open_results(...).curve(metric)``."""
        known = {m for t in self._trials for point in t.points for m in point.names}
        if metric not in known:
            raise KeyError(f"no metric {metric!r} in these results; there are {sorted(known)}")
        return curves_table({t.id: t.curve for t in self._trials}, metric)

    def plot_curves(self, width: int = 800, height: int = 320):
        """A Bokeh figure of the learning curves of `metric`, coloured by their last value."""
        from dagtune.notebook import plot_curves  # the views load bokeh and distributed

        return plot_curves(self, width, height)

    def plot_tree(self, width: int = 800, height: int = 360):
        """A Bokeh figure of the trials' stage tree (thickness: trials sharing a stage)."""
        from dagtune.notebook import plot_tree  # the views load bokeh and distributed

        return plot_tree(self, width, height)

    def _repr_html_(self) -> str:
        from dagtune.notebook import result_html  # the views load bokeh and distributed

        return result_html(self)

    @property
    def curves(self) -> dict[int, list[tuple[int, dict[str, float]]]]:
        """Per trial, the ``(step, metrics)`` pairs it reported, in order; ``step`` counts from
        0 (the metrics evaluated right after that step, as in `curve`)."""
        return {t.id: [(k - 1, dict(m)) for k, m in t.curve] for t in self._trials}

    def __repr__(self) -> str:
        best = self.best
        shown = f"best {self.metric}={best.metrics[self.metric]:.4g}" if best else "no result"
        return (
            f"<Result {len(self._trials)} trials, {shown}, merge rate {self.report.get('merge_rate', 1):.2f}>"
        )
