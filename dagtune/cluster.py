"""Clusters for studies: a SLURM cluster of GPU workers through dask-jobqueue.

`slurm` returns a `dask_jobqueue.SLURMCluster` shaped for dagtune: one Slurm job per
GPU, each running one Dask worker that offers ``GPU=1`` (what a study with
``resources={"GPU": 1}`` asks of every stage) with Slurm pinning ``CUDA_VISIBLE_DEVICES``
through ``--gres=gpu:1``. Workers retire by themselves (``--lifetime``) a little before the
job's walltime, so Slurm never kills one mid-stage without Dask knowing: the stage it ran is
planned again from its last checkpoint. Adaptive scaling (on by default) asks for jobs
while stages queue and gives them back only after a long idle spell, because a GPU job
waits in Slurm's queue far longer than a stage takes to start. Needs ``dask-jobqueue``
(``pip install "dagtune[slurm]"``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

__all__ = ["slurm"]

_WALLTIME = re.compile(r"^(?:(\d+)-)?(\d+):(\d{2}):(\d{2})$")


def _seconds(walltime: str) -> int:
    """Seconds of a Slurm walltime ``[D-]HH:MM:SS``."""
    match = _WALLTIME.match(walltime)
    if match is None:
        raise ValueError(f"walltime must be [D-]HH:MM:SS, got {walltime!r}")
    days, hours, minutes, seconds = (int(g or 0) for g in match.groups())
    return ((days * 24 + hours) * 60 + minutes) * 60 + seconds


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
    job_extra_directives: Sequence[str] = (),
    **kwargs: Any,
):
    """A `SLURMCluster` of GPU workers for dagtune (see the module docstring).

    `cores` and `memory` are per job (one GPU's worker: data loading threads, host memory);
    `gpus=None` asks Slurm for no GPU (CPU-only partitions, tests) while the worker still
    offers ``GPU=1`` to Dask, one stage at a time. `minimum`/`maximum` bound the jobs;
    `idle_minutes` is how long a worker may idle before adaptive scaling releases it.
    Other keyword arguments go to `SLURMCluster` (``python``, ``interface``,
    ``job_script_prologue``, ``local_directory``, ...).

    Use it as ``Study(..., client=Client(cluster), resources={"GPU": 1})``.
    """
    from dask_jobqueue import SLURMCluster

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
        processes=1,
        job_extra_directives=directives,
        worker_extra_args=[
            "--resources",
            "GPU=1",
            "--lifetime",
            f"{lifetime}s",
            "--lifetime-stagger",
            f"{max(1, margin // 2)}s",
        ],
        **kwargs,
    )
    if adapt:
        interval = 30.0
        cluster.adapt(
            minimum_jobs=minimum,
            maximum_jobs=maximum,
            interval=f"{interval:g}s",
            wait_count=max(1, round(idle_minutes * 60 / interval)),
            target_duration="5 minutes",
        )
    elif minimum:
        cluster.scale(jobs=minimum)
    return cluster
