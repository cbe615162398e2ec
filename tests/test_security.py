"""A closed cluster: the embedded cluster admits only its study's own client (TLS with
temporary credentials), storage credentials reach the workers once, as a worker plugin, and
never inside a task, and `dagtune run` reaches a `dask scheduler` cluster that speaks TLS."""

from __future__ import annotations

import asyncio
import gc
import os
import pickle
import ssl
import sys
import textwrap

import pytest
from click.testing import CliRunner
from clusters import dask_command, scheduler_address
from distributed import Client
from distributed.comm import connect
from distributed.diagnostics.plugin import SchedulerPlugin
from distributed.security import Security
from durable_helpers import SECRET, new_bucket
from slurm_helpers import spawn

import dagtune as dt
from dagtune.cli import main
from dagtune.dashboard import SNAPSHOTS, page_url
from dagtune.execution.dask import DEMAND
from dagtune.security import embedded_security, tls_from_files
from dagtune.sim import SimulatedExecutor, SyntheticTrainer

CONFIG = {"lr": dt.Steps([0.1, 0.02], [3]), "momentum": dt.MultiStep(0.9, [4], 0.5)}
STORE_PLUGIN = "-store"  # the suffix of the worker plugin a study registers for its store

SCRIPT = textwrap.dedent(
    """
    import dagtune as dt
    from dagtune.algos import GridSearch
    from dagtune.launch import StudySetup
    from dagtune.sim import SyntheticTrainer

    def study_setup():
        space = dt.Grid({"lr": [dt.Constant(0.1), dt.MultiStep(0.1, [4], 0.1)]})
        return StudySetup(SyntheticTrainer, GridSearch(space, metric="val_loss", mode="min", steps=8), name="tls")
    """
)


def write_pems(directory) -> tuple[str, str, str]:
    """A CA file, certificate and key (one self-signed pair, as `Security.temporary` makes)."""
    made = Security.temporary()
    paths = []
    for name, text in (
        ("ca", made.tls_ca_file),
        ("cert", made.tls_client_cert),
        ("key", made.tls_client_key),
    ):
        path = directory / f"{name}.pem"
        path.write_text(text)
        paths.append(str(path))
    return paths[0], paths[1], paths[2]


def outsider(certificate: bool) -> ssl.SSLContext:
    """What a local user without the study's credentials can try: TLS that trusts any server,
    with no client certificate or with one of its own."""
    if certificate:
        context = Security.temporary().get_connection_args("client")["ssl_context"]
    else:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


def client_refused(address: str, **kwargs) -> bool:
    """Whether ``Client(address, **kwargs)`` fails to connect within 3 s. The failed client is
    collected here, at once: its ``__del__`` takes a lock that every Dask client holds while it
    starts (``LoopRunner._lock``), so a collection that finds it while another client starts
    waits forever."""
    try:
        client = Client(address, timeout="3s", **kwargs)
    except (OSError, TypeError):  # TypeError: a tls:// address and no certificate at all
        refused = True
    else:
        client.close()
        refused = False
    gc.collect()
    return refused


def identity(address: str, **connection_args) -> dict:
    """Ask the server at `address` who it is, over a fresh connection (raises if refused)."""

    async def ask() -> dict:
        comm = await connect(address, timeout="3s", **connection_args)
        try:
            await comm.write({"op": "identity", "reply": True})
            return await comm.read()
        finally:
            comm.abort()

    return asyncio.run(ask())


class TaskSpecs(SchedulerPlugin):
    """Looks at every task a client submits, as stored on the scheduler: how many there
    were and how many held the secret (pickled or shown)."""

    name = "test-task-specs"

    def __init__(self) -> None:
        self.tasks = self.secret = 0

    def update_graph(self, scheduler, *, keys=(), tasks=(), **kwargs) -> None:
        for key in {*keys, *tasks}:
            task = scheduler.tasks.get(key)
            if task is None or task.run_spec is None:
                continue
            self.tasks += 1
            shown = pickle.dumps(task.run_spec) + repr(task.run_spec).encode() + str(task.run_spec).encode()
            self.secret += SECRET.encode() in shown


def watch_task_specs(dask_scheduler) -> None:
    dask_scheduler.add_plugin(TaskSpecs())


def task_specs_seen(dask_scheduler) -> tuple[int, int]:
    plugin = dask_scheduler.plugins[TaskSpecs.name]
    return plugin.tasks, plugin.secret


def store_plugins_on_scheduler(dask_scheduler) -> dict[str, bool]:
    """The store plugins the scheduler keeps for new workers, and whether each holds the secret."""
    return {
        name: SECRET.encode() in blob
        for name, blob in dask_scheduler.worker_plugins.items()
        if name.endswith(STORE_PLUGIN)
    }


def store_plugins_on_worker(dask_worker) -> list[str]:
    return sorted(name for name in dask_worker.plugins if name.endswith(STORE_PLUGIN))


# --------------------------------------------------------------------------- no cluster needed


def test_the_study_security_setting_becomes_the_embedded_clusters(tmp_path):
    first, second = embedded_security(None), embedded_security(True)
    for made in (first, second):
        assert made.require_encryption
        assert made.tls_ca_file and made.tls_scheduler_cert and made.tls_worker_cert and made.tls_client_key
    assert first.tls_client_key != second.tls_client_key  # credentials made for one cluster alone
    assert not embedded_security(False).require_encryption
    mine = tls_from_files(*write_pems(tmp_path))
    assert embedded_security(mine) is mine
    with pytest.raises(ValueError, match="lacks a CA, a scheduler certificate, a worker certificate"):
        embedded_security(Security(require_encryption=True))
    with pytest.raises(
        ValueError, match=r"security must be True, False or a distributed\.security\.Security"
    ):
        embedded_security("yes")
    with pytest.raises(ValueError, match=r"security=True secures the embedded cluster; a given client"):
        dt.Study(SyntheticTrainer, name="s", storage=tmp_path, client=object(), security=True)
    with pytest.raises(ValueError, match=r"security=False secures the embedded cluster; a given executor"):
        dt.Study(SyntheticTrainer, name="s", storage=tmp_path, executor=SimulatedExecutor(1), security=False)


def test_certificate_files_serve_every_role_and_are_checked_at_once(tmp_path):
    ca, cert, key = write_pems(tmp_path)
    security = tls_from_files(ca, cert, key)
    assert security.require_encryption and security.tls_ca_file == ca
    for role in ("scheduler", "worker", "client"):
        assert getattr(security, f"tls_{role}_cert") == cert and getattr(security, f"tls_{role}_key") == key
    with pytest.raises(ValueError, match=r"--tls-key '.*nokey.pem': no such file"):
        tls_from_files(ca, cert, str(tmp_path / "nokey.pem"))
    (tmp_path / "junk.pem").write_text("not a certificate\n")
    with pytest.raises(ValueError, match="not a usable PEM CA, certificate and key"):
        tls_from_files(ca, str(tmp_path / "junk.pem"), key)


@pytest.mark.parametrize(
    ("options", "message", "hint"),
    [
        (
            ["--no-tls", "--scheduler", "tls://127.0.0.1:1"],
            "--no-tls is for the local cluster",
            "drop --no-tls",
        ),
        (["--no-tls", "--tls-cert", "c.pem"], "--no-tls can't be used with --tls-cert", "drop one of them"),
        (["--tls-key", "k.pem"], "--tls-key needs --tls-ca-file and --tls-cert too", "give the CA file"),
        (
            ["--tls-ca-file", "none.pem", "--tls-cert", "none.pem"],
            "--tls-ca-file 'none.pem': no such file",
            "give the PEM files",
        ),
    ],
)
def test_tls_options_of_run_are_one_line_mistakes(tmp_path, options, message, hint):
    (tmp_path / "tls.py").write_text(SCRIPT)
    out = CliRunner().invoke(main, ["run", str(tmp_path / "tls.py"), *options])
    assert out.exit_code == 2, out.output
    assert f"Error: {message}" in out.output and f"Hint: {hint}" in out.output
    assert "Traceback" not in out.output


# --------------------------------------------------------------------------- real clusters


@pytest.mark.slow
def test_only_the_studys_own_client_connects_to_the_embedded_cluster(s3_options):
    storage = f"s3://{new_bucket(s3_options)}/runs"
    with dt.Study(
        SyntheticTrainer, name="closed", storage=storage, storage_options=s3_options, workers=1
    ) as study:
        client = study.client
        address = client.scheduler.address
        assert address.startswith("tls://127.0.0.1:")
        client.run_on_scheduler(watch_task_specs)
        assert study.submit(CONFIG, 6).result(timeout=60) == dt.run_alone(SyntheticTrainer, CONFIG, 6)[-1]
        tasks, secret = client.run_on_scheduler(task_specs_seen)
        assert tasks >= 1 and secret == 0  # the stages trained on S3 without credentials in their specs
        assert list(client.run_on_scheduler(store_plugins_on_scheduler).values()) == [True]  # they came once
        study._dashboard.publish(force=True)
        study._demand.publish(force=True)
        published = client.get_metadata(list(SNAPSHOTS), default={})
        assert [snapshot["study"] for snapshot in published.values()] == ["closed"]  # the page is fed
        assert page_url(client).startswith("http://127.0.0.1:")  # and served over plain HTTP
        assert set(client.get_metadata(list(DEMAND), default={})) == {study._demand.key[-1]}  # demand too

        assert client_refused(address)  # no credentials
        assert client_refused(address, security=Security.temporary())  # others
        workers = client.scheduler_info(n_workers=-1)["workers"]
        listeners = [address, *workers, *(w["nanny"] for w in workers.values())]
        for listener in listeners:  # scheduler, worker and nanny all demand the study's certificate
            assert identity(listener, **client.security.get_connection_args("client"))["type"]
            for context in (outsider(certificate=False), outsider(certificate=True)):
                with pytest.raises(OSError):
                    identity(listener, ssl_context=context)
            with pytest.raises(OSError):
                identity(listener.replace("tls://", "tcp://"))


@pytest.mark.slow
def test_the_store_reaches_workers_as_a_plugin_and_leaves_with_the_study(client, s3_options):
    storage = f"s3://{new_bucket(s3_options)}/runs"
    with dt.Study(
        SyntheticTrainer, name="plugin", storage=storage, storage_options=s3_options, client=client
    ) as study:
        assert study.submit(CONFIG, 4).result(timeout=60) == dt.run_alone(SyntheticTrainer, CONFIG, 4)[-1]
        held = client.run(store_plugins_on_worker)
        assert len(held) == 2 and all(len(names) == 1 for names in held.values())
    assert client.run_on_scheduler(store_plugins_on_scheduler) == {}  # unregistered on close
    assert set(map(tuple, client.run(store_plugins_on_worker).values())) == {()}


@pytest.mark.slow
def test_dagtune_run_on_a_dask_scheduler_and_worker_with_tls(tmp_path):
    ca, cert, key = write_pems(tmp_path)
    tls = ["--tls-ca-file", ca, "--tls-cert", cert, "--tls-key", key]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    scheduler_file = tmp_path / "scheduler.json"
    log = tmp_path / "scheduler.log"
    processes = [
        spawn(
            dask_command(
                "scheduler",
                "--protocol",
                "tls",
                "--host",
                "127.0.0.1",
                "--port",
                "0",
                "--dashboard-address",
                "127.0.0.1:0",
                "--scheduler-file",
                str(scheduler_file),
                *tls,
            ),
            log,
            env,
        )
    ]
    try:
        address = scheduler_address(scheduler_file, processes[0], log)
        assert address.startswith("tls://127.0.0.1:")
        processes.append(
            spawn(
                dask_command(
                    "worker",
                    address,
                    "--protocol",
                    "tls",
                    "--host",
                    "127.0.0.1",
                    "--nthreads",
                    "1",
                    "--no-dashboard",
                    "--preload-nanny",
                    "dagtune.cluster",
                    *tls,
                ),
                tmp_path / "worker.log",
                env,
            )
        )
        assert client_refused(address)
        (tmp_path / "tls.py").write_text(SCRIPT)
        runs = str(tmp_path / "runs")
        out = CliRunner().invoke(
            main, ["run", str(tmp_path / "tls.py"), "--scheduler", address, "--storage", runs, *tls]
        )
        assert out.exit_code == 0, out.output + (tmp_path / "worker.log").read_text()[-3000:]
        assert "2/2 trials finished" in out.output and "for 16 trial steps (unique 12," in out.output
        missing = CliRunner().invoke(
            main, ["run", str(tmp_path / "tls.py"), "--scheduler", address, "--storage", runs]
        )
        assert missing.exit_code == 2 and f"cannot reach the Dask scheduler at {address}" in missing.output
        assert "a TLS scheduler needs --tls-ca-file and --tls-cert" in missing.output
    finally:
        for process in reversed(processes):
            process.terminate()
        for process in reversed(processes):
            process.wait(timeout=30)
