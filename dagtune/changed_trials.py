"""Which trials changed since the results writer last looked (`ChangedTrials`), so that a
results write compares only those, not every trial of the study."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dagtune.records import Trial

__all__ = ["ChangedTrials"]


class ChangedTrials:
    """The ids of the trials that changed since they were last taken (`take`): a recorder of
    the coordinator's records (`record`: submit, extend, end, retry) and a listener of its
    results (`on_result`: a metric delivered). Together they see every change of what a
    trial's results row shows: its status, steps, reported steps, curve and error (a trial
    restored is marked by who restores it). The results writer compares just these."""

    def __init__(self) -> None:
        self.ids: set[int] = set()

    def take(self) -> set[int]:
        ids, self.ids = self.ids, set()
        return ids

    def record(self, record: Mapping[str, Any]) -> None:
        if "trial" in record:
            self.ids.add(record["trial"])

    def on_result(self, trial: Trial, step: int, metrics: Mapping[str, float]) -> None:
        self.ids.add(trial.id)

    def on_complete(self, trial: Trial) -> None:
        self.ids.add(trial.id)

    def on_end(self, trial: Trial) -> None:
        self.ids.add(trial.id)
