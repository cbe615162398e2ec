"""What a run gives back: `Result` (best trial, trials table, report, curves) and
`TrialResult`; `TrialError` when a trial's trainer raised."""

from __future__ import annotations

import math
from dataclasses import dataclass

from dagtune.config import Config
from dagtune.records import COMPLETED, FAILED, Trial
from dagtune.summary import trials_frame

__all__ = ["Result", "TrialError", "TrialResult"]


class TrialError(RuntimeError):
    """A trial's trainer raised (after the allowed retries); the message holds its traceback."""


@dataclass(frozen=True)
class TrialResult:
    """A finished trial: its config, the steps it reached and its final metrics (and, for a
    failed one, the traceback of its trainer's `error`)."""

    config: Config
    steps: int
    metrics: dict[str, float]
    id: int = -1
    status: str = COMPLETED
    error: str | None = None


def _as_result(trial: Trial) -> TrialResult:
    return TrialResult(
        trial.config, trial.reached, dict(trial.metrics or {}), trial.id, trial.status, trial.error
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
        *,
        gpus: float = 0.0,
    ):
        self._trials = trials
        self.gpus = gpus
        self.report = report
        self.metric = metric
        self.mode = mode
        self._chosen = chosen

    @property
    def best(self) -> TrialResult | None:
        """The algorithm's answer if it names one (`Algorithm.best_trial`), else the completed
        trial with the best final `metric` (longest trials first on ties)."""
        if self._chosen is not None and self._chosen.metrics:
            return _as_result(self._chosen)
        scored = [
            t
            for t in self._trials
            if t.metrics and self.metric in t.metrics and not math.isnan(t.metrics[self.metric])
        ]
        if not scored:
            return None
        completed = [t for t in scored if t.status == COMPLETED] or scored
        sign = 1.0 if self.mode == "max" else -1.0
        return _as_result(max(completed, key=lambda t: (sign * t.metrics[self.metric], t.steps, -t.id)))

    @property
    def failed(self) -> list[TrialResult]:
        """The trials that failed (their trainer raised, after the allowed retries), each with
        its traceback in ``error``, in trial order."""
        return [_as_result(t) for t in sorted(self._trials, key=lambda t: t.id) if t.status == FAILED]

    @property
    def trials(self):
        """One row per trial: id, status, steps, final metrics, then one column per
        hyper-parameter with its sequence in short form (``0.9``, ``64→128@18``)."""
        return trials_frame(self._trials)

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
        """Per trial, the (step, metrics) pairs it reported, in order."""
        return {t.id: list(t.curve) for t in self._trials}

    def __repr__(self) -> str:
        best = self.best
        shown = f"best {self.metric}={best.metrics[self.metric]:.4g}" if best else "no result"
        return (
            f"<Result {len(self._trials)} trials, {shown}, merge rate {self.report.get('merge_rate', 1):.2f}>"
        )
