"""Clusters for studies, by the path users know: SLURM GPU workers (`slurm`), adaptive
scaling on dagtune's demand (`DemandAdaptive`), and the nanny preload of workers started
by hand (``dask worker ... --preload-nanny dagtune.cluster``: `dask_setup`).

They live in `dagtune.execution.dask`, which says what each does; this module hands them on
under the names scripts and job files already use (docs/architecture.md, "Execution: one
package, the paths users know"). Loads distributed.
"""

from dagtune.execution.dask import (
    CLOSE_SECONDS,
    DemandAdaptive,
    close_embedded,
    dask_setup,
    slow_allocator_workers,
    slurm,
    study_demand,
    total_demand,
)

__all__ = [
    "CLOSE_SECONDS",
    "DemandAdaptive",
    "close_embedded",
    "dask_setup",
    "slow_allocator_workers",
    "slurm",
    "study_demand",
    "total_demand",
]
