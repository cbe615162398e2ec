"""`run_alone`: one trial trained in this process, no reuse, no checkpoints: the reference
training through dagtune must reproduce exactly."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dagtune.config import normalize_config
from dagtune.fusion import FusedPathRunner
from dagtune.runner import PathRunner
from dagtune.study._results import TrialError
from dagtune.tasks import PathTask, Segment, TrainerSpec
from dagtune.trainer import Trainer

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
) -> list[dict[str, float]]:
    """Train one trial in this process, no reuse, no checkpoints; metrics after each step.

    This is the reference that training through dagtune must reproduce exactly. With
    `fused`, the trial (of a `dagtune.FusibleTrainer`) trains through the fused code path as
    a group of one: the reference every fused group's members must reproduce exactly. Its
    first `check_evaluate` evaluations are checked for changing the training state, as a
    study's workers do (`TrialError` naming what changed).
    """
    if isinstance(steps, bool) or not isinstance(steps, int) or steps <= 0:
        raise ValueError(f"steps must be a positive int, got {steps!r}")
    check_evaluate_count(check_evaluate)
    config = normalize_config(config)
    task = PathTask(
        key="run_alone",
        trainer=TrainerSpec(trainer, dict(trainer_kwargs or {}), seed, ""),
        segments=(Segment("alone", config, 0, steps),),
        source=None,
        checkpoints=frozenset(),
        eval_every=1,
        check_evaluate=check_evaluate,
    )
    events = FusedPathRunner([task], None).run() if fused else PathRunner(task, None).run()
    for event in events:
        if event["kind"] == "error":
            raise TrialError(f"run_alone failed at step {event['step']}:\n{event['traceback']}")
    return [e["metrics"] for e in events if e["kind"] == "metrics"]


def check_evaluate_count(value: Any) -> None:
    """`check_evaluate` as `Study` and `run_alone` take it: an int >= 0, else a ValueError."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"check_evaluate must be an int >= 0 (0: no check), got {value!r}")
