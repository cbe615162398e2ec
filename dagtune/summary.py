"""What every view of a study shows, defined once: trials by status, the metric to show and
the best trial by it, the steps known trained, the GPU-seconds reuse saved, the live merge
rate, the first line of a failed trial's error, the short form of a sequence and the table
of trials.

The dashboard page, the notebook views, the progress display and the command line all take
their figures from here, so they agree; each works on `Trial` records and plain reports,
whatever they were read from (a live study, a `Result`, storage).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from dagtune.coordinator import reached_along_paths, trial_figures
from dagtune.frames import readable, row_of, trials_table
from dagtune.records import COMPLETED, FAILED, PENDING, STATUSES, Trial

__all__ = [
    "UNKNOWN_FROM_STORAGE",
    "best_key",
    "best_note",
    "best_of",
    "config_text",
    "divergence_line",
    "error_line",
    "failures",
    "finite",
    "merge_rate_so_far",
    "metric_of",
    "pick_metric",
    "readable",
    "reuse_text",
    "saved_seconds",
    "seconds_label",
    "status_counts",
    "trained_from_plan",
    "trained_from_trials",
    "trained_to",
    "trials_frame",
]

#: Why views of stored studies show no executed steps or GPU-seconds.
UNKNOWN_FROM_STORAGE = (
    "executed steps and GPU-seconds were not recorded by this study's sessions (written by a "
    "dagtune before those records; its search plan only tells what was trained, by every study "
    "of the model together)"
)


def pick_metric(names: Iterable[str]) -> tuple[str | None, str]:
    """The metric to show when no algorithm named one, and its mode: the first validation
    metric (``val_*``) or else the first, minimized if it looks like a loss or error."""
    names = sorted(set(names))
    if not names:
        return None, "max"
    chosen = next((n for n in names if n.startswith("val_") and "loss" not in n), None)
    chosen = chosen or next((n for n in names if n.startswith("val_")), names[0])
    return chosen, ("min" if "loss" in chosen or "err" in chosen else "max")


def metric_of(trials: Iterable[Trial]) -> tuple[str | None, str]:
    """`pick_metric` over every metric the trials reported."""
    return pick_metric(name for trial in trials for point in trial.points for name in point.names)


def finite(value: Any) -> bool:
    """Whether `value` is a finite int or float (a metric value worth ranking or drawing)."""
    return isinstance(value, (int, float)) and math.isfinite(value)


def config_text(config: Mapping[str, Any]) -> str:
    """A config on one line, each hyper-parameter's sequence `readable`: ``lr=0.1, bs=32``."""
    return ", ".join(f"{name}={readable(sequence)}" for name, sequence in config.items())


def best_of(trials: Iterable[Trial], metric: str | None, mode: str) -> Trial | None:
    """The trial with the best final `metric`: completed trials first, then the longest, then
    the first; a NaN or infinite value is never the best. The one definition `Result.best`
    and every view use (a study keeps it as its trials change: `best_key`)."""
    scored = [(key, t) for t in trials if (key := best_key(t, metric, mode)) is not None]
    if not scored:
        return None
    pool = [pair for pair in scored if pair[1].status == COMPLETED] or scored
    return max(pool, key=lambda pair: pair[0])[1]


def best_key(trial: Trial, metric: str | None, mode: str) -> tuple[float, int, int] | None:
    """`best_of`'s rank of `trial` among the trials of its pool (completed ones, else all
    scored): the largest is the best; None where it is not scored (no finite final `metric`)."""
    if not (metric and trial.metrics and finite(value := trial.metrics.get(metric))):
        return None
    return ((1.0 if mode == "max" else -1.0) * value, trial.steps, -trial.id)


def best_note(trial: Trial) -> str:
    """Where the best trial's value comes from: ``trial 4, 30 steps`` for a completed one,
    ``trial 4, at step 18, running`` for a pending one (its value may still change), else
    ``trial 4, stopped at step 18``."""
    if trial.status == COMPLETED:
        return f"trial {trial.id}, {trial.reached} steps"
    if trial.status == PENDING:
        return f"trial {trial.id}, at step {trial.reached}, running"
    return f"trial {trial.id}, {trial.status} at step {trial.reached}"


def merge_rate_so_far(trials: Iterable[Trial]) -> tuple[float | None, int]:
    """The live merge rate, and how many trials it is over: the merge rate of the trials that
    have ended (completed, stopped, failed, diverged; each with the steps it reached), None
    while none has. A pending trial counts once it ends: shared prefixes are trained first,
    so the steps pending trials have reached are mostly shared ones, and a rate over them
    starts high and falls as branches are trained (9.0 early in the digits grid, 2.22 at its
    end). Once every trial has ended it is the report's merge rate (both are
    `dagtune.coordinator.trial_figures`)."""
    ended = [t for t in trials if t.done and t.reached > 0]
    if not ended:
        return None, 0
    return trial_figures(ended)["merge_rate"], len(ended)


def seconds_label(gpus: float | None) -> str:
    """What the report's ``gpu_seconds`` are for a study whose stages ask for `gpus` GPUs:
    GPU-seconds, or worker-seconds where they ask for none (they are counted per worker slot
    then)."""
    return "GPU-seconds" if gpus else "worker-seconds"


def reuse_text(report: Mapping[str, Any]) -> str:
    """The report's reuse as shown: ``2.22x``, or ``– (nothing executed)`` when every result
    was known already (the ratio is infinite then)."""
    if not report.get("executed_steps"):
        return "– (nothing executed)"
    return f"{report['reuse']:.2f}x"


def error_line(error: str | None, limit: int = 300) -> str:
    """The line of a failed trial's error that says what went wrong: the exception line of
    its (last) traceback (``RuntimeError: CUDA out of memory``), else its first line; cut to
    `limit` characters (the whole error is the trial's ``error``)."""
    line = _error_line(error)
    return line if len(line) <= limit else line[: limit - 1] + "…"


def divergence_line(steps: int, metrics: Mapping[str, Any]) -> str:
    """Where and why a diverged trial ended: ``after 4 steps: loss=nan`` (the steps it
    trained, and its metrics there that are NaN or infinite)."""
    bad = ", ".join(f"{name}={value}" for name, value in metrics.items() if not finite(value))
    return f"after {steps} step{'' if steps == 1 else 's'}: {bad}"


def _error_line(error: str | None) -> str:
    lines = (error or "").splitlines()
    start = max(
        (i for i, line in enumerate(lines) if line.startswith("Traceback (most recent call last)")),
        default=None,
    )
    if start is not None:
        for line in lines[start + 1 :]:
            if line.strip() and not line.startswith(" "):
                return line.strip()
    return next((line.strip() for line in lines if line.strip()), "")


def failures(trials: Iterable[Trial]) -> list[tuple[int, str]]:
    """The failed trials, as (trial id, `error_line`), in trial order."""
    return [(t.id, error_line(t.error)) for t in sorted(trials, key=lambda t: t.id) if t.status == FAILED]


def status_counts(trials: Iterable[Trial]) -> dict[str, int]:
    """How many trials have each status (every status, zeros included)."""
    counts = dict.fromkeys(STATUSES, 0)
    for trial in trials:
        counts[trial.status] = counts.get(trial.status, 0) + 1
    return counts


def trained_to(node: Any) -> int:
    """The last step known trained on a search plan node: its last step with metrics or a
    checkpoint (training is linear along a node, so everything before it was trained)."""
    return max([*node.metrics, *node.checkpoints], default=node.start)


def trained_from_plan(plan: Any, nodes: Iterable[str]) -> dict[str, int]:
    """`trained_to` of each of `nodes` the plan knows."""
    return {node: trained_to(plan.nodes[node]) for node in nodes if node in plan.nodes}


def trained_from_trials(trials: Iterable[Trial]) -> dict[str, int]:
    """The last step known trained on each node, from what the trials reached."""
    return {node: step for node, (_, step) in reached_along_paths(trials).items()}


def saved_seconds(report: Mapping[str, Any]) -> float:
    """GPU-seconds reuse saved: the trial steps not executed, at the measured seconds per step."""
    executed = report.get("executed_steps") or 0
    if not executed:
        return 0.0
    per_step = report.get("gpu_seconds", 0.0) / executed
    return max(0, report.get("trial_steps", 0) - executed) * per_step


def trials_frame(trials: Iterable[Trial]):
    """The trials frame of `trials` (`dagtune.frames` gives its columns: the same as
    ``open_results(...).trials``)."""
    return trials_table(row_of(t) for t in trials)
