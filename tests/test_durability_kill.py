"""Killing things for real: a Dask worker process mid-stage, and the coordinator process
mid-study; on local disk and on the loopback S3 endpoint.

Both trainers append a line per trained step to a log (with the pid of the process that
trained it), so executed steps are counted across processes, deaths included.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import dask
import pytest
from clusters import local_client
from durable_helpers import CrashingTrainer, SlowTrainer
from durable_study_script import CHECKPOINT_EVERY, SPACE, STEPS, WORKERS

import dagtune as dt
from dagtune.config import config_from_json
from dagtune.sim import SyntheticTrainer
from dagtune.study import Study, TrialError, run_alone

pytestmark = pytest.mark.slow

HERE = os.path.dirname(os.path.abspath(__file__))


def wait_for(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"gave up waiting for {what}")
        time.sleep(0.05)


def logged(path) -> list[str]:
    return open(path).read().split() if os.path.exists(path) else []


@pytest.fixture(scope="module")
def client():
    """A cluster of its own: the test kills one of its workers."""
    with local_client(warm_up=False, silence_logs=50) as client:
        yield client


#: how the killed stage's checkpoints are made: every 4 steps, or every 0.35 s of its training
#: (steps take at least 0.1 s, so a checkpoint is due by the 4th step after the last either way)
SAVING = {"steps": {"checkpoint_every": 4}, "seconds": {"checkpoint_interval": 0.35}}


@pytest.mark.parametrize("saving", sorted(SAVING))
def test_a_worker_killed_mid_stage_resumes_from_its_last_checkpoint_elsewhere(
    client, storage, tmp_path, saving
):
    log = tmp_path / "steps.log"
    config = {"lr": dt.MultiStep(0.1, [10], 0.5), "batch_size": 128}
    steps, every = 24, 4
    with Study(
        SlowTrainer,
        {"delay": 0.1, "log": str(log)},
        name="worker-kill",
        storage=storage.url,
        storage_options=storage.options,
        client=client,
        check_resume=0,  # the test counts the trainer's steps; the check trains steps of its own
        **SAVING[saving],
    ) as study:
        handle = study.submit(config, steps)

        def past_a_checkpoint() -> bool:
            with study._lock:
                running = list(study.coordinator.running.values())
                return bool(running) and running[0].worker is not None and running[0].progress >= 10

        wait_for(past_a_checkpoint, 60, "the stage to pass step 10")
        with study._lock:
            (running,) = study.coordinator.running.values()
        worker = running.worker
        pid = client.run(os.getpid, workers=[worker])[worker]
        os.kill(pid, signal.SIGKILL)
        metrics = handle.result(timeout=120)
        loads = dict(study.coordinator.loads)
    assert metrics == run_alone(SyntheticTrainer, config, steps)[-1]
    pids = logged(log)
    print(f"worker kill ({storage.kind}): executed {len(pids)} steps for {steps} unique, loads {loads}")
    assert str(pid) in pids and len(set(pids)) == 2  # trained partly by the killed process
    assert loads["storage"] >= 1  # the rerun resumed from a committed checkpoint
    assert steps <= len(pids) <= steps + every  # at most the steps since that checkpoint again


def test_a_trainer_that_kills_its_workers_fails_its_trial_after_the_retries(tmp_path):
    # Dask gives up on a task (KilledWorker) after it took down `allowed-failures` + 1 workers;
    # 0 here keeps the test short: each attempt costs one worker process
    healthy_config = {"lr": dt.Steps([0.1, 0.05], [2])}
    with (
        dask.config.set({"distributed.scheduler.allowed-failures": 0}),
        local_client(warm_up=False, silence_logs=50) as client,
        Study(CrashingTrainer, name="crash", storage=tmp_path, client=client, max_retries=1) as study,
    ):
        crashing = study.submit({"lr": dt.Steps([0.1, 5.0], [2])}, 6)
        healthy = study.submit(healthy_config, 6)
        with pytest.raises(TrialError, match="Dask workers running this stage died"):
            crashing.result(timeout=180)
        assert healthy.result(timeout=180) == run_alone(SyntheticTrainer, healthy_config, 6)[-1]
        assert crashing.status == "failed"
        assert "KilledWorker" in crashing.trial.error
        assert crashing.trial.cause == "workers"  # retried when the study is opened again


def run_script(storage, out, log) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([HERE, os.environ.get("PYTHONPATH", "")])}
    args = [storage.url, json.dumps(storage.options), str(out), str(log)]
    return subprocess.Popen(
        [sys.executable, os.path.join(HERE, "durable_study_script.py"), *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


def test_a_killed_coordinator_is_resumed_by_running_the_study_again(storage, tmp_path):
    log, out = tmp_path / "steps.log", tmp_path / "out.json"
    unique = dt.unique_steps((c, STEPS) for c in SPACE)
    first = run_script(storage, out, log)
    try:
        wait_for(lambda: len(logged(log)) >= unique // 2, 120, "half of the study to be trained")
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(30)
    assert not out.exists()  # it did not finish
    before = len(logged(log))
    second = run_script(storage, out, log)
    output, _ = second.communicate(timeout=300)
    assert second.returncode == 0, output.decode()[-3000:]
    summary = json.loads(out.read_text())
    assert summary["ids"] == list(range(len(list(SPACE))))  # the trials of the first run, adopted
    assert summary["status"] == ["completed"] * len(list(SPACE))
    for text, metrics in summary["metrics"].items():
        assert metrics == run_alone(SyntheticTrainer, config_from_json(json.loads(text)), STEPS)[-1]
    executed = len(logged(log))
    print(
        f"coordinator kill ({storage.kind}): {before} steps before the kill, {executed} in all, "
        f"{unique} unique"
    )
    assert unique <= executed <= unique + WORKERS * CHECKPOINT_EVERY  # at most what was in flight
