"""Execution on Dask: the Dask executor and everything it runs on (loads distributed).

- `DaskExecutor` (`_dask_executor`): path tasks as just-in-time Dask futures; what such a
  task runs on its worker is in `_dask_tasks`; the checkpoint store reaches the workers
  once, as a plugin (`_worker_store`);
- the clusters (`_clusters`): the embedded cluster a study starts, SLURM GPU workers and
  their nanny preload (`dask_setup`), the allocator settings, Dask's monitoring cadence in
  the embedded cluster (`quiet_monitoring`), `check_resources`; the
  embedded cluster's workers leave Ctrl-C and SIGTERM to the study (`_worker_preload`);
- a study's demand and the adaptive scaling that reads it (`_demand`);
- the one thread that keeps what a study shows on its scheduler up to date, its demand and
  its dashboard snapshot (`Publisher`, `_publisher`).

Import it inside the function that needs it (docs/architecture.md, "Imports inside
functions"): `import dagtune` loads no Dask.
"""

from dagtune.execution._clusters import (
    CLOSE_SECONDS,
    DASK_TRIM,
    NANNY_PRELOAD,
    TRIM,
    check_resources,
    close_embedded,
    dask_setup,
    embedded_cluster,
    glibc_thresholds,
    quiet_monitoring,
    slow_allocator_workers,
    slurm,
)
from dagtune.execution._dask_executor import DaskExecutor
from dagtune.execution._demand import (
    ADAPTIVE,
    DEMAND,
    DemandAdaptive,
    DemandFeed,
    adapts,
    asking_for_a_worker,
    study_demand,
    total_demand,
)
from dagtune.execution._publisher import Feed, Publisher

__all__ = [
    "ADAPTIVE",
    "CLOSE_SECONDS",
    "DASK_TRIM",
    "DEMAND",
    "NANNY_PRELOAD",
    "TRIM",
    "DaskExecutor",
    "DemandAdaptive",
    "DemandFeed",
    "Feed",
    "Publisher",
    "adapts",
    "asking_for_a_worker",
    "check_resources",
    "close_embedded",
    "dask_setup",
    "embedded_cluster",
    "glibc_thresholds",
    "quiet_monitoring",
    "slow_allocator_workers",
    "slurm",
    "study_demand",
    "total_demand",
]
