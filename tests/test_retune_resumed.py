"""`Retune` run again on a study that holds its first run: the answer must not change.

The second session hands the first run's 2-step branches back (same config and steps) and
submits the first winner again as a new trial, whose steps are all known: its 2-step
completion reaches `Retune` after the winner has been crowned and extended to `max_steps`,
while the trial is pending again, and `Retune._train_on` took a pending winner for one
that diverged or failed and re-tuned from step 2 (8 trials, 12 steps trained, another
winner). Found on the README's path (a real Dask study, twice); now a pending winner's late
completion is let pass (its extended chunk's completion decides)."""

from __future__ import annotations

from test_algos_retune import NoisyDecay

import dagtune as dt
from dagtune.algos import Retune
from dagtune.checkpoints import CheckpointStore
from dagtune.sim import SimulatedExecutor


def run_once(path: str) -> tuple[dict, list[int], dict]:
    """One session of the study: its report, its trials' steps and the best config."""
    executor = SimulatedExecutor(2, store=CheckpointStore(path))
    with dt.Study(NoisyDecay, {"noise": 0.0}, name="rt", storage=path, executor=executor) as study:
        algorithm = Retune(
            {"lr": dt.loguniform(0.01, 0.5)},
            "loss",
            "min",
            max_steps=10,
            initial={"lr": 0.1},
            branches=3,
            trial_steps=2,
        )
        result = study.run(algorithm)
        return result.report, sorted(result.trials["steps"]), result.best.config


def test_retune_run_again_on_its_study_gives_the_same_answer_and_trains_nothing(tmp_path):
    first, first_steps, first_best = run_once(str(tmp_path))
    assert first["trials"] == 4 and first["executed_steps"] == first["unique_steps"] == 16
    again, again_steps, again_best = run_once(str(tmp_path))
    assert (again_steps, again_best) == (first_steps, first_best)
    assert again["executed_steps"] == 0
