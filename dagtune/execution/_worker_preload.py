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

The same preload keeps the workers from printing distributed's "Failed to communicate with
scheduler during heartbeat" and its traceback (`SchedulerGone`): the embedded cluster's
scheduler lives in the study's process, so a heartbeat that can't reach it means that
process is closing (after Ctrl-C, say, where the study prints its one line) or gone, which
the study or the terminal already says; the worker exits by itself either way.
"""

from __future__ import annotations

import logging
import signal
import threading
from typing import Any

__all__ = ["LEFT_TO_THE_STUDY", "SchedulerGone", "dask_setup"]


#: what the embedded cluster's workers ignore
LEFT_TO_THE_STUDY = (signal.SIGINT, signal.SIGTERM)


class SchedulerGone(logging.Filter):
    """Drops distributed's record of a heartbeat that could not reach the scheduler (the
    module docstring says why); every other record passes."""

    MESSAGE = "Failed to communicate with scheduler during heartbeat"

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.MESSAGE)


def dask_setup(worker: Any) -> None:
    """Ignore SIGINT and SIGTERM in this worker process (a preload runs in its main thread),
    and drop its records of heartbeats that can't reach the study's scheduler."""
    if threading.current_thread() is threading.main_thread():
        for number in LEFT_TO_THE_STUDY:
            signal.signal(number, signal.SIG_IGN)
    logger = logging.getLogger("distributed.worker")
    if not any(isinstance(existing, SchedulerGone) for existing in logger.filters):
        logger.addFilter(SchedulerGone())
