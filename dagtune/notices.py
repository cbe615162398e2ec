"""Warnings about a user's trainer, found where it runs and shown where the study runs.

A worker finds some things worth a warning but not worth failing a trial for: a
hyper-parameter ``setup()`` never reads (`dagtune.hpreads`), training that is not
deterministic, so that the resume check can't tell a resume bug from noise, or a resume
check that could not run (`dagtune.resumecheck`). A worker's log is where nobody looks, so the runner turns each into
a ``warning`` event (`warning_event`), which travels with the other events to the process
that runs the study; there the coordinator (or `run_alone`) shows it as a Python warning of
its category (`Notices.show`), once per study for each thing it is about.
"""

from __future__ import annotations

import warnings
from typing import Any

from dagtune.errors import DagtuneWarning
from dagtune.events import TrainerWarned

__all__ = [
    "DefaultedHyperparameterWarning",
    "NondeterministicTrainingWarning",
    "Notices",
    "ResumeCheckSkippedWarning",
    "TrialsDivergedWarning",
    "TrialsFailedWarning",
    "UnreadHyperparameterWarning",
    "warning_event",
]


class UnreadHyperparameterWarning(DagtuneWarning):
    """``Trainer.setup`` never read a hyper-parameter of the config (a typo, or a name the
    trainer does not know): every value of it trains the same."""


class DefaultedHyperparameterWarning(DagtuneWarning):
    """``Trainer.setup`` read a hyper-parameter that did not change with ``hp.get(name,
    default)`` and got a default that is not the config's value: it likely applies it."""


class NondeterministicTrainingWarning(DagtuneWarning):
    """The same step from the same checkpoint trained twice gave different states: training
    is not deterministic, so results are not bit for bit those of `run_alone`, and the resume
    check can't tell a resume bug from that noise."""


class ResumeCheckSkippedWarning(DagtuneWarning):
    """The resume check could not run (a second trainer did not fit in memory)."""


class TrialsFailedWarning(DagtuneWarning):
    """Trials of a `Study.run` failed (their trainer raised); `Result.failed` has them."""


class TrialsDivergedWarning(DagtuneWarning):
    """Trials of a `Study.run` diverged: a metric was NaN or infinite at some step, which ends
    a trial there; `Result.diverged` has them."""


_CATEGORIES: dict[str, type[UserWarning]] = {
    cls.__name__: cls
    for cls in (
        UnreadHyperparameterWarning,
        DefaultedHyperparameterWarning,
        NondeterministicTrainingWarning,
        ResumeCheckSkippedWarning,
    )
}


def warning_event(category: type[UserWarning], message: str, once: str) -> dict[str, Any]:
    """The fields of a ``warning`` event: its category's name, the message, and what it is
    about (`once`: the same `once` is shown once per study)."""
    return {"category": category.__name__, "message": message, "once": once}


class Notices:
    """The warnings one study (or one `run_alone`) has shown, so each shows once."""

    def __init__(self) -> None:
        self.shown: list[str] = []
        self._seen: set[str] = set()

    def show(self, warned: TrainerWarned) -> None:
        """Warn with a `TrainerWarned`'s message in its category, unless one about the same
        thing was shown already."""
        once = warned.once or warned.message
        if once in self._seen:
            return
        self._seen.add(once)
        self.shown.append(warned.message)
        warnings.warn(warned.message, _CATEGORIES.get(warned.category, UserWarning), stacklevel=2)
