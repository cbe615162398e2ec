"""The `Logger` interface and what it is told about a trial."""

from __future__ import annotations

import math
import re
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dagtune.config import Config, config_values
from dagtune.frames import is_constant, readable

__all__ = ["Logger", "TrialInfo", "hparams_of", "safe_name"]

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def safe_name(name: str) -> str:
    """`name` as one path component (a study name already is one)."""
    return _UNSAFE.sub("_", name) or "_"


def hparams_of(config: Config) -> dict[str, Any]:
    """A trial's hyper-parameters as loggers record them, once per trial, under the trials
    frame's names (`dagtune.frames`): a constant's value (number, string or bool) as
    ``NAME``; a schedule's short text as ``NAME/schedule`` and its value at step 0 as
    ``NAME/first`` (each key keeps one type across trials; each step's values are in the
    per-step records)."""
    shown: dict[str, Any] = {}
    for name, sequence in config.items():
        if is_constant(sequence):
            shown[name] = sequence(0)
            continue
        shown[f"{name}/schedule"] = readable(sequence)
        try:
            shown[f"{name}/first"] = sequence(0)
        except ValueError:  # no finite value at step 0
            shown[f"{name}/first"] = math.nan
    return shown


@dataclass(frozen=True)
class TrialInfo:
    """A trial as a logger sees it when it first hears of it."""

    study: str
    id: int
    config: Config
    steps: int

    @property
    def hparams(self) -> dict[str, Any]:
        return hparams_of(self.config)

    def values(self, step: int) -> dict[str, Any]:
        """Every hyper-parameter's value during `step` (from 0)."""
        return config_values(self.config, step)


class Logger(ABC):
    """Where a study's results go besides its own storage: TensorBoard, CSV, MLflow, ...

    A study given ``loggers=[...]`` calls them from a thread of its own process (never on a
    worker), in order, as results are delivered to its trials (`dagtune.loggers` tells
    which results and when). Steps count from 0 as everywhere in dagtune: the metrics of
    step ``s`` are those evaluated right after the ``s``-th call of ``Trainer.train()``.

    `start` returns the last step this logger already holds for the trial (from what it
    wrote in an earlier session of the same study, read back from its own output), or -1:
    the study then sends only later steps, so resuming a study never logs a point twice.
    One logger may serve several studies (a surrogate study and its target): every call
    names the study.
    """

    def open(self, study: str, identity: str) -> None:  # noqa: B027 - optional
        """A study starts logging here (`identity`: its model identity)."""

    @abstractmethod
    def start(self, trial: TrialInfo) -> int:
        """A trial is seen for the first time in this session: prepare its run and return the
        last step already logged for it (-1 if none)."""

    @abstractmethod
    def log(self, study: str, trial: int, step: int, metrics: Mapping[str, float]) -> None:
        """The metrics of `trial` after `step` (training and validation metrics together)."""

    def end(self, study: str, trial: int, status: str, metrics: Mapping[str, float]) -> None:  # noqa: B027
        """The trial ended with `status` and final `metrics` (it may be extended later, and
        then log and end again)."""

    def flush(self, study: str) -> None:  # noqa: B027 - optional
        """Make what was logged so far readable (a run's end waits for it)."""

    def close(self, study: str) -> None:  # noqa: B027 - optional
        """The study closed: release what it held."""
