"""Clusters for studies: the embedded cluster, SLURM GPU workers, and what a study checks
of a cluster before it starts (`check_resources`).

`slurm` returns a `dask_jobqueue.SLURMCluster` shaped for dagtune: one Dask worker process
per GPU, each offering ``GPU=1`` (what a study with ``resources={"GPU": 1}`` asks of every
stage). A job with ``gpus=1`` gets its GPU pinned by Slurm (``--gres=gpu:1`` sets
``CUDA_VISIBLE_DEVICES``); a job with ``gpus=n`` runs ``n`` worker processes and pins each to
its own GPU of the job (``dagtune.cluster``, which hands on this module's `dask_setup`, is
their ``--preload-nanny``). Workers retire by themselves (``--lifetime``) a little before
the job's walltime, so Slurm never kills one mid-stage without Dask knowing: the stage it
ran is planned again from its last checkpoint. Adaptive scaling (on by default,
`DemandAdaptive`, `_demand`) asks for jobs while stages wait for a GPU and gives them back
only after a long idle spell, because a GPU job waits in Slurm's queue far longer than a
stage takes to start. Needs ``dask-jobqueue`` (``pip install "dagtune[slurm]"``). A study
started on an adaptive cluster that has no worker yet waits for the first one (Dask config
``dagtune.adaptive-wait``, default one hour: a Slurm job can queue that long; other
clusters: ``dagtune.worker-wait``, default 30 s).

Dask's nanny starts every worker with ``MALLOC_TRIM_THRESHOLD_=65536`` (its config
``distributed.nanny.pre-spawn-environ``), so that glibc returns freed memory to the system
at once. A training loop frees and reallocates its activations at every batch, and then
pays for fresh pages each time: one epoch of the digits example takes 94 ms in a plain
process and 150 ms under that setting (`perf/RESULTS.md`). The workers dagtune starts (the
embedded cluster, `slurm`'s jobs through `dask_setup`) keep glibc's own thresholds unless
the environment sets one; on other clusters a study warns (`slow_allocator_workers`).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import re
import signal
import threading
import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from dagtune.execution._demand import DemandAdaptive, adapts, asking_for_a_worker
from dagtune.execution._security import embedded_security, protocol_of
from dagtune.execution._worker_preload import LEFT_TO_THE_STUDY
from dagtune.mainguard import check_main_guard

if TYPE_CHECKING:
    from distributed.security import Security

__all__ = [
    "CLOSE_SECONDS",
    "DASK_TRIM",
    "MONITORING",
    "NANNY_PRELOAD",
    "TRIM",
    "check_resources",
    "close_embedded",
    "dask_setup",
    "embedded_cluster",
    "glibc_thresholds",
    "quiet_monitoring",
    "slow_allocator_workers",
    "slurm",
]

log = logging.getLogger("dagtune")

TRIM = "MALLOC_TRIM_THRESHOLD_"  # glibc: free memory above this at the heap's top goes back at once
DASK_TRIM = f"distributed.nanny.pre-spawn-environ.{TRIM}"  # where Dask's nanny sets it to 64 KiB
SLOW_TRIM = 1 << 20  # below this, a training loop's frees and reallocations fault in fresh pages
#: the nanny preload (`dask_setup`) by the public path users give ``dask worker --preload-nanny``
NANNY_PRELOAD = "dagtune.cluster"

_WALLTIME = re.compile(r"^(?:(\d+)-)?(\d+):(\d{2}):(\d{2})$")


def check_resources(client: Any, resources: dict[str, float] | None, wait: float | None = None) -> None:
    """Raise a clear error if no worker offers `resources` (such a task would wait forever).

    With no workers at all yet, waits for one, asking for it meanwhile (a published demand
    of one worker, which `DemandAdaptive` scales for even at ``minimum=0``):
    up to `wait` seconds, by default Dask's config ``dagtune.adaptive-wait`` (1 hour) on an
    adaptive cluster, whose jobs may queue that long, else ``dagtune.worker-wait`` (30 s).
    Raises `TimeoutError` if none joined.
    """
    import dask
    from dask.utils import parse_timedelta

    workers = client.scheduler_info(n_workers=-1)["workers"]
    if not workers:
        adaptive = adapts(client)
        if wait is None:
            setting = "dagtune.adaptive-wait" if adaptive else "dagtune.worker-wait"
            wait = parse_timedelta(dask.config.get(setting, default="1h" if adaptive else "30s"), "seconds")
        deadline = time.monotonic() + wait
        with asking_for_a_worker(client):
            while not workers and time.monotonic() < deadline:
                time.sleep(0.5)
                workers = client.scheduler_info(n_workers=-1)["workers"]
        if not workers:
            kind = "adaptive cluster's " if adaptive else ""
            setting = "dagtune.adaptive-wait" if adaptive else "dagtune.worker-wait"
            raise TimeoutError(
                f"no Dask worker joined the {kind}scheduler at {client.scheduler.address} within "
                f"{wait:.0f} s (Dask config {setting} sets how long to wait)"
            )
    if not resources:
        return
    offers = [w.get("resources", {}) for w in workers.values()]
    if any(all(offer.get(name, 0) >= need for name, need in resources.items()) for offer in offers):
        return
    seen = sorted({", ".join(f"{k}={v:g}" for k, v in sorted(o.items())) or "no resources" for o in offers})
    hint = " ".join(f"--resources {k}={v:g}" for k, v in resources.items())
    raise ValueError(
        f"resources={resources!r}: no worker offers that much (workers offer: {'; '.join(seen)}). "
        f"Start workers with `dask worker ADDRESS {hint}` or ask for less."
    )


# --------------------------------------------------------------------------- SLURM


def _seconds(walltime: str) -> int:
    """Seconds of a Slurm walltime ``[D-]HH:MM:SS``."""
    match = _WALLTIME.match(walltime)
    if match is None:
        raise ValueError(f"walltime must be [D-]HH:MM:SS, got {walltime!r}")
    days, hours, minutes, seconds = (int(g or 0) for g in match.groups())
    return ((days * 24 + hours) * 60 + minutes) * 60 + seconds


def _parse_resources(text: str) -> dict[str, str]:
    """``"GPU=1,MEM=4e9"`` (or space separated, as `dask worker` reads it) as a dict."""
    pairs = [p for p in text.replace(",", " ").split() if p]
    parsed = {}
    for pair in pairs:
        name, sep, amount = pair.partition("=")
        if not sep or not name:
            raise ValueError(f"worker_extra_args: --resources {text!r} is not NAME=AMOUNT[,NAME=AMOUNT]")
        parsed[name] = amount
    return parsed


_OURS = ("--resources", "--lifetime", "--lifetime-stagger")


def worker_args(extra: Sequence[str], lifetime: int, stagger: int) -> list[str]:
    """The worker's arguments: ``--resources GPU=1`` merged with the user's resources,
    ``--lifetime``/``--lifetime-stagger`` unless the user gave them, then the user's other
    arguments, then dagtune's nanny preload (`dask_setup`)."""
    given: dict[str, str] = {}
    rest: list[str] = []
    items = list(map(str, extra))
    i = 0
    while i < len(items):
        item = items[i]
        name, sep, value = item.partition("=")
        if name in _OURS:
            if not sep:
                if i + 1 >= len(items):
                    raise ValueError(f"worker_extra_args: {item} needs a value")
                value = items[i + 1]
                i += 1
            given[name] = value
        else:
            rest.append(item)
        i += 1
    resources = {"GPU": "1", **_parse_resources(given.get("--resources", ""))}
    args = [
        "--resources",
        ",".join(f"{k}={v}" for k, v in resources.items()),  # no spaces: the job script does not quote
        "--lifetime",
        given.get("--lifetime", f"{lifetime}s"),
        "--lifetime-stagger",
        given.get("--lifetime-stagger", f"{stagger}s"),
        *rest,
    ]
    return [*args, "--preload-nanny", NANNY_PRELOAD]


PIN_GPUS = "DAGTUNE_PIN_GPUS"  # set by `slurm`'s job script when a job runs one worker per GPU


def dask_setup(nanny: Any) -> None:
    """``--preload-nanny dagtune.cluster``: before a nanny starts its worker process, drop
    Dask's ``MALLOC_TRIM_THRESHOLD_`` (unless this environment sets one: see the module
    docstring) and, in a job with several GPUs (``DAGTUNE_PIN_GPUS=1``), pin the worker to
    its own one: worker ``i`` of the job (``dask worker --nworkers n`` names them
    ``NAME-i``) sees only the job's ``i``-th GPU (of ``CUDA_VISIBLE_DEVICES`` as Slurm set
    it, else device ``i``)."""
    env = getattr(nanny, "env", None)
    if env is None:
        return  # not a nanny
    if TRIM not in os.environ:
        env.pop(TRIM, None)
        getattr(nanny, "pre_spawn_env", {}).pop(TRIM, None)
    if os.environ.get(PIN_GPUS) != "1":
        return
    _, _, suffix = str(getattr(nanny, "name", "")).rpartition("-")
    index = int(suffix) if suffix.isdigit() else 0
    visible = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    env["CUDA_VISIBLE_DEVICES"] = visible[index] if index < len(visible) else str(index)


def glibc_thresholds() -> contextlib.AbstractContextManager:
    """Dask config under which the nannies created inside start their workers with glibc's
    own malloc thresholds instead of Dask's 64 KiB trim threshold (unless this process's
    environment sets one, which the workers then inherit)."""
    import dask

    if TRIM in os.environ:
        return contextlib.nullcontext()
    return dask.config.set({DASK_TRIM: None})


#: Dask's cadence of its own monitoring in the embedded cluster's scheduler, nannies and
#: workers (`quiet_monitoring`), against distributed's defaults (20 ms, 10 ms)
MONITORING = {
    "distributed.admin.tick.interval": ("20ms", "200ms"),  # each server's event-loop watchdog
    "distributed.worker.profile.interval": ("10ms", "100ms"),  # each worker's stack sampling
}


def quiet_monitoring() -> contextlib.AbstractContextManager:
    """Dask config under which the embedded cluster's scheduler, nannies and workers (made
    inside; a nanny hands its config to the worker processes it starts) watch their event
    loops every 200 ms instead of 20 and sample their running tasks' stacks for Dask's
    profile every 100 ms instead of 10. Those timers cost the cluster about 0.1 s of CPU a
    second with nothing to do, two thirds of it at these settings' old values (the study's
    process 32 to 53 ms, each worker 29 to 34, against 21 to 25 and 7 to 9: perf/RESULTS.md
    section 5): CPU the study's own work waits for on a small machine. The watchdog still
    warns of a loop blocked for its 3 s limit; Dask's dashboard profile gets a tenth of the
    samples. A value this process's Dask config sets to anything but distributed's default is
    left as it is."""
    import dask
    from dask.utils import parse_timedelta

    changes = {
        key: ours
        for key, (default, ours) in MONITORING.items()
        if parse_timedelta(dask.config.get(key)) == parse_timedelta(default)
    }
    return dask.config.set(changes)


def slow_allocator_workers(client: Any) -> dict[str, int]:
    """The workers of `client` whose ``MALLOC_TRIM_THRESHOLD_`` is below 1 MiB, with its
    value (Dask's nanny sets 65536; see the module docstring). Workers that can't be asked
    are left out."""

    def threshold() -> str | None:
        return os.environ.get(TRIM)

    try:
        found = client.run(threshold)
    except Exception:  # a scheduler that refuses to run functions: nothing to report
        log.debug("dagtune: asking workers for %s failed", TRIM, exc_info=True)
        return {}
    slow = {}
    for worker, value in found.items():
        try:
            number = int(str(value).strip())
        except ValueError:
            continue  # unset, or not a number glibc would use
        if number < SLOW_TRIM:
            slow[worker] = number
    return slow


def slurm(
    *,
    queue: str | None = None,
    account: str | None = None,
    walltime: str = "24:00:00",
    cores: int = 4,
    memory: str = "32GB",
    gpus: int | None = 1,
    minimum: int = 0,
    maximum: int = 8,
    adapt: bool = True,
    idle_minutes: float = 10.0,
    adapt_interval: float = 30.0,
    job_extra_directives: Sequence[str] = (),
    worker_extra_args: Sequence[str] = (),
    **kwargs: Any,
):
    """A `SLURMCluster` of GPU workers for dagtune (see the module docstring).

    `cores` and `memory` are per job (data loading threads, host memory), shared by its
    ``gpus`` worker processes (``--gres=gpu:{gpus}``, one process per GPU, each offering
    ``GPU=1`` and pinned to its GPU). `gpus=None` asks Slurm for no GPU (CPU-only
    partitions, tests) while the one worker still offers ``GPU=1``, one stage at a time.
    `minimum`/`maximum` bound the jobs; adaptive scaling (`DemandAdaptive`) looks every
    `adapt_interval` seconds and releases a worker after `idle_minutes` idle.
    `worker_extra_args` are added to the worker's (``--resources`` merged with ``GPU=1``,
    ``--lifetime``/``--lifetime-stagger`` replacing dagtune's). Other keyword arguments go
    to `SLURMCluster` (``python``, ``interface``, ``job_script_prologue``, ...).

    Use it as ``Study(..., client=Client(cluster), resources={"GPU": 1})``.
    """
    from dask_jobqueue import SLURMCluster

    processes = max(1, gpus or 1)
    if cores < processes:
        raise ValueError(f"cores={cores} can't be shared by {processes} worker processes (one per GPU)")
    total = _seconds(walltime)
    margin = min(600, total // 10)  # retire before Slurm's kill, staggered across workers
    lifetime = max(60, total - margin)
    directives = [*job_extra_directives]
    if gpus:
        directives.append(f"--gres=gpu:{gpus}")
    cluster = SLURMCluster(
        queue=queue,
        account=account,
        walltime=walltime,
        cores=cores,
        memory=memory,
        processes=processes,
        job_extra_directives=directives,
        worker_extra_args=worker_args(worker_extra_args, lifetime, max(1, margin // 2)),
        job_script_prologue=[
            *kwargs.pop("job_script_prologue", ()),
            *([f"export {PIN_GPUS}=1"] if processes > 1 else []),
        ],
        **kwargs,
    )
    if adapt:
        cluster.adapt(
            Adaptive=DemandAdaptive,
            minimum_jobs=minimum,
            maximum_jobs=maximum,
            interval=f"{adapt_interval:g}s",
            wait_count=max(1, round(idle_minutes * 60 / adapt_interval)),
            target_duration="5 minutes",
        )
    elif minimum:
        cluster.scale(jobs=minimum)
    return cluster


def visible_gpus() -> list[str]:
    """The GPUs this process may use: ``CUDA_VISIBLE_DEVICES`` if set, else every CUDA
    device torch sees (none on a machine without CUDA)."""
    given = os.environ.get("CUDA_VISIBLE_DEVICES")
    if given is not None:
        return [d.strip() for d in given.split(",") if d.strip() and d.strip() != "-1"]
    import torch

    return [str(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []


def embedded_cluster(
    workers: int | None, resources: dict[str, float] | None, security: bool | Security | None = True
) -> Any:
    """The local cluster a study starts when it is given no client, on loopback, speaking
    TLS with credentials made for it alone unless `security` says otherwise (see
    `embedded_security`; the cluster's ``security`` is what a client needs,
    and ``Client(cluster)`` takes it from there).

    Without a ``GPU`` resource: one single-threaded worker process per core (or `workers`).
    With ``resources={"GPU": g}``: one worker per ``ceil(g)`` of this machine's visible GPUs,
    each offering only the GPUs it is pinned to (``CUDA_VISIBLE_DEVICES``), as
    ``dask worker --resources GPU=1`` per GPU does; a machine without GPUs is refused rather
    than offered pretend ones. Its servers monitor themselves less often than Dask's defaults
    (`quiet_monitoring`). A study started by a script's top-level code outside
    ``if __name__ == "__main__":`` is refused before anything starts (`dagtune.mainguard`)."""
    import dask
    from distributed import LocalCluster, Nanny, Scheduler, SpecCluster

    # its workers import the main script again: a study it starts unguarded would start again there
    check_main_guard(dask.config.get("distributed.worker.multiprocessing-method", "spawn"))
    gpus = (resources or {}).get("GPU")
    if gpus is None:
        security = embedded_security(security)
        count = workers or os.cpu_count() or 1
        with glibc_thresholds(), quiet_monitoring():
            cluster = LocalCluster(
                n_workers=0,  # `_start_workers` starts them
                threads_per_worker=1,
                processes=True,
                host="127.0.0.1",
                protocol=protocol_of(security),
                dashboard_address="127.0.0.1:0",
                resources=resources,
                security=security,
                silence_logs=logging.ERROR,
                preload=[QUIET_WORKERS],
            )
            return _start_workers(cluster, count)
    devices = visible_gpus()
    per_worker = max(1, math.ceil(gpus))
    groups = [devices[i : i + per_worker] for i in range(0, len(devices) - per_worker + 1, per_worker)]
    if not groups:
        raise ValueError(
            f"resources={resources!r}: this machine has {len(devices)} visible GPU(s) "
            f"(CUDA_VISIBLE_DEVICES / torch.cuda), so the embedded cluster can't offer {gpus} per stage; "
            "drop `resources` to train on CPU, or pass client= of a cluster whose workers offer GPUs"
        )
    if workers is not None and workers > len(groups):
        raise ValueError(
            f"workers={workers}: the embedded cluster has {len(devices)} visible GPU(s), enough for "
            f"{len(groups)} worker(s) of {per_worker} GPU(s) each"
        )
    groups = groups[: workers or len(groups)]
    offered = {**resources, "GPU": per_worker}
    security = embedded_security(security)
    secured = {"security": security, "protocol": protocol_of(security)}
    specs = {
        f"gpu-{'-'.join(group)}": {
            "cls": Nanny,
            "options": {
                "nthreads": max(1, math.floor(per_worker / gpus)),  # fractions of a GPU share it
                "host": "127.0.0.1",
                **secured,
                "resources": offered,
                "env": {"CUDA_VISIBLE_DEVICES": ",".join(group)},
                "silence_logs": logging.ERROR,
                "preload": [QUIET_WORKERS],
            },
        }
        for group in groups
    }
    scheduler = {
        "cls": Scheduler,
        "options": {"host": "127.0.0.1", "dashboard_address": "127.0.0.1:0", **secured},
    }
    with glibc_thresholds(), quiet_monitoring():
        cluster = SpecCluster(workers={}, scheduler=scheduler, security=security, silence_logs=logging.ERROR)
        cluster.worker_spec.update(specs)  # `_start_workers` starts them
        return _start_workers(cluster, len(specs))


#: how long the embedded cluster may take to close before its workers are killed
CLOSE_SECONDS = 20.0


def close_embedded(client: Any, cluster: Any, seconds: float | None = None) -> None:
    """Close `client` and the embedded `cluster`, never raising: the study's work is saved
    by then, and a cluster that fails to stop (distributed's nanny gives up on a worker
    that does not exit in time, more often under load or after a worker was killed) must
    not cost the caller its results. What does not close within about `seconds` (default
    `CLOSE_SECONDS`) is killed (the worker processes, SIGKILL) and logged. distributed's own
    errors while it closes (a hung worker it can't reach) are not shown: this function
    reports what happened."""
    from distributed.core import Status

    seconds = CLOSE_SECONDS if seconds is None else seconds
    pids = {nanny.pid for nanny in list(cluster.workers.values()) if getattr(nanny, "pid", None)}
    with _distributed_quiet():
        try:
            client.close(timeout=seconds)
        except Exception:
            log.debug("dagtune: closing the embedded cluster's client failed", exc_info=True)
        try:
            cluster.close(timeout=seconds)
            return
        except Exception as error:
            problem = f"{type(error).__name__}: {error}".rstrip(": ")
        killed = 0
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
                killed += 1
        log.warning(
            "dagtune: the embedded cluster did not close within %g s (%s); killed %d worker process(es)",
            seconds,
            problem,
            killed,
        )
        with contextlib.suppress(Exception):  # what is left: the scheduler, the nannies
            cluster.close(timeout=min(seconds, 5.0))
        # whatever still hangs is given up for good: distributed's exit hook would try again
        cluster.status = Status.closed
        # but no scheduler is left running in this process: it closes, and the cluster's event
        # loop thread stops (`close` on a closed cluster stops only that thread)
        with contextlib.suppress(Exception):
            cluster.sync(cluster.scheduler.close, callback_timeout=min(seconds, 5.0))
        with contextlib.suppress(Exception):
            cluster.close()


@contextlib.contextmanager
def _distributed_quiet() -> Iterator[None]:
    """distributed logs nothing below CRITICAL while the block runs."""
    logger = logging.getLogger("distributed")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


QUIET_WORKERS = (
    "dagtune.execution._worker_preload"  # the embedded cluster's workers ignore SIGINT and SIGTERM
)

#: how long the embedded cluster's workers may take to start (import torch, connect)
WORKER_START_SECONDS = 300.0
#: the longest SIGINT and SIGTERM are ignored while they are spawned (`_start_workers`)
SPAWN_SECONDS = 30.0


def _start_workers(cluster: Any, count: int) -> Any:
    """Start `count` worker processes in `cluster` (started without any), waiting until they
    run; returns the cluster, or closes it and raises if they don't start in time or the
    wait is interrupted.

    The workers leave Ctrl-C and SIGTERM to the study (`_worker_preload` says why).
    Their preload ignores them only once the worker is built, after seconds of imports, so
    this process ignores them for the instants it takes to spawn the workers (until as many
    new child processes exist, at most `SPAWN_SECONDS`): a process inherits an ignored
    signal from its first instruction. A Ctrl-C at one of those instants is lost; while
    the workers then start, it interrupts this wait and the cluster is closed."""
    try:
        with _interrupts_ignored():
            before = _children()
            cluster.scale(count)
            deadline = time.monotonic() + SPAWN_SECONDS
            while (
                len(_children() - before) < count
                and len(cluster.scheduler_info.get("workers", {})) < count
                and time.monotonic() < deadline
            ):
                time.sleep(0.01)
        _wait_for_workers(cluster, count, WORKER_START_SECONDS)
    except BaseException:
        with contextlib.suppress(Exception):
            cluster.close(timeout=10)
        raise
    return cluster


def _wait_for_workers(cluster: Any, count: int, timeout: float) -> None:
    """Wait until `count` workers of `cluster` run; a RuntimeError as soon as one of them
    failed to start (its process printed why), a TimeoutError after `timeout` seconds.
    (Dask's `wait_for_workers` would wait out the timeout for a worker that already died:
    `scale` starts them in the background, where a failure is only logged.)"""
    from distributed.core import Status  # loads distributed: the embedded cluster only

    ended = (Status.failed, Status.closing, Status.closed)
    deadline = time.monotonic() + timeout
    while len(cluster.scheduler_info.get("workers", {})) < count:
        failed = sorted(str(name) for name, worker in cluster.workers.items() if worker.status in ended)
        if failed:
            raise RuntimeError(
                f"worker(s) {', '.join(failed)} of the embedded Dask cluster failed to start; "
                "what each printed is above"
            )
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"the embedded Dask cluster's {count} worker(s) did not start within {timeout:.0f} s"
            )
        time.sleep(0.05)


def _children() -> set[int]:
    """The pids of this process's children (nannies start their workers as such)."""
    import psutil

    return {child.pid for child in psutil.Process().children()}


@contextlib.contextmanager
def _interrupts_ignored() -> Iterator[None]:
    """SIGINT and SIGTERM are ignored while the block runs (in the main thread only: nowhere
    else can a signal handler be set, and nothing changes then)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {number: signal.signal(number, signal.SIG_IGN) for number in LEFT_TO_THE_STUDY}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, signal.SIG_DFL if handler is None else handler)
