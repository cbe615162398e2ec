"""The figures a study is reported by (`Study.report`, `Result.report`), each defined here.

`report_figures` gives them all; `trial_figures` the part that depends on the trials alone
(what a study read back from storage can tell too).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

from dagtune.plan import unique_steps
from dagtune.records import Trial

__all__ = ["KeptFigures", "fused_figures", "reached_along_paths", "report_figures", "trial_figures"]


def trial_figures(trials: Sequence[Trial]) -> dict:
    """``trials``, ``trial_steps``, ``unique_steps`` and ``merge_rate`` of `trials`, as
    `report_figures` defines them. The unique steps are read off the paths the plan gave the
    trials (`reached_along_paths`) where every trial that reached a step has one; otherwise
    (a trial-based study's private paths, a trial not placed yet) they are counted from the
    configs (`dagtune.plan.unique_steps`), as the definition says."""
    reached = [t for t in trials if t.reached > 0]
    trial_steps = sum(t.reached for t in reached)
    if all(t.segments and not t.salt for t in reached):
        unique = sum(step - start for start, step in reached_along_paths(reached).values())
    else:
        unique = unique_steps([(t.config, t.reached) for t in reached]) if reached else 0
    return {
        "trials": len(trials),
        "trial_steps": trial_steps,
        "unique_steps": unique,
        "merge_rate": trial_steps / unique if unique else 1.0,
    }


def reached_along_paths(trials: Iterable[Trial]) -> dict[str, tuple[int, int]]:
    """Each node on the trials' paths (``segments``: the plan's nodes, where trials with the
    same values up to a step share the node) -> its start and the furthest step a trial
    reached on it. One walk of the trials' segments; the unique steps are the sum of the
    spans (the same number as `dagtune.plan.unique_steps` of their configs and reached steps,
    without building a plan of them again: that rebuild was most of a large study's report,
    taken under the study's lock for every view, perf/RESULTS.md 9l)."""
    furthest: dict[str, tuple[int, int]] = {}
    for trial in trials:
        reached = trial.reached
        for node, start, end in trial.segments:
            if reached <= start:
                break
            known = furthest.get(node)
            step = min(end, reached)
            if known is None or step > known[1]:
                furthest[node] = (start, step)
    return furthest


def report_figures(
    trials: Sequence[Trial],
    executed_steps: int,
    gpu_seconds: float,
    now: float,
    group_sizes: Mapping[int, int] | None = None,
) -> dict:
    """The figures of `trials`, with the steps executed, the GPU-seconds spent and the fused
    tasks launched for them, by their number of trials (since some report was taken:
    `dagtune.coordinator.Coordinator.report` counts those; None: the study does not fuse,
    and its report has no fusion figures), `now` on the executor's clock. Each figure is
    exactly:

    ``trials``
        how many trials.
    ``trial_steps``
        the sum over the trials of the steps each *reached*: its `steps` if completed,
        else the last step it received metrics for (stopped, diverged, failed, or
        pending still). What a trial-based system trains for the same results.
    ``unique_steps``
        the distinct points among the steps the trials reached: step ``s`` of two trials
        counts once when every hyper-parameter has the same value in both at every step
        up to ``s`` (`dagtune.plan.unique_steps`, on configs even without sharing). The
        least any system must train for these results from scratch.
    ``executed_steps``
        the steps trained since `since` (calls of ``Trainer.train``, counted from the
        ``step`` events; a fused task's step counts once per trial it trains), whatever
        they were for: the points the trials reached that
        were not trained before; steps trained again (a lost worker's stage rerun from
        its last checkpoint, a corrupt checkpoint's work, a retried failure, a point
        whose checkpoint was asked for after its stage had passed it); and steps a stage
        trained after its trials were stopped or diverged, before the stop reached it (a
        worker sees a stop at its next step boundary): those are executed, never unique.
        `Study.run` returns only after every stage no pending trial needs has ended, so
        a run counts them all. Points trained before `since` (by an earlier run or
        session, or another study of the same model) are not trained again. So a run with
        sharing executes: unique − the reached points trained before `since` + the
        steps trained again + the steps trained past a stop; on fresh storage, a run
        with nothing stopped, diverged, failed, lost or corrupt executes exactly its
        unique steps unless a branch was asked for after its stage had passed it.
    ``merge_rate``
        trial_steps / unique_steps (1.0 without steps).
    ``reuse``
        trial_steps / executed_steps: how many times fewer steps were trained than a
        trial-based system trains (infinite when every result was known already, 1.0
        without steps).
    ``gpu_seconds``
        the seconds the stages held their workers since `since` (each from its
        ``start`` event, when a worker took it, to its ``end``: loading, training,
        evaluating and saving, not queueing; a stage still running up to now; the slot of
        a fused task once, from its first member's start to its last member's end), times
        the GPUs each stage asks for (``resources["GPU"]``, else 1).
    ``makespan_seconds``
        from the first of the trials' submissions to the end of the last of them (to
        now while one is pending), on the executor's clock (virtual in simulation).
    ``fused_tasks`` (a study with ``fuse`` only, as the two below)
        the fused tasks launched (a task nothing fused with counts, as a group of one; none
        once the trainer trains unfused).
    ``group_sizes``
        those tasks by their number of trials: ``{K: tasks}``, K ascending.
    ``mean_group_size``
        trials per fused task: Σ K x tasks / ``fused_tasks`` (0.0 without fused tasks).
    """
    start = min((t.submitted_at for t in trials), default=now)
    ends = [t.finished_at for t in trials if t.finished_at is not None]
    end = max(ends) if ends and all(t.done for t in trials) else now
    return _figures(trial_figures(trials), start, end, executed_steps, gpu_seconds, group_sizes)


def _figures(
    figures: dict,
    start: float,
    end: float,
    executed_steps: int,
    gpu_seconds: float,
    group_sizes: Mapping[int, int] | None,
) -> dict:
    """`report_figures` from the trials' figures (`trial_figures`), the first submission and
    the last end (or now), and the work."""
    trial_steps = figures["trial_steps"]
    return {
        "trials": figures["trials"],
        "trial_steps": trial_steps,
        "unique_steps": figures["unique_steps"],
        "executed_steps": executed_steps,
        "merge_rate": figures["merge_rate"],
        "reuse": trial_steps / executed_steps if executed_steps else (math.inf if trial_steps else 1.0),
        "gpu_seconds": gpu_seconds,
        "makespan_seconds": max(0.0, end - start),
        **(fused_figures(group_sizes) if group_sizes is not None else {}),
    }


def fused_figures(group_sizes: Mapping[int, int]) -> dict:
    """``fused_tasks``, ``group_sizes`` and ``mean_group_size`` (see `report_figures`) of the
    fused tasks launched, counted by size."""
    sizes = {int(size): int(count) for size, count in sorted(group_sizes.items()) if count > 0}
    tasks = sum(sizes.values())
    trials = sum(size * count for size, count in sizes.items())
    return {"fused_tasks": tasks, "group_sizes": sizes, "mean_group_size": trials / tasks if tasks else 0.0}


class _Reached:
    """The trial and unique steps of some trials, kept as they are counted in and out: the
    trial steps' sum; per node of the trials' paths, how many trials reach each furthest step
    on it (the unique steps are the sum over the nodes of the largest less the node's start:
    `reached_along_paths`); how many trials, and how many reached steps off a shared path."""

    def __init__(self) -> None:
        self.trials = 0
        self.trial_steps = 0
        self.unique_steps = 0
        self.off_paths = 0  # trials that reached steps without a shared path
        self._furthest: dict[str, dict[int, int]] = {}  # node -> furthest step -> trials

    def count(self, trial: Trial, sign: int) -> None:
        """Count `trial` in (`sign` 1) or out (-1)."""
        reached = trial.reached
        self.trials += sign
        self.trial_steps += sign * reached
        if reached <= 0:
            return
        if not trial.segments or trial.salt:
            self.off_paths += sign
            return
        for node, start, end in trial.segments:
            if reached <= start:
                break
            self._at(node, start, min(end, reached), sign)

    def _at(self, node: str, start: int, step: int, sign: int) -> None:
        counts = self._furthest.setdefault(node, {})
        before = max(counts, default=start)
        counts[step] = counts.get(step, 0) + sign
        if not counts[step]:
            del counts[step]
        self.unique_steps += max(counts, default=start) - before
        if not counts:
            del self._furthest[node]

    def figures(self) -> dict:
        """`trial_figures` of the trials counted in (all on shared paths: ``off_paths`` 0)."""
        return {
            "trials": self.trials,
            "trial_steps": self.trial_steps,
            "unique_steps": self.unique_steps,
            "merge_rate": self.trial_steps / self.unique_steps if self.unique_steps else 1.0,
        }


def _ended(trial: Trial) -> bool:
    """Whether `trial` counts in the live merge rate (`dagtune.summary.merge_rate_so_far`):
    it ended, with steps reached."""
    return trial.done and trial.reached > 0


class KeptFigures:
    """`report_figures` of the trials in `trials` (a mapping kept by the caller) kept as they
    change: each change of a trial is told as its copy before and after (`change`: frozen
    `TrialSnapshot`s, or anything with a trial's fields), and `figures` costs no walk of the
    trials. The same figures as `report_figures` of ``trials.values()``, exactly (integer
    sums, the same minimum and maximum); where a trial that reached steps has no shared path
    (a trial-based study's private paths), the trials' figures are counted again
    (`trial_figures`), as that defines them. `merge_rate_ended` is the live merge rate the
    page shows (`dagtune.summary.merge_rate_so_far`), kept the same way.

    Kept: the trial and unique steps of all the trials and of those that ended
    (`_Reached`); the trials pending; the first submission and the last end, walked again
    only after the trial that held one of them changed it."""

    def __init__(self, trials: Mapping[int, Trial]) -> None:
        self.trials = trials
        self._all = _Reached()
        self._ended = _Reached()  # the trials that ended with steps reached
        self._pending = 0
        self._first: float | None = None  # None: to be walked again
        self._last: float | None = None
        self.walks = 0  # walks of every trial (for the tests that count them)

    @property
    def trial_steps(self) -> int:
        return self._all.trial_steps

    @property
    def unique_steps(self) -> int:
        return self._all.unique_steps

    def change(self, old: Trial | None, new: Trial) -> None:
        """A trial changed from `old` (None: it is new) to `new`."""
        if old is not None:
            self._count(old, -1)
        self._count(new, 1)
        first, last = self._first, self._last
        if first is not None:
            if old is not None and old.submitted_at == first != new.submitted_at:
                self._first = None
            else:
                self._first = min(first, new.submitted_at)
        if last is not None:
            if old is not None and old.finished_at == last != new.finished_at:
                self._last = None
            elif new.finished_at is not None:
                self._last = max(last, new.finished_at)

    def _count(self, trial: Trial, sign: int) -> None:
        self._all.count(trial, sign)
        self._pending += sign * (not trial.done)
        if _ended(trial):
            self._ended.count(trial, sign)

    def merge_rate_ended(self) -> tuple[float | None, int]:
        """`dagtune.summary.merge_rate_so_far` of the trials: the merge rate of those that
        ended with steps reached (None while none has), and how many."""
        ended = self._ended
        if not ended.trials:
            return None, 0
        if ended.off_paths:
            self.walks += 1
            return trial_figures([t for t in self.trials.values() if _ended(t)])["merge_rate"], ended.trials
        return ended.figures()["merge_rate"], ended.trials

    def figures(
        self,
        executed_steps: int,
        gpu_seconds: float,
        now: float,
        group_sizes: Mapping[int, int] | None = None,
    ) -> dict:
        """`report_figures` of the trials, with this work."""
        trials = self.trials.values()
        if self._all.off_paths:
            self.walks += 1
            figures = trial_figures(list(trials))
        else:
            figures = {**self._all.figures(), "trials": len(trials)}
        if not trials:
            return _figures(figures, now, now, executed_steps, gpu_seconds, group_sizes)
        if self._first is None:
            self.walks += 1
            self._first = min(t.submitted_at for t in trials)
        end = now
        if not self._pending:
            if self._last is None:
                self.walks += 1
                self._last = max((t.finished_at for t in trials if t.finished_at is not None), default=None)
            end = now if self._last is None else self._last
        return _figures(figures, self._first, end, executed_steps, gpu_seconds, group_sizes)
