"""Closing and waiting on real clusters: a study closes without raising once its work is
saved, whatever its cluster does (a stopped worker, a nanny that never closes); a study
whose workers all died says so and fails after its wait, and resumes on new workers; a
step that hangs fails after ``step_timeout`` and its worker is replaced."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time

import dask
import psutil
import pytest
from clusters import dask_command, local_client, scheduler_address
from distributed import Client
from durable_helpers import SlowTrainer

import dagtune as dt
from dagtune.algos import GridSearch
from dagtune.events import TaskFailed
from dagtune.sim import SimulatedExecutor, SyntheticTrainer
from dagtune.study import NoWorkersError, Study, TrialError, run_alone
from dagtune.study._workers import WorkerWatch

SPACE = dt.Grid({"lr": [dt.Constant(0.1), dt.MultiStep(0.1, [2], 0.1)], "batch_size": [128]})


def gone(pids) -> bool:
    """Whether none of `pids` runs any more (a zombie does not run)."""
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                return False
        except psutil.NoSuchProcess:
            continue
    return True


@pytest.mark.slow
def test_a_study_closes_with_its_results_though_a_worker_is_stopped(tmp_path):
    storage = str(tmp_path / "runs")
    pids = {}
    try:
        with Study(SyntheticTrainer, name="stopped", storage=storage, workers=2) as study:
            result = study.run(GridSearch(SPACE, metric="val_loss", mode="min", steps=4))
            pids = study.client.run(os.getpid)
            os.kill(next(iter(pids.values())), signal.SIGSTOP)  # it answers nothing from now on
    finally:
        for pid in pids.values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
    assert len(result.trials) == 2 and set(result.trials["status"]) == {"completed"}
    assert gone(pids.values())
    assert set(dt.open_results(storage, "stopped").trials["status"]) == {"completed"}


@pytest.mark.slow
def test_a_cluster_that_never_closes_is_killed_and_logged_and_the_study_keeps_its_results(
    tmp_path, caplog, monkeypatch
):
    monkeypatch.setattr("dagtune.execution._clusters.CLOSE_SECONDS", 3.0)
    storage = str(tmp_path / "runs")
    threads = set(threading.enumerate())
    with (
        dask.config.set({"distributed.nanny.preload": ["hanging_teardown"]}),
        caplog.at_level("WARNING"),
        Study(SyntheticTrainer, name="hung", storage=storage, workers=2) as study,
    ):
        result = study.run(GridSearch(SPACE, metric="val_loss", mode="min", steps=4))
        pids = study.client.run(os.getpid)
    assert "the embedded cluster did not close within 3 s" in caplog.text
    assert "killed 2 worker process(es)" in caplog.text
    assert gone(pids.values())
    # nor is its scheduler left running: its event loop's thread has stopped
    assert not [thread for thread in set(threading.enumerate()) - threads if thread.name == "IO loop"]
    assert set(result.trials["status"]) == {"completed"}
    assert set(dt.open_results(storage, "hung").trials["status"]) == {"completed"}


def test_the_worker_watch_says_when_workers_are_gone_and_back_and_gives_up_after_its_wait(caplog):
    now = [0.0]
    watch = WorkerWatch("w", adaptive=lambda: False, clock=lambda: now[0])
    watch.wait = (300.0, "dagtune.lost-workers-wait")
    with caplog.at_level("WARNING", logger="dagtune"):
        assert watch.check(slots=0, waiting=0) is None  # nothing waits: no worker is fine
        assert watch.check(slots=0, waiting=3) is None
        assert "has no Dask worker (the cluster lost them all), and 3 pending trial(s) wait" in caplog.text
        now[0] = 61.0
        assert watch.check(slots=0, waiting=3) is None
        assert "still has no Dask worker after 61 s (waiting up to 300 s)" in caplog.text
        now[0] = 70.0
        assert watch.check(slots=1, waiting=0) is None
        assert "has workers again after 70 s" in caplog.text
        now[0] = 100.0
        assert watch.check(slots=0, waiting=2) is None  # a new wait begins
        now[0] = 401.0
        error = watch.check(slots=0, waiting=2)
    assert isinstance(error, NoWorkersError)
    assert (
        "had no Dask worker for 301 s with 2 pending trial(s) waiting (Dask config dagtune.lost-workers-wait"
        in str(error)
    )


def test_an_adaptive_cluster_is_waited_for_longer():
    watch = WorkerWatch("w", adaptive=lambda: True)
    watch.check(slots=0, waiting=1)
    assert watch.wait == (3600.0, "dagtune.adaptive-wait")
    with dask.config.set({"dagtune.lost-workers-wait": "7s"}):
        watch = WorkerWatch("w", adaptive=lambda: False)
        watch.check(slots=0, waiting=1)
    assert watch.wait == (7.0, "dagtune.lost-workers-wait")


def spawn(command: list[str], log, env: dict) -> subprocess.Popen:
    return subprocess.Popen(command, stdout=open(log, "w"), stderr=subprocess.STDOUT, env=env)


def start_worker(address: str, log, env: dict) -> subprocess.Popen:
    """A `dask worker` without a nanny: once killed, nothing brings it back."""
    command = dask_command("worker", address, "--no-nanny", "--nthreads", "1", "--host", "127.0.0.1")
    return spawn([*command, "--no-dashboard"], log, env)


@pytest.mark.slow
def test_a_study_whose_workers_all_died_says_so_fails_after_its_wait_and_resumes_on_new_ones(
    tmp_path, caplog
):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    scheduler_file = tmp_path / "scheduler.json"
    command = dask_command(
        "scheduler", "--host", "127.0.0.1", "--port", "0", "--dashboard-address", "127.0.0.1:0"
    )
    processes = [spawn([*command, "--scheduler-file", str(scheduler_file)], tmp_path / "scheduler.log", env)]
    config = {"lr": dt.MultiStep(0.1, [10], 0.5), "batch_size": 128}
    storage = str(tmp_path / "runs")
    kwargs = {"delay": 0.2}
    try:
        address = scheduler_address(scheduler_file, processes[0], tmp_path / "scheduler.log")
        processes.append(start_worker(address, tmp_path / "worker0.log", env))
        with Client(address, timeout="30s") as client:
            client.wait_for_workers(1, timeout=120)
            with (
                dask.config.set({"dagtune.lost-workers-wait": "3s"}),
                caplog.at_level("WARNING", logger="dagtune"),
                Study(
                    SlowTrainer, kwargs, name="lost", storage=storage, client=client, checkpoint_every=2
                ) as study,
            ):
                handle = study.submit(config, 30)
                deadline = time.monotonic() + 120
                while not any(metrics for _, metrics in handle.curve()):
                    assert time.monotonic() < deadline, "no step was trained"
                    time.sleep(0.05)
                processes[1].kill()  # SIGKILL: the cluster's only worker is gone for good
                with pytest.raises(NoWorkersError, match="had no Dask worker for"):
                    handle.result(timeout=300)
                assert handle.status == "pending"
            assert (
                "has no Dask worker (the cluster lost them all), and 1 pending trial(s) wait" in caplog.text
            )
            processes.append(start_worker(address, tmp_path / "worker1.log", env))
            client.wait_for_workers(1, timeout=120)
            with Study(
                SlowTrainer, kwargs, name="lost", storage=storage, client=client, checkpoint_every=2
            ) as study:
                (trial,) = study.trials  # the same trial, resumed
                assert trial.result(timeout=300) == run_alone(SlowTrainer, config, 30)[-1]
                assert [metrics for _, metrics in trial.curve()] == run_alone(SlowTrainer, config, 30)
    finally:
        for process in reversed(processes):
            if process.poll() is None:
                process.terminate()
        for process in reversed(processes):
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:  # a worker still saying goodbye to its scheduler
                process.kill()
                process.wait(timeout=30)


def pids_now(client) -> set[int]:
    """The worker processes' pids (a worker being replaced may not answer: asked again)."""
    for _ in range(50):
        try:
            return set(client.run(os.getpid).values())
        except Exception:
            time.sleep(0.2)
    return set(client.run(os.getpid).values())


class HangingTrainer(SyntheticTrainer):
    """`SyntheticTrainer` whose step 2 never ends for a learning rate of 1 or more (a
    ``train()`` waiting on something that never comes)."""

    def train(self) -> dict:
        if float(self.hp["lr"]) >= 1.0 and self.step == 2:
            time.sleep(3600)
        return super().train()


def cancels_arrive_late(client, seconds: float) -> None:
    """Hold `client`'s cancels `seconds` before they leave for the scheduler (its batched
    stream lagging behind its calls, as on a loaded machine)."""
    send = client._send_to_scheduler

    def late(message: dict) -> None:
        if message.get("op") == "cancel-keys":
            client.loop.call_later(seconds, send, message)
        else:
            send(message)

    client._send_to_scheduler = late


def executing(client) -> dict[str, int]:
    """How many tasks each worker's threads run now (cancelled ones included)."""
    return client.run(lambda dask_worker: dask_worker.state.executing_count)


@pytest.mark.slow
def test_a_hanging_step_fails_after_step_timeout_and_its_worker_is_replaced(tmp_path):
    # its own cluster: the test restarts a worker, which no other test should inherit
    with local_client(warm_up=False, resources={"GPU": 1}) as client:
        before = client.run(os.getpid)
        # the cancel of the hung task reaches the scheduler after the restart could: a worker
        # that left with the task still running there would have it rescheduled elsewhere
        cancels_arrive_late(client, 3.0)
        with Study(
            HangingTrainer,
            name="hang",
            storage=str(tmp_path / "runs"),
            client=client,
            resources={"GPU": 1},
            step_timeout=10,
            max_retries=0,
        ) as study:
            hung = study.submit({"lr": 1.0, "batch_size": 128}, 6)
            with pytest.raises(TrialError) as failed:
                hung.result(timeout=300)
            assert "StepTimeoutError: step 2 did not finish within step_timeout=10 s" in str(failed.value)
            assert "time.sleep(3600)" in str(failed.value)  # where it hung
            assert hung.trial.cause == "timeout"
            deadline = time.monotonic() + 120
            while set(before.values()) <= pids_now(client):
                assert time.monotonic() < deadline, "the worker was not replaced"
                time.sleep(0.2)
            client.wait_for_workers(2, timeout=120)
            # the hung task was not run again on the other worker, whose thread it would hold
            assert set(executing(client).values()) == {0}
            fine = study.submit({"lr": 0.1, "batch_size": 128}, 6)  # the workers train on
            assert (
                fine.result(timeout=300) == run_alone(HangingTrainer, {"lr": 0.1, "batch_size": 128}, 6)[-1]
            )
        assert len(pids_now(client) - set(before.values())) == 1  # one replaced


class AbandonRecorder(SimulatedExecutor):
    """A simulated executor that records which tasks and workers it was asked to abandon."""

    def __init__(self, slots: int):
        super().__init__(slots)
        self.abandoned: list[tuple[str, str | None]] = []

    def abandon(self, key: str, worker: str | None) -> None:
        self.abandoned.append((key, worker))


def test_a_hang_in_a_task_that_already_ended_replaces_its_worker_too():
    # Dask may run a task again on another worker after the study gave it up: that run's
    # timeout is reported for a task the study no longer runs, and its worker is as stuck
    executor = AbandonRecorder(1)
    with Study(
        SyntheticTrainer, name="x", storage="memory://abandon", executor=executor, step_timeout=5
    ) as study:
        hung = TaskFailed("t-gone", "a", None, 2, 1.0, "StepTimeoutError", cause="timeout", worker="tcp://w2")
        broken = TaskFailed("t-other", "a", None, 2, 1.0, "ValueError", worker="tcp://w1")
        assert study.coordinator.dispatcher.handle(hung) == []
        assert study.coordinator.dispatcher.handle(broken) == []
    assert executor.abandoned == [("t-gone", "tcp://w2")]


@pytest.mark.parametrize("value", [0, -1, float("inf"), float("nan"), True, "5"])
def test_step_timeout_is_checked(value):
    with pytest.raises(
        ValueError, match=f"step_timeout must be a positive number of seconds or None, got {value!r}"
    ):
        Study(
            SyntheticTrainer,
            name="x",
            storage="memory://x",
            executor=SimulatedExecutor(1),
            step_timeout=value,
        )


@pytest.mark.parametrize("value", ["0", "-3", "soon"])
def test_dagtune_run_checks_step_timeout(value):
    from click.testing import CliRunner

    from dagtune.cli import main

    out = CliRunner().invoke(main, ["run", "examples/digits.py", "--step-timeout", value])
    assert out.exit_code == 2
    assert "Invalid value for '--step-timeout'" in out.output and value in out.output


def test_a_fused_task_given_up_fails_each_member():
    from fusion_helpers import task

    from dagtune.fusion import FusedPathRunner

    members = [
        task("a", {"lr": 0.1, "batch_size": 32}, 4),
        task("b", {"lr": 0.05, "batch_size": 32}, 6, node=10),
    ]
    runner = FusedPathRunner(members, None)  # given up while building: before the first step
    events = runner.timeout_events(7.0, "  File ...")
    assert [(e.kind, e.task, e.step, e.cause) for e in events] == [
        ("error", "a", 1, "timeout"),
        ("error", "b", 1, "timeout"),
    ]
    assert (
        events[1].error
        == "StepTimeoutError: step 0 did not finish within step_timeout=7 s; its worker is replaced"
    )
    assert events[1].traceback.endswith("Where the step was when it was given up:\n  File ...")
