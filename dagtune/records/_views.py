"""The read model: a study as its views see it, frozen at one moment.

A view (the progress display, the dashboard page and its publisher, the notebook views,
the command line) never reads a study's private state, and never its coordinator: it asks
the study for a `StudyView` (`Study.view()`), taken under the study's lock and frozen, and
reads that at leisure while the study goes on. The stage tree's running and queued spans
and the critical path come with it when asked (`ScheduleView`): read off the scheduler's
live stage tree (`dagtune.planner.IncrementalPlanner.schedule_view`), so the page draws the
path the coordinator follows without rebuilding the tree.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dagtune.config import Config
from dagtune.records._trial import TrialSnapshot

__all__ = ["Activity", "ScheduleView", "Span", "StudyView", "TrialChanges", "ViewFigures"]

#: a piece of a plan node's path: ``(node, first step, end step)``, steps ``[start, end)``
Span = tuple[str, int, int]


@dataclass(frozen=True)
class ScheduleView:
    """What is being trained and what waits: the spans the running tasks still have to
    train, the queued stages of the stage tree (claiming nothing: drawing the tree changes
    no plan), and the critical path (from the stage with the longest path below it, and the
    running task it waits for, down its longest branch; with nothing queued, the running
    task with the most work left)."""

    running: tuple[Span, ...] = ()
    queued: tuple[Span, ...] = ()
    critical: tuple[Span, ...] = ()
    running_tasks: int = 0
    queued_stages: int = 0


@dataclass(frozen=True)
class ViewFigures:
    """Figures of a view's trials that a view from scratch reads every trial for, kept by the
    study as its trials change: the `best` trial (`dagtune.summary.best_of`) by `metric` and
    `mode` (the study's, or where it names none the metric `dagtune.summary.metric_of` guesses
    from every metric the trials reported, and its mode); the live merge rate over the trials
    that ended and how many did (`merge_rate_ended`, `ended`: `dagtune.summary.merge_rate_so_far`);
    the trials by status (`statuses`: `dagtune.summary.status_counts`); how many `failed` and
    the first of them by id (`first_failed`, None if none: `dagtune.summary.failures`); and the
    names of the trials' hyper-parameters, sorted."""

    metric: str | None
    mode: str
    best: TrialSnapshot | None
    merge_rate_ended: float | None
    ended: int
    statuses: Mapping[str, int]
    failed: int
    first_failed: TrialSnapshot | None
    hyper_parameters: tuple[str, ...]


@dataclass(frozen=True)
class TrialChanges:
    """Which trials of a view changed since the study's earlier views, so that a reader that
    keeps what it made of an earlier view (a page's feed, `dagtune.dashboard.kept`) looks at
    those trials only, not every trial.

    The study numbers the views whose trials changed (`version`) within one `keeper` (an
    object made afresh whenever the study snapshots every trial again: a new coordinator,
    trials it was not told of); `recent` holds, for the last of those versions up to this
    view's, the snapshots of the trials that changed at each (oldest first, ``recent[-1]``
    at `version`). Frozen, so a reader may use it outside the study's lock."""

    keeper: object
    version: int
    recent: tuple[tuple[TrialSnapshot, ...], ...]

    def since(self, keeper: object, version: int) -> dict[int, TrialSnapshot] | None:
        """The trials (by id, each its snapshot in this view) that changed after `version` of
        `keeper`, up to this view; None where that is not known here (another keeper, or a
        version older than `recent` reaches): the reader then looks at every trial."""
        back = self.version - version
        if keeper is not self.keeper or back < 0 or back > len(self.recent):
            return None
        changed: dict[int, TrialSnapshot] = {}
        for batch in self.recent[len(self.recent) - back :]:
            for snapshot in batch:
                changed[snapshot.id] = snapshot  # a later batch's is the newer snapshot
        return changed


@dataclass(frozen=True)
class StudyView:
    """A study as it was at one moment (`Study.view()`).

    `trials` are frozen (`TrialSnapshot`), `report` is the study's report
    (`dagtune.coordinator.report_figures`), `metric` and `mode` those of the algorithm the
    study runs or last ran (None and "max" before any run), `closed` whether the study is
    closed, `token` the random suffix that tells this study's keys on a shared scheduler
    from another run's of the same name, `link` its `dagtune.records.StudyLink` if it is
    half of a surrogate study, `gpus` the GPUs each of its stages asks for, `demand` its
    stages ready to run with no free worker slot. With a `schedule` (asked with
    ``view(schedule=True)``) it also holds the plan nodes' configs and the last step trained
    on each node its trials pass (`configs`, `trained`) and the figures the page shows of
    its trials (`figures`: `ViewFigures`); without, those are empty. `changes` says which
    trials changed since the study's earlier views (`TrialChanges`; None: not known).
    """

    name: str
    identity: str
    token: str
    trials: tuple[TrialSnapshot, ...]
    report: Mapping[str, Any]
    metric: str | None
    mode: str
    closed: bool
    link: Any = None
    gpus: float | None = None
    demand: int = 0
    schedule: ScheduleView | None = None
    configs: Mapping[str, Config] | None = None
    trained: Mapping[str, int] | None = None
    figures: ViewFigures | None = None
    changes: TrialChanges | None = None


@dataclass(frozen=True)
class Activity:
    """What a thread that feeds a view asks a study every second, at no cost
    (`Study.activity()`): `changes` differs whenever a view of the study may have changed
    (events handled, trials, tasks running, the metric shown), `demand` is how many stages
    are ready to run but have no free worker slot (at the last scheduling round: what
    adaptive scaling asks workers for), `token` the suffix of the study's keys on its
    scheduler (as in `StudyView`), `closed` whether the study is closed (the feeding
    threads stop then)."""

    changes: tuple
    demand: int
    token: str
    closed: bool
