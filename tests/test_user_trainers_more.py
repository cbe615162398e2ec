"""Trainers written the way users write them (`user_trainers`), beyond the MNIST-style ones of
`test_resumecheck` and `test_failures`: what dagtune says when one does what it can't take."""

from __future__ import annotations

import multiprocessing

import pytest
from user_trainers import MnistStyle, SeedsInSetup

from dagtune.runner import failure_fields
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


def _run_alone_daemonic(queue) -> None:
    """`run_alone` of `LoaderWorkers` in a daemonic process (as a Dask worker's is): what failed."""
    from user_trainers import LoaderWorkers

    try:
        run_alone(LoaderWorkers, {"lr": 0.05}, 1, check_resume=0)
        queue.put("")
    except TrialError as error:
        queue.put(str(error))


def test_a_dataloader_with_workers_in_a_daemonic_worker_names_the_fix():
    context = multiprocessing.get_context("spawn")  # a Dask worker process, as the embedded cluster starts it
    queue = context.Queue()
    process = context.Process(target=_run_alone_daemonic, args=(queue,), daemon=True)
    process.start()
    message = queue.get(timeout=120)
    process.join(60)
    last = message.strip().splitlines()[-1]
    assert last.startswith("dagtune.trainer.DaemonicWorkerError: the trainer starts processes (a DataLoader")
    assert "DataLoader(..., num_workers=0)" in last
    assert "dask.config.set({'distributed.worker.daemon': False})" in last
    assert "AssertionError: daemonic processes are not allowed to have children" in message  # its cause


def test_an_error_dagtune_knows_no_fix_for_is_reported_as_it_is():
    error = AssertionError("some other assertion")
    fields = failure_fields(error)
    assert fields["error"] == "AssertionError: some other assertion"
    assert fields["retry"]


def test_the_daemonic_error_is_not_retried():
    fields = failure_fields(AssertionError("daemonic processes are not allowed to have children"))
    assert fields["error"].startswith("DaemonicWorkerError: the trainer starts processes")
    assert not fields["retry"]  # it would fail the same way
