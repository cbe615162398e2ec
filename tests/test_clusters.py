"""Studies on real clusters: a `dask scheduler` with two `dask worker --resources GPU=1`
processes on loopback (the page preloaded), and a single-node Slurm through dask-jobqueue."""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from distributed import Client
from slurm_helpers import spawn

import dagtune as dt
from dagtune.algos import GridSearch
from dagtune.dashboard import page_url
from dagtune.sim import SyntheticTrainer

pytestmark = pytest.mark.slow

SPACE = dt.Grid(
    {
        "lr": [dt.Constant(0.1), dt.MultiStep(0.1, [4], 0.1)],
        "momentum": [0.9, dt.Steps([0.9, 0.5], [3])],
    }
)


def run_grid(client: Client, storage: Path, name: str) -> tuple[dict, set[str]]:
    """Run the grid with GPU=1 per stage; returns the report and the workers that trained."""
    with dt.Study(SyntheticTrainer, name=name, storage=storage, client=client, resources={"GPU": 1}) as study:
        result = study.run(GridSearch(SPACE, metric="val_loss", mode="min", steps=8), timeout=240)
        events = client.get_events(study.coordinator.topic)
    workers = {msg["worker"] for _, msg in events if msg.get("kind") == "start"}
    return result.report, workers


def test_dask_scheduler_and_two_gpu_workers(tmp_path):
    scheduler_file = tmp_path / "scheduler.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    processes = [
        spawn(
            [
                sys.executable,
                "-m",
                "distributed.cli.dask_scheduler",
                "--host",
                "127.0.0.1",
                "--port",
                "0",
                "--dashboard-address",
                "127.0.0.1:0",
                "--scheduler-file",
                str(scheduler_file),
                "--preload",
                "dagtune.dashboard",
            ],
            tmp_path / "scheduler.log",
            env,
        )
    ]
    try:
        deadline = time.monotonic() + 60
        while not scheduler_file.exists():
            assert time.monotonic() < deadline and processes[0].poll() is None, (
                tmp_path / "scheduler.log"
            ).read_text()
            time.sleep(0.2)
        address = json.loads(scheduler_file.read_text())["address"]
        for i in range(2):
            processes.append(
                spawn(
                    [
                        sys.executable,
                        "-m",
                        "distributed.cli.dask_worker",
                        address,
                        "--resources",
                        "GPU=1",
                        "--nthreads",
                        "1",
                        "--host",
                        "127.0.0.1",
                        "--name",
                        f"gpu{i}",
                        "--no-dashboard",
                    ],
                    tmp_path / f"worker{i}.log",
                    {**env, "CUDA_VISIBLE_DEVICES": str(i)},
                )
            )
        with Client(address, timeout="30s") as client:
            client.wait_for_workers(2, timeout=60)
            report, workers = run_grid(client, tmp_path / "runs", "gpus")
            assert report["executed_steps"] == report["unique_steps"] == 21 < report["trial_steps"]
            assert len(workers) == 2  # both GPU workers trained
            url = page_url(client)  # the preloaded page, next to Dask's
            page = urllib.request.urlopen(url, timeout=10).read().decode()
            assert "dagtune" in page  # served (a 404 would raise), with its tab in Dask's navigation
    finally:
        for process in reversed(processes):
            process.terminate()
        for process in reversed(processes):
            process.wait(timeout=30)


def test_slurm_cluster_through_dask_jobqueue(tmp_path):
    pytest.importorskip("dask_jobqueue", reason="dask-jobqueue is not installed")
    from slurm_helpers import SlurmUnavailableError, local_slurm

    from dagtune.cluster import slurm

    base = Path("/tmp") / f"dagtune-slurm-{os.getpid()}"  # short: socket paths have a length limit
    try:
        context = local_slurm(base)
        slurm_env = context.__enter__()
    except SlurmUnavailableError as error:
        pytest.skip(f"Slurm could not start: {error}")
    saved = {k: os.environ.get(k) for k in slurm_env}
    os.environ.update(slurm_env)
    try:
        cluster = slurm(
            walltime="00:30:00",
            cores=1,
            memory="1GB",
            gpus=None,
            adapt=False,
            python=sys.executable,
            log_directory=str(tmp_path / "jobs"),
            job_script_prologue=[f"export PYTHONPATH={os.pathsep.join(sys.path)}"],
            scheduler_options={"host": "127.0.0.1", "dashboard_address": "127.0.0.1:0"},
            interface=None,
        )
        script = cluster.job_script()
        assert "--resources GPU=1" in script and "--lifetime 1620s" in script
        with cluster, Client(cluster) as client:
            cluster.scale(jobs=2)
            client.wait_for_workers(2, timeout=120)
            report, workers = run_grid(client, tmp_path / "runs", "slurm")
            assert report["executed_steps"] == report["unique_steps"] == 21
            assert len(workers) == 2
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        context.__exit__(None, None, None)
        import shutil

        shutil.rmtree(base, ignore_errors=True)
