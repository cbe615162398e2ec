"""Torch's thread count (`Study(torch_threads=...)`, `run_alone(torch_threads=...)`): every
worker and `run_alone` build and train the trainer with the same count (default 1), so that
results agree bit for bit without the user knowing why they would not; the caller's count is
left as it was."""

from __future__ import annotations

import pytest
import torch
from user_trainers import MnistStyle

import dagtune as dt
from dagtune.sim import SimulatedExecutor
from dagtune.study import Study, model_identity, run_alone


class Threads(MnistStyle):
    """Reports the thread count it was built and trained with (a metric per step)."""

    def __init__(self, seed: int = 0):
        self.built_with = torch.get_num_threads()
        super().__init__(seed)

    def train(self):
        return {**super().train(), "threads": torch.get_num_threads(), "built_with": self.built_with}


@pytest.fixture
def caller_threads():
    """The caller runs with 2 threads (as a user's process on a multi-core machine does)."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield 2
    torch.set_num_threads(before)


def test_run_alone_trains_with_one_thread_and_gives_the_callers_back(caller_threads):
    metrics = run_alone(Threads, {"lr": 0.05}, 2)
    assert {(m["threads"], m["built_with"]) for m in metrics} == {(1.0, 1.0)}
    assert torch.get_num_threads() == caller_threads
    metrics = run_alone(Threads, {"lr": 0.05}, 2, torch_threads=2)
    assert {m["threads"] for m in metrics} == {2.0}
    torch.set_num_threads(3)
    assert {m["threads"] for m in run_alone(Threads, {"lr": 0.05}, 1, torch_threads=None)} == {3.0}


def test_a_study_trains_with_the_same_count_and_matches_run_alone(caller_threads):
    study = Study(Threads, executor=SimulatedExecutor(2))
    config = {"lr": dt.Steps([0.05, 0.01], [2])}
    result = study.submit(config, 4).result()
    assert result["threads"] == 1.0 and result["built_with"] == 1.0
    assert torch.get_num_threads() == caller_threads  # between steps the caller's count is back
    assert result == run_alone(Threads, config, 4)[-1]


def test_another_count_is_another_model_identity():
    default = model_identity(MnistStyle, {}, 0)
    assert model_identity(MnistStyle, {}, 0, torch_threads=1) == default
    assert model_identity(MnistStyle, {}, 0, torch_threads=2) != default
    assert model_identity(MnistStyle, {}, 0, torch_threads=None) not in (
        default,
        model_identity(MnistStyle, {}, 0, torch_threads=2),
    )
    assert Study(MnistStyle, executor=SimulatedExecutor(1), torch_threads=4).identity == model_identity(
        MnistStyle, {}, 0, torch_threads=4
    )


@pytest.mark.parametrize("value", [0, -1, 1.5, True, "1"])
def test_the_count_is_checked(value):
    with pytest.raises(ValueError, match=r"torch_threads must be a positive int or None"):
        Study(MnistStyle, executor=SimulatedExecutor(1), torch_threads=value)
    with pytest.raises(ValueError, match=r"torch_threads must be a positive int or None"):
        run_alone(MnistStyle, {"lr": 0.1}, 1, torch_threads=value)


@pytest.mark.slow
def test_dask_workers_train_with_the_studys_count(client, tmp_path):
    with Study(
        Threads, name="threads", storage=tmp_path, client=client, resources={"GPU": 1}, torch_threads=2
    ) as study:
        result = study.submit({"lr": 0.05}, 2).result(timeout=120)
    assert result["threads"] == 2.0 and result["built_with"] == 2.0
