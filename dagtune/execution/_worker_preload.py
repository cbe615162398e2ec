"""The embedded cluster's worker preload: its workers leave Ctrl-C and SIGTERM to the study.

A terminal's Ctrl-C sends SIGINT to every process of its foreground process group, and a
batch system ending a job (or ``kill`` of a process group) sends SIGTERM to all of them;
the embedded cluster's worker processes are in the study's group. Left alone, each would
die of it mid-step, print a traceback of its own (dozens of lines for a few workers), and
its nanny would start a new one while the study is closing. The study's process handles
the signal (`dagtune.Study.run`, ``dagtune run``): it keeps what was trained and closes
the cluster, which stops the workers (and a worker whose study process is gone, even
killed, exits by itself). So the workers ignore both: the embedded cluster starts them
with both ignored (`embedded_cluster`) and this preload
(``preload=["dagtune.execution._worker_preload"]``) ignores them again in every worker process a nanny
starts later, to replace one that died.
"""

from __future__ import annotations

import signal
import threading
from typing import Any

__all__ = ["LEFT_TO_THE_STUDY", "dask_setup"]


#: what the embedded cluster's workers ignore
LEFT_TO_THE_STUDY = (signal.SIGINT, signal.SIGTERM)


def dask_setup(worker: Any) -> None:
    """Ignore SIGINT and SIGTERM in this worker process (a preload runs in its main thread)."""
    if threading.current_thread() is threading.main_thread():
        for number in LEFT_TO_THE_STUDY:
            signal.signal(number, signal.SIG_IGN)
