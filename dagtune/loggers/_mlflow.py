"""`MLflow`: one MLflow run per trial, in an experiment per study."""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from typing import Any

from dagtune.loggers._base import Logger, TrialInfo

__all__ = ["MLflow"]

_STATUS = {"completed": "FINISHED", "stopped": "KILLED"}
_BATCH = 500  # metric values per log_batch call (MLflow takes at most 1000)
_TAG_STUDY, _TAG_TRIAL, _TAG_IDENTITY = "dagtune.study", "dagtune.trial", "dagtune.identity"


class MLflow(Logger):
    """An MLflow run per trial (name ``trial-{id}``, tags ``dagtune.study``,
    ``dagtune.trial`` and ``dagtune.identity``) in the experiment `experiment` (default:
    the study's name), with the trial's hyper-parameters as params (a constant's value; a
    schedule's text and its first value, `dagtune.loggers.hparams_of`) and every step's
    metrics, ``step`` from 0. The
    run ends FINISHED (completed), KILLED (stopped) or FAILED (failed, diverged).

    `tracking_uri` is MLflow's (None: MLflow's default, ``MLFLOW_TRACKING_URI``); credentials
    come from MLflow's own environment variables, never from dagtune. Metrics are sent in
    batches (at a trial's end, at every run's end, and every 500 values). Resuming the study
    finds each trial's run by its tags and sends only the steps it lacks.
    Needs ``pip install 'dagtune[mlflow]'`` (mlflow-skinny is enough).
    """

    def __init__(self, tracking_uri: str | None = None, experiment: str | None = None):
        try:
            from mlflow.tracking import MlflowClient
        except ImportError as error:
            raise ImportError("dt.loggers.MLflow needs mlflow: pip install 'dagtune[mlflow]'") from error
        if experiment is not None and (not isinstance(experiment, str) or not experiment):
            raise ValueError(f"MLflow.experiment must be a non-empty string or None, got {experiment!r}")
        self.tracking_uri = tracking_uri
        self.experiment = experiment
        self._client_class = MlflowClient
        self._client: Any = None
        self._experiments: dict[str, str] = {}  # study -> experiment id
        self._identities: dict[str, str] = {}  # study -> model identity
        self._runs: dict[tuple[str, int], str] = {}  # (study, trial) -> run id
        self._found: dict[str, dict[int, str]] = {}  # study -> runs of earlier sessions by trial
        self._pending: dict[tuple[str, int], list] = {}  # metrics not sent yet

    def __repr__(self) -> str:
        return f"dt.loggers.MLflow(tracking_uri={self.tracking_uri!r}, experiment={self.experiment!r})"

    @property
    def client(self) -> Any:
        if self._client is None:
            self._client = self._client_class(tracking_uri=self.tracking_uri)
        return self._client

    def open(self, study: str, identity: str) -> None:
        name = self.experiment or study
        found = self.client.get_experiment_by_name(name)
        experiment = found.experiment_id if found is not None else self.client.create_experiment(name)
        self._experiments[study] = experiment
        self._identities[study] = identity
        runs: dict[int, str] = {}
        token = None
        while True:
            page = self.client.search_runs(
                [experiment], f"tags.`{_TAG_STUDY}` = '{study}'", max_results=1000, page_token=token
            )
            for run in page:
                trial = run.data.tags.get(_TAG_TRIAL, "")
                if trial.isdigit():
                    runs.setdefault(int(trial), run.info.run_id)
            token = page.token
            if not token:
                break
        self._found[study] = runs

    def start(self, trial: TrialInfo) -> int:
        from mlflow.entities import Param

        key = (trial.study, trial.id)
        earlier = self._found[trial.study].get(trial.id)
        if earlier is not None:
            self._runs[key] = earlier
            run = self.client.get_run(earlier)
            last = -1
            for metric in run.data.metrics:
                history = self.client.get_metric_history(earlier, metric)
                last = max([last, *(m.step for m in history)])
            return last
        run = self.client.create_run(
            self._experiments[trial.study],
            run_name=f"trial-{trial.id}",
            tags={
                _TAG_STUDY: trial.study,
                _TAG_TRIAL: str(trial.id),
                _TAG_IDENTITY: self._identities[trial.study],
            },
        )
        self._runs[key] = run.info.run_id
        params = [Param(name, str(value)) for name, value in trial.hparams.items()]
        for start in range(0, len(params), 100):
            self.client.log_batch(run.info.run_id, params=params[start : start + 100])
        return -1

    def log(self, study: str, trial: int, step: int, metrics: Mapping[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        pending = self._pending.setdefault((study, trial), [])
        pending.extend(Metric(name, _number(value), now, step) for name, value in metrics.items())
        if len(pending) >= _BATCH:
            self._send(study, trial)

    def _send(self, study: str, trial: int) -> None:
        pending = self._pending.pop((study, trial), [])
        run = self._runs[(study, trial)]
        for start in range(0, len(pending), _BATCH):
            self.client.log_batch(run, metrics=pending[start : start + _BATCH])

    def end(self, study: str, trial: int, status: str, metrics: Mapping[str, float]) -> None:
        self._send(study, trial)
        self.client.set_terminated(self._runs[(study, trial)], status=_STATUS.get(status, "FAILED"))

    def flush(self, study: str) -> None:
        for key in [k for k in self._pending if k[0] == study]:
            self._send(*key)

    def close(self, study: str) -> None:
        self.flush(study)
        for key in [k for k in self._runs if k[0] == study]:
            del self._runs[key]


def _number(value: float) -> float:
    """A metric value MLflow stores (it takes NaN; infinities become its largest floats)."""
    value = float(value)
    if math.isinf(value):
        return math.copysign(1.7976931348623157e308, value)
    return value
