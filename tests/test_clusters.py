"""Studies on real clusters: a `dask scheduler` with two `dask worker --resources GPU=1`
processes on loopback (the page preloaded), adaptive scaling driven by dagtune's demand (a
local cluster, and a single-node Slurm through dask-jobqueue), and the pieces behind them
without any cluster: `DemandAdaptive`'s target, `slurm()`'s job script, GPU pinning."""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import dask
import pytest
from clusters import dask_command, scheduler_address
from distributed import Client, LocalCluster
from durable_helpers import SlowTrainer
from slurm_helpers import spawn

import dagtune as dt
from dagtune.algos import GridSearch
from dagtune.dashboard import page_url
from dagtune.events import TaskStarted
from dagtune.execution._wire import unpack
from dagtune.execution.dask import (
    DASK_TRIM,
    DEMAND,
    TRIM,
    DemandAdaptive,
    dask_setup,
    embedded_cluster,
    quiet_monitoring,
    slow_allocator_workers,
    total_demand,
)
from dagtune.sim import SyntheticTrainer

SPACE = dt.Grid(
    {
        "lr": [dt.Constant(0.1), dt.MultiStep(0.1, [4], 0.1)],
        "momentum": [0.9, dt.Steps([0.9, 0.5], [3])],
    }
)


def run_grid(
    client: Client, storage: Path, name: str, trainer: type = SyntheticTrainer, **trainer_kwargs
) -> tuple[dict, set[str]]:
    """Run the grid with GPU=1 per stage; returns the report and the workers that trained."""
    with dt.Study(
        trainer, trainer_kwargs, name=name, storage=storage, client=client, resources={"GPU": 1}
    ) as study:
        result = study.run(GridSearch(SPACE, metric="val_loss", mode="min", steps=8), timeout=240)
        events = client.get_events(study.coordinator.topic)
    return result.report, started_on(events)


def started_on(events: list[tuple[float, bytes]]) -> set[str]:
    """The workers that started tasks, from a study's topic (each message: one step's events)."""
    return {event.worker for _, batch in events for event in unpack(batch) if isinstance(event, TaskStarted)}


# --------------------------------------------------------------------------- no cluster needed


class FakeScheduler:
    """What `Adaptive` asks of the scheduler: its own target and the metadata."""

    def __init__(self, base: int, published: object):
        self.base, self.published, self.metadata = base, published, {}

    async def adaptive_target(self, target_duration=None) -> int:
        return self.base

    async def get_metadata(self, keys, default=None):
        assert list(keys) == list(DEMAND)
        return self.published

    async def set_metadata(self, keys, value) -> None:
        self.metadata[tuple(keys)] = value

    async def workers_to_close(self, target, **kwargs) -> list[str]:
        return [f"w{i}" for i in range(target, 100)]


class FakeCluster:
    name = "fake"

    def __init__(self, workers: int, planned: int, base: int, published: object):
        self.scheduler_comm = FakeScheduler(base, published)
        self.observed = {f"w{i}" for i in range(workers)}
        self.plan = self.requested = {f"w{i}" for i in range(planned)}


@pytest.mark.parametrize(
    ("workers", "planned", "base", "published", "minimum", "maximum", "target", "decision"),
    [
        (0, 0, 0, {}, 0, 4, 0, "same"),  # nothing to do: nothing asked
        (0, 0, 0, {"a-1": 2}, 0, 4, 2, "up"),  # dagtune's queue alone starts workers (Dask sees no task)
        (1, 1, 1, {"a-1": 3}, 0, 2, 2, "up"),  # the workers there are + the demand, within the maximum
        (1, 2, 1, {"a-1": 1}, 0, 4, 2, "same"),  # one more is on its way already
        (2, 2, 1, {"a-1": 1, "b-2": 2}, 0, 8, 5, "up"),  # studies' demands add up
        (0, 0, 0, {"a": -2, "b": True, "c": "x", "d": 1}, 1, 4, 1, "up"),  # malformed ones count as nothing
        (3, 3, 5, {"a-1": 1}, 0, 8, 5, "up"),  # Dask's own target when it is larger
        (2, 2, 0, {}, 1, 4, 1, "same"),  # no demand: Dask decides (scale down after wait_count)
    ],
)
def test_demand_adaptive_targets_workers_plus_demand(
    workers, planned, base, published, minimum, maximum, target, decision
):
    cluster = FakeCluster(workers, planned, base, published)
    adaptive = DemandAdaptive(cluster, interval=0, minimum=minimum, maximum=maximum, wait_count=3)
    assert asyncio.run(adaptive.safe_target()) == target
    assert asyncio.run(adaptive.recommendations(target))["status"] == decision
    assert adaptive.history[-1][2] == total_demand(published)
    assert cluster.scheduler_comm.metadata[("dagtune", "adaptive", "fake")]["maximum"] == maximum


def test_slurm_job_script_without_slurm():
    pytest.importorskip("dask_jobqueue", reason="dask-jobqueue is not installed")
    from dagtune.cluster import slurm

    local = {"scheduler_options": {"host": "127.0.0.1", "dashboard_address": "127.0.0.1:0"}}
    with slurm(
        queue="gpu",
        account="proj",
        walltime="12:00:00",
        cores=8,
        memory="64GB",
        gpus=2,
        maximum=4,
        worker_extra_args=["--no-dashboard", "--resources", "MEM=4e9", "--lifetime-stagger=60s"],
        **local,
    ) as cluster:
        script = cluster.job_script()
        adaptive = cluster._adaptive
    for line in ("#SBATCH -p gpu", "#SBATCH -A proj", "#SBATCH -t 12:00:00", "#SBATCH --gres=gpu:2"):
        assert line in script
    # two worker processes, one per GPU, each offering GPU=1 and pinned to its GPU
    assert "--nworkers 2" in script and "--nthreads 4" in script
    assert "--preload-nanny dagtune.cluster" in script and "export DAGTUNE_PIN_GPUS=1" in script
    assert script.count("--resources") == 1 and "--resources GPU=1,MEM=4e9" in script  # merged
    assert "--lifetime 42600s" in script  # 10 minutes before the walltime
    assert "--lifetime-stagger 60s" in script and "--lifetime-stagger 300s" not in script  # the user's
    assert "--no-dashboard" in script
    assert isinstance(adaptive, DemandAdaptive)
    assert (adaptive.minimum, adaptive.maximum) == (0, 8)  # 4 jobs of 2 workers
    assert adaptive.interval == 30 and adaptive.wait_count == 20  # 10 idle minutes

    with slurm(walltime="01:00:00", adapt=False, minimum=0, **local) as cluster:
        script = cluster.job_script()
        assert getattr(cluster, "_adaptive", None) is None
    assert "--gres=gpu:1" in script and "--nworkers" not in script and "DAGTUNE_PIN_GPUS" not in script
    assert "--preload-nanny dagtune.cluster" in script  # for the allocator settings only
    assert (
        "--resources GPU=1 " in script
        and "--lifetime 3240s" in script
        and "--lifetime-stagger 180s" in script
    )
    with pytest.raises(ValueError, match="can't be shared by 4 worker processes"):
        slurm(cores=2, gpus=4)


def test_each_worker_of_a_job_gets_its_own_gpu(monkeypatch):
    monkeypatch.setenv("DAGTUNE_PIN_GPUS", "1")  # what a job script with several GPUs exports
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,5")
    nanny = SimpleNamespace(name="SLURMCluster-3-1", env={})
    dask_setup(nanny)
    assert nanny.env["CUDA_VISIBLE_DEVICES"] == "5"  # the job's second GPU
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    first = SimpleNamespace(name="SLURMCluster-3-0", env={})
    dask_setup(first)
    assert first.env["CUDA_VISIBLE_DEVICES"] == "0"
    dask_setup(SimpleNamespace(name="a worker, not a nanny"))  # nothing to pin, no error


def test_the_nanny_preload_drops_dasks_trim_threshold_and_pins_only_when_asked(monkeypatch):
    monkeypatch.delenv("DAGTUNE_PIN_GPUS", raising=False)
    monkeypatch.delenv(TRIM, raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "7")  # a one-GPU job: Slurm pinned it already
    nanny = SimpleNamespace(
        name="SLURMCluster-3", env={TRIM: "65536", "OMP_NUM_THREADS": "1"}, pre_spawn_env={TRIM: "65536"}
    )
    dask_setup(nanny)
    assert nanny.env == {"OMP_NUM_THREADS": "1"} and nanny.pre_spawn_env == {}
    monkeypatch.setenv(TRIM, "65536")  # the job's environment chose one: kept
    chosen = SimpleNamespace(name="w", env={TRIM: "65536"}, pre_spawn_env={TRIM: "65536"})
    dask_setup(chosen)
    assert chosen.env == {TRIM: "65536"} and chosen.pre_spawn_env == {TRIM: "65536"}


def test_the_embedded_cluster_refuses_gpus_this_machine_does_not_have(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(ValueError, match=r"resources=\{'GPU': 1\}: this machine has 0 visible GPU"):
        dt.Study(SyntheticTrainer, name="cpu", storage=tmp_path, resources={"GPU": 1})
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    with pytest.raises(ValueError, match=r"workers=3: .* 2 visible GPU\(s\), enough for 1 worker\(s\) of 2"):
        dt.Study(SyntheticTrainer, name="few", storage=tmp_path, resources={"GPU": 2}, workers=3)


@pytest.mark.slow
def test_the_embedded_cluster_has_one_worker_pinned_to_each_visible_gpu(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")  # two GPUs as a scheduler would give them
    with dt.Study(SyntheticTrainer, name="pinned", storage=tmp_path, resources={"GPU": 1}) as study:
        client = study.client
        assert client.scheduler.address.startswith("tls://127.0.0.1:")  # closed, as every embedded cluster
        workers = client.scheduler_info(n_workers=-1)["workers"]
        assert sorted(w["resources"]["GPU"] for w in workers.values()) == [1, 1]
        pinned = client.run(lambda: os.environ.get("CUDA_VISIBLE_DEVICES"))
        assert sorted(pinned.values()) == ["3", "5"]
        assert set(client.run(os.environ.get, TRIM).values()) == {None}  # glibc's own thresholds
        assert page_url(client) is not None  # the dagtune page, as on any embedded cluster
        config = {"lr": dt.Steps([0.1, 0.02], [3])}
        assert study.submit(config, 6).result(timeout=60) == dt.run_alone(SyntheticTrainer, config, 6)[-1]


def test_the_embedded_cluster_keeps_glibcs_malloc_thresholds_and_monitors_less_often(monkeypatch):
    """Also: its scheduler and nanny watch their event loops every 200 ms (Dask: 20 ms) and its
    worker too, sampling its tasks' stacks every 100 ms (Dask: 10 ms): `quiet_monitoring`."""
    monkeypatch.delenv(TRIM, raising=False)
    with dask.config.set({DASK_TRIM: 65536}):  # Dask's default (conftest drops it for other tests)
        cluster = embedded_cluster(1, None)
    with cluster, Client(cluster) as client:
        assert list(client.run(os.environ.get, TRIM).values()) == [None]
        assert slow_allocator_workers(client) == {}
        ticks = [cluster.scheduler._tick_interval, *(n._tick_interval for n in cluster.workers.values())]
        assert ticks == [0.2, 0.2]
        assert list(client.run(lambda dask_worker: dask_worker._tick_interval).values()) == [0.2]
        assert list(client.run(dask.config.get, "distributed.worker.profile.interval").values()) == ["100ms"]
    assert TRIM not in os.environ  # the nanny leaked nothing into this process
    assert dask.config.get("distributed.admin.tick.interval") == "20ms"  # this process's config as it was


def test_quiet_monitoring_leaves_a_cadence_the_user_set():
    with dask.config.set({"distributed.admin.tick.interval": "50ms"}), quiet_monitoring():
        assert dask.config.get("distributed.admin.tick.interval") == "50ms"
        assert dask.config.get("distributed.worker.profile.interval") == "100ms"


@pytest.mark.slow
def test_a_local_cluster_scales_for_dagtunes_demand(tmp_path):
    space = dt.Grid({"lr": [0.1, 0.05, 0.02, 0.01]})  # four trials, apart from step 0
    with (
        LocalCluster(
            n_workers=0,
            processes=False,
            protocol="tcp://",
            host="127.0.0.1",
            dashboard_address="127.0.0.1:0",
            resources={"GPU": 1},
        ) as cluster,
        Client(cluster) as client,
        dask.config.set({"dagtune.adaptive-wait": "60s"}),  # fail, not hang, if no worker comes
    ):
        adaptive = cluster.adapt(
            Adaptive=DemandAdaptive, minimum=0, maximum=3, interval="200ms", wait_count=50
        )
        with dt.Study(
            SlowTrainer, {"delay": 0.1}, name="grow", storage=tmp_path, client=client, resources={"GPU": 1}
        ) as study:  # no worker yet: the study waits for one, asking for it
            assert len(client.scheduler_info()["workers"]) >= 1
            # 4 s a trial: the third worker joins (within a second or two on a loaded machine)
            # while the last two trials still wait for a slot
            result = study.run(GridSearch(space, metric="val_loss", mode="min", steps=40), timeout=120)
            events = client.get_events(study.coordinator.topic)
        assert client.get_metadata(list(DEMAND)) == {}  # withdrawn on close
    assert result.report["executed_steps"] == result.report["unique_steps"] == 160
    assert len(started_on(events)) == 3
    _, base, demand, workers, _ = next(h for h in adaptive.history if h[-1] >= 3)
    assert demand > 0 and base <= workers  # it grew for dagtune's demand: Dask alone would not have


@pytest.mark.slow
def test_dask_scheduler_and_two_gpu_workers(tmp_path, caplog):
    scheduler_file = tmp_path / "scheduler.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    processes = [
        spawn(
            dask_command(
                "scheduler",
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
            ),
            tmp_path / "scheduler.log",
            env,
        )
    ]
    try:
        address = scheduler_address(scheduler_file, processes[0], tmp_path / "scheduler.log")
        for i in range(2):
            processes.append(
                spawn(
                    dask_command(
                        "worker",
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
                        *(["--preload-nanny", "dagtune.cluster"] if i else []),
                    ),
                    tmp_path / f"worker{i}.log",
                    {**env, "CUDA_VISIBLE_DEVICES": str(i)},
                )
            )
        with Client(address, timeout="30s") as client:
            client.wait_for_workers(2, timeout=60)
            names = {w["name"]: a for a, w in client.scheduler_info(n_workers=-1)["workers"].items()}
            # gpu0 has Dask's 64 KiB trim threshold, gpu1 dropped it through dagtune's preload
            assert slow_allocator_workers(client) == {names["gpu0"]: 65536}
            pinned = client.run(lambda: os.environ.get("CUDA_VISIBLE_DEVICES"))
            assert pinned == {names["gpu0"]: "0", names["gpu1"]: "1"}  # the preload pinned nothing
            with caplog.at_level("WARNING", logger="dagtune"):
                report, workers = run_grid(client, tmp_path / "runs", "gpus")
            assert "1 worker(s) run with MALLOC_TRIM_THRESHOLD_=65536" in caplog.text
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


@pytest.mark.slow
def test_slurm_cluster_scales_adaptively_through_dask_jobqueue(tmp_path):
    pytest.importorskip("dask_jobqueue", reason="dask-jobqueue is not installed")
    from slurm_helpers import SlurmUnavailableError, listening, local_slurm, slurm_ports

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
        for port in slurm_ports(Path(slurm_env["SLURM_CONF"])):
            assert listening(port) == {"127.0.0.1"}  # loopback only, not every interface
        cluster = slurm(
            walltime="00:30:00",
            cores=1,
            memory="1GB",
            gpus=None,
            minimum=1,
            maximum=2,
            adapt_interval=1.0,
            python=sys.executable,
            log_directory=str(tmp_path / "jobs"),
            job_script_prologue=[f"export PYTHONPATH={os.pathsep.join(sys.path)}"],
            scheduler_options={"host": "127.0.0.1", "dashboard_address": "127.0.0.1:0"},
            interface="lo",  # the workers listen on loopback
            worker_extra_args=["--no-dashboard"],
        )
        script = cluster.job_script()
        assert "--resources GPU=1" in script and "--lifetime 1620s" in script
        assert "--interface lo" in script and "--no-dashboard" in script
        with cluster, Client(cluster) as client, dask.config.set({"dagtune.adaptive-wait": "180s"}):
            # the study waits for the minimum's job, then asks for more as its stages branch
            report, workers = run_grid(client, tmp_path / "runs", "slurm", SlowTrainer, delay=1.0)
            jobs = len(cluster.workers)
            history = list(cluster._adaptive.history)
            scaled = [r["n"] for _, r in cluster._adaptive.log if r["status"] == "up"]
            worker_hosts = {w["host"] for w in client.scheduler_info(n_workers=-1)["workers"].values()}
        assert report["executed_steps"] == report["unique_steps"] == 21
        assert len(workers) == 2  # the second job's worker trained too
        assert jobs == 2 and scaled == [1, 2]  # from its minimum of one job to two
        _, base, demand, workers, _ = next(h for h in history if h[-1] >= 2)
        assert demand > 0 and base <= workers == 1  # for dagtune's demand: Dask's own target said one
        assert worker_hosts == {"127.0.0.1"}
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        context.__exit__(None, None, None)
        import shutil

        shutil.rmtree(base, ignore_errors=True)


def test_embedded_workers_print_no_heartbeat_failure_when_the_studys_scheduler_goes():
    """A worker whose heartbeat can't reach the study's scheduler (the study is closing after
    Ctrl-C) prints nothing of it: the study's one line is what the user reads. Other worker
    records still pass. The preload is loaded by the name the embedded cluster gives it."""
    import importlib
    import threading

    from dagtune.execution._clusters import QUIET_WORKERS

    class Kept(logging.Handler):
        def __init__(self):
            super().__init__(logging.ERROR)
            self.messages: list[str] = []

        def emit(self, record: logging.LogRecord) -> None:
            self.messages.append(record.getMessage())

    preload = importlib.import_module(QUIET_WORKERS)
    logger = logging.getLogger("distributed.worker")  # distributed's loggers don't propagate
    before, kept = list(logger.filters), Kept()
    setup = threading.Thread(target=preload.dask_setup, args=(None,))  # not the main thread:
    setup.start()  # this process's signal handlers stay as they are
    setup.join()
    logger.addHandler(kept)
    try:
        try:
            raise OSError("Stream is closed")
        except OSError:
            logger.exception("Failed to communicate with scheduler during heartbeat.")
            logger.exception("Unexpected exception during heartbeat. Closing worker.")
        assert kept.messages == ["Unexpected exception during heartbeat. Closing worker."]
    finally:
        logger.removeHandler(kept)
        logger.filters[:] = before
