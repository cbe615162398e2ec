"""Trainers written the way users write them (`user_trainers`), beyond the MNIST-style ones of
`test_resumecheck` and `test_failures`: what dagtune says when one does what it can't take."""

from __future__ import annotations

import pytest
from user_trainers import MnistStyle, SeedsInSetup

from dagtune.study import TrialError, run_alone


def test_a_setup_that_reseeds_is_named_as_the_cause():
    with pytest.raises(TrialError) as failure:
        run_alone(SeedsInSetup, {"lr": 0.05, "seed": 1}, 3)
    message = " ".join(str(failure.value).split())
    causes = message[message.index("Likely cause:") : message.index("After step")]
    assert causes.startswith(
        "Likely cause: setup() changes the global random generators (it reseeds them, e.g. "
        "torch.manual_seed(hp['seed'])"
    )
    assert "does load_state_dict() load it?" not in causes  # the model and optimizer are loaded


def test_a_setup_that_keeps_the_generators_is_not_blamed():
    run_alone(MnistStyle, {"lr": 0.05}, 3)  # passes the check: nothing to name
