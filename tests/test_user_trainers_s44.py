"""Trainers written the way users write them, run as a study on storage and compared with
`run_alone` (`user_trainers`): where the two disagreed, or where a study hid what run_alone
shows."""

from __future__ import annotations

import pytest
from user_trainers import GetsWithDefault

import dagtune as dt
from dagtune.algos import GridSearch
from dagtune.study import Study


def test_a_default_setup_applied_is_named_by_the_resume_check_it_fails(client, tmp_path):
    """``hp.get("lr", 0.05)`` before a step where only batch_size changes applies the default;
    at the checkpoint there the resume check (a resumed trainer is handed every value) fails
    the trial, and its error names the default first (the warning goes with the failed
    step), not the model and optimizer as if load_state_dict() forgot them."""
    config = {"lr": 0.01, "batch_size": dt.Steps([32, 64], [2])}
    with (
        pytest.warns(dt.TrialsFailedWarning),
        Study(GetsWithDefault, client=client, storage=str(tmp_path), checkpoint_every=2) as study,
    ):
        result = study.run(GridSearch([config], metric="val_loss", mode="min", steps=4), progress=False)
    (failed,) = result.failed
    line = failed.error.strip().splitlines()[-1]
    assert line.startswith(
        "dagtune.resumecheck.ResumeChangedTrainingError: resuming from a checkpoint changes training. "
        "Likely cause: GetsWithDefault.setup() read hyper-parameter 'lr' with hp.get('lr', 0.05) before "
        "step 2, where 'lr' did not change, so it got the default 0.05, not the config's 0.01"
    ), line
    assert "does load_state_dict() load it?" not in line
