"""`run_alone`: one trial trained in this process, no reuse, no checkpoints: the reference
training through dagtune must reproduce exactly."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dagtune.config import normalize_config
from dagtune.events import MetricsReported, TaskFailed, TrainerWarned
from dagtune.fusion import FusedPathRunner
from dagtune.notices import Notices
from dagtune.runner import PathRunner
from dagtune.study._results import TrialError
from dagtune.tasks import PathTask, Segment, TrainerSpec
from dagtune.trainer import Trainer, check_torch_threads
from dagtune.validation import check_int

__all__ = ["check_evaluate_count", "run_alone"]


def run_alone(
    trainer: type[Trainer],
    config: Mapping[str, Any],
    steps: int,
    trainer_kwargs: Mapping[str, Any] | None = None,
    seed: int = 0,
    fused: bool = False,
    *,
    check_evaluate: int = 3,
    check_resume: int = 1,
    torch_threads: int | None = 1,
) -> list[dict[str, float]]:
    """Train one trial in this process, no reuse, no checkpoints; metrics after each step.

    This is the reference that training through dagtune must reproduce exactly. With
    `fused`, the trial (of a `dagtune.FusibleTrainer`) trains through the fused code path as
    a group of one: the reference every fused group's members must reproduce exactly.

    It checks the trainer as a study's workers do (`TrialError` naming what is wrong): its
    first `check_evaluate` evaluations for changing the training state, and with
    `check_resume` (unfused) whether a trainer resumed from the state after the first step
    (saved and read back in memory, as a checkpoint is) trains the second step exactly as
    this one. The trainer's code runs with torch's thread count set to `torch_threads`
    (None: as it is); the caller's count is back when it returns. Warnings about the
    trainer (a hyper-parameter ``setup()`` never reads) are shown as a study shows them.
    """
    check_int("steps", steps, minimum=1)
    check_evaluate_count(check_evaluate)
    check_evaluate_count(check_resume, "check_resume")
    check_torch_threads(torch_threads)
    config = normalize_config(config)
    task = PathTask(
        key="run_alone",
        trainer=TrainerSpec(trainer, dict(trainer_kwargs or {}), seed, ""),
        segments=(Segment("alone", config, 0, steps),),
        source=None,
        checkpoints=frozenset(),
        eval_every=1,
        check_evaluate=check_evaluate,
        check_resume=check_resume,
        torch_threads=torch_threads,
    )
    events = FusedPathRunner([task], None).run() if fused else PathRunner(task, None).run()
    notices = Notices()
    for event in events:
        if isinstance(event, TrainerWarned):
            notices.show(event)
        if isinstance(event, TaskFailed):
            raise TrialError(f"run_alone failed at step {event.step}:\n{event.traceback}")
    return [e.metrics for e in events if isinstance(e, MetricsReported)]


def check_evaluate_count(value: Any, name: str = "check_evaluate") -> None:
    """`check_evaluate` (or `check_resume`) as `Study` and `run_alone` take it: an int >= 0,
    else a ValueError naming `name`."""
    check_int(name, value, minimum=0, note="0: no check")
