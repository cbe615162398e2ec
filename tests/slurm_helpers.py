"""A real single-node Slurm on this machine for one test: munged, slurmctld and slurmd
configured for this host in a temporary directory (nothing under /etc is touched), started
as child processes and stopped by their own pids. The daemons listen on loopback only
(``CommunicationParameters=NoCtldInAddrAny,NoInAddrAny``, the node and the controller at
127.0.0.1). `SlurmUnavailableError` says exactly why it could not start (the test then
skips with that reason)."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path


class SlurmUnavailableError(RuntimeError):
    pass


TOOLS = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scancel", "sinfo")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _tool(name: str) -> str:
    for directory in ("/usr/sbin", "/usr/bin", "/sbin", "/bin"):
        if os.path.exists(f"{directory}/{name}"):
            return f"{directory}/{name}"
    found = shutil.which(name)
    if found is None:
        raise SlurmUnavailableError(f"{name} is missing (Debian packages `slurm-wlm` and `munge`)")
    return found


def _tail(path: Path, lines: int = 5) -> str:
    try:
        return " | ".join(path.read_text(errors="replace").strip().splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _config(base: Path, host: str, cpus: int, memory_mb: int, socket_path: Path) -> str:
    return "\n".join(
        [
            "ClusterName=dagtune-test",
            f"SlurmctldHost={host}(127.0.0.1)",
            "CommunicationParameters=NoCtldInAddrAny,NoInAddrAny",  # bind 127.0.0.1, not every interface
            "SlurmUser=root",
            "SlurmdUser=root",
            f"SlurmctldPort={_free_port()}",
            f"SlurmdPort={_free_port()}",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={socket_path}",
            f"StateSaveLocation={base / 'state'}",
            f"SlurmdSpoolDir={base / 'spool'}",
            f"SlurmctldPidFile={base / 'slurmctld.pid'}",
            f"SlurmdPidFile={base / 'slurmd.pid'}",
            f"SlurmctldLogFile={base / 'slurmctld.log'}",
            f"SlurmdLogFile={base / 'slurmd.log'}",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "SchedulerType=sched/builtin",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "MpiDefault=none",
            "ReturnToService=2",
            "SlurmctldTimeout=30",
            "SlurmdTimeout=30",
            "InactiveLimit=0",
            "KillWait=5",
            f"NodeName={host} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory={memory_mb} State=UNKNOWN",
            "PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
            "",
        ]
    )


@contextlib.contextmanager
def local_slurm(base: Path, cpus: int = 2, memory_mb: int = 4000) -> Iterator[dict[str, str]]:
    """Start Slurm under `base`; yields the environment its commands need (SLURM_CONF)."""
    if os.geteuid() != 0:
        raise SlurmUnavailableError("a private slurmd must run as root here (it starts jobs as their user)")
    tools = {name: _tool(name) for name in TOOLS}
    host = socket.gethostname().split(".")[0]
    for sub in ("state", "spool", "munge"):
        (base / sub).mkdir(parents=True, exist_ok=True)
    os.chmod(base / "munge", 0o700)
    key = base / "munge" / "munge.key"
    key.write_bytes(os.urandom(1024))
    os.chmod(key, 0o400)
    socket_path = base / "munge" / "munge.socket"
    conf = base / "slurm.conf"
    conf.write_text(_config(base, host, cpus, memory_mb, socket_path))
    env = {**os.environ, "SLURM_CONF": str(conf)}
    processes: list[subprocess.Popen] = []
    try:
        munged = [
            tools["munged"],
            "--foreground",
            "--force",
            f"--key-file={key}",
            f"--socket={socket_path}",
            f"--pid-file={base / 'munge' / 'munged.pid'}",
            f"--log-file={base / 'munge' / 'munged.log'}",
            f"--seed-file={base / 'munge' / 'munged.seed'}",
        ]
        processes.append(subprocess.Popen(munged, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT))
        _wait(
            lambda: socket_path.exists(),
            10,
            lambda: f"munged did not start: {_tail(base / 'munge' / 'munged.log')}",
        )
        for daemon, log in (("slurmctld", "slurmctld.log"), ("slurmd", "slurmd.log")):
            command = [tools[daemon], "-D", "-f", str(conf)] + (["-N", host] if daemon == "slurmd" else [])
            processes.append(spawn(command, base / f"{daemon}.err", env))
            time.sleep(1.0)
            if processes[-1].poll() is not None:
                raise SlurmUnavailableError(
                    f"{daemon} exited: {_tail(base / log)} {_tail(base / f'{daemon}.err')}"
                )

        def idle() -> bool:
            out = subprocess.run(
                [tools["sinfo"], "-h", "-N", "-o", "%T"], env=env, capture_output=True, text=True
            )
            return out.returncode == 0 and out.stdout.strip() in ("idle", "mixed", "allocated")

        _wait(
            idle,
            40,
            lambda: (
                f"the node never became idle: {_tail(base / 'slurmctld.log')} {_tail(base / 'slurmd.log')}"
            ),
        )
        yield {
            "SLURM_CONF": str(conf),
            "PATH": os.path.dirname(tools["sbatch"]) + os.pathsep + os.environ.get("PATH", ""),
        }
    finally:
        if len(processes) == 3:  # the controller is up: end every job before the daemons
            _drain(tools, env)
        for process in reversed(processes):
            process.terminate()
        for process in reversed(processes):
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=5)


def _drain(tools: dict[str, str], env: dict[str, str], timeout: float = 60) -> None:
    """Cancel this Slurm's jobs and wait until none is left (their steps exit with them)."""

    def jobs() -> list[str]:
        out = subprocess.run([tools["squeue"], "-h", "-o", "%i"], env=env, capture_output=True, text=True)
        return out.stdout.split()

    pending = jobs()
    if pending:
        subprocess.run([tools["scancel"], *pending], env=env, capture_output=True)
    deadline = time.monotonic() + timeout
    while jobs() and time.monotonic() < deadline:
        time.sleep(0.5)


def slurm_ports(conf: Path) -> list[int]:
    """The ports slurmctld and slurmd listen on, from their slurm.conf."""
    settings = dict(line.split("=", 1) for line in conf.read_text().splitlines() if line.count("=") == 1)
    return [int(settings["SlurmctldPort"]), int(settings["SlurmdPort"])]


def listening(port: int) -> set[str]:
    """The local addresses with a TCP socket listening on `port` (from /proc/net/tcp{,6})."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            local, state = line.split()[1], line.split()[3]
            address, hex_port = local.rsplit(":", 1)
            if state == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
                if len(address) == 8:
                    found.add(socket.inet_ntop(socket.AF_INET, bytes.fromhex(address)[::-1]))
                else:
                    words = b"".join(bytes.fromhex(address[i : i + 8])[::-1] for i in range(0, 32, 8))
                    found.add(socket.inet_ntop(socket.AF_INET6, words))
    return found


def spawn(command: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    """Start `command` with its output in `log` (the child keeps the file open)."""
    with open(log, "w") as out:
        return subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)


def _wait(condition, timeout: float, reason) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.5)
    raise SlurmUnavailableError(reason())
