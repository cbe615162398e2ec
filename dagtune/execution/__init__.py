"""Execution: where path tasks run, behind one interface the coordinator cannot tell apart.

`Executor` (`_interface`) is everything the coordinator and the study read from a place that
runs path tasks: its slots, launches (one task, or a fused group on one slot), directives to
running tasks, the events polled back, its clock, whether that clock is virtual, and the
checkpoint store its tasks write. Two implement it:

- `SimulatedExecutor` (`_simulated`): the real runner on virtual workers in virtual time,
  with `MemoryStore`, an in-process checkpoint store;
- `DaskExecutor`, with everything it runs on: the embedded cluster, SLURM GPU workers,
  adaptive scaling on a study's demand, the one thread that publishes what a study shows on
  its scheduler, the checkpoint store on the workers, what a Dask task runs on its worker.
  All of it loads distributed, so it is its own face, `dagtune.execution.dask`, imported
  only where a study runs on Dask (`import dagtune` loads no Dask).

Who may connect to an embedded cluster (TLS, `_security`) is here too: it loads nothing
until a cluster starts, and the command line reads certificate files with it.

Users reach the same things by the paths they always had: `dagtune.sim`, `dagtune.cluster`
and `dagtune.security` hand them on (docs/architecture.md says why).
"""

from dagtune.execution._interface import Executor
from dagtune.execution._security import embedded_security, protocol_of, tls_from_files
from dagtune.execution._simulated import MemoryStore, SimulatedExecutor

__all__ = [
    "Executor",
    "MemoryStore",
    "SimulatedExecutor",
    "embedded_security",
    "protocol_of",
    "tls_from_files",
]
