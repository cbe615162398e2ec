"""`Logging`: a study's loggers fed from the results its trials receive.

It is a trial listener of the study's coordinator: every result delivered to a trial (the
points of a shared prefix trained once for several trials included, so each trial's curve
is whole), and every trial's end, is queued in the coordinator's thread and handed to the
loggers by one thread of its own, so a slow logger (a remote MLflow server) never holds up
scheduling. Nothing runs on a worker.

Resuming: the trials restored from an earlier session are replayed when the study opens
(their known points and ends), and each logger says for every trial the last step it holds
already (`Logger.start`); only later steps are sent, so a resumed study, or one given a
logger it did not have before, completes every trial's record without a point twice.

A logger that raises is reported once (a warning naming it and the error) and left out for
the rest of the session; the study goes on.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from dagtune.loggers._base import Logger, TrialInfo
from dagtune.records import PENDING, Trial

__all__ = ["Logging", "check_loggers"]

log = logging.getLogger("dagtune")

_CALLS = threading.Lock()  # one logger may serve several studies, each with its thread


def check_loggers(loggers: Any) -> list[Logger]:
    """`loggers` as a list of `Logger`; a TypeError naming the item that is not one."""
    if loggers is None:
        return []
    if isinstance(loggers, Logger):
        loggers = [loggers]
    found = list(loggers)
    for i, item in enumerate(found):
        if not isinstance(item, Logger):
            raise TypeError(
                f"loggers[{i}] must be a dagtune logger (dt.loggers.TensorBoard, CSV, MLflow or a "
                f"dt.loggers.Logger), got {item!r}"
            )
    return found


@dataclass
class _Logged:
    """What the loggers hold of one trial, as this session knows it."""

    ended: bool = True  # no step logged since its last end
    sent: int = 0  # points of the trial's curve queued so far (coordinator side)
    seen: bool = False  # `start` queued (coordinator side)
    marks: dict[int, int] = field(default_factory=dict)  # logger index -> last step it holds


class Logging:
    """The loggers of one study, fed from its trials (see the module docstring)."""

    def __init__(self, loggers: list[Logger], study: str, identity: str):
        self.loggers = loggers
        self.study = study
        self._failed: set[int] = set()
        self._trials: dict[int, _Logged] = {}
        self._queue: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._work, name=f"dagtune-loggers-{study}", daemon=True)
        self._closed = False
        for i, logger in enumerate(loggers):
            self._call(i, logger.open, study, identity)
        self._thread.start()

    # ------------------------------------------------------------------ coordinator side

    def replay(self, trials: Iterable[Trial]) -> None:
        """Queue what `trials` (restored from earlier sessions) reported and how they ended."""
        for trial in trials:
            self._send(trial)
            if trial.status != PENDING:
                self._queue.put(("end", trial.id, trial.status, dict(trial.metrics or {}), True))

    def _send(self, trial: Trial) -> None:
        state = self._trials.setdefault(trial.id, _Logged())
        if not state.seen:
            state.seen = True
            self._queue.put(("start", TrialInfo(self.study, trial.id, trial.config, trial.steps)))
        for point in trial.points[state.sent :]:
            self._queue.put(("log", trial.id, point.step - 1, point.as_dict()))
        state.sent = len(trial.points)

    def on_result(self, trial: Trial, step: int, metrics: dict[str, float]) -> None:
        self._send(trial)

    def on_complete(self, trial: Trial) -> None:
        self._ended(trial)

    def on_end(self, trial: Trial) -> None:
        self._ended(trial)  # a diverged trial's last, non-finite point goes too

    def _ended(self, trial: Trial) -> None:
        self._send(trial)
        self._queue.put(("end", trial.id, trial.status, dict(trial.metrics or {}), False))

    def flush(self, timeout: float | None = 60.0) -> None:
        """Wait until everything queued so far reached the loggers and they flushed."""
        if not self._thread.is_alive():
            return
        done = threading.Event()
        self._queue.put(("flush", done))
        if not done.wait(timeout):
            log.warning("dagtune: the loggers of study %r did not catch up within %s s", self.study, timeout)

    def close(self, timeout: float | None = 60.0) -> None:
        """Flush, then close every logger for this study."""
        if self._closed:
            return
        self._closed = True
        self._queue.put(("close", None))
        self._thread.join(timeout)

    # ------------------------------------------------------------------ the loggers' thread

    def _call(self, index: int, method: Any, *args: Any) -> Any:
        if index in self._failed:
            return None
        try:
            with _CALLS:
                return method(*args)
        except Exception as error:
            self._failed.add(index)
            log.warning(
                "dagtune: logger %r failed (%s: %s); it is left out for the rest of this session of study %r",
                self.loggers[index],
                type(error).__name__,
                error,
                self.study,
            )
            return None

    def _work(self) -> None:
        while True:
            kind, *args = self._queue.get()
            if kind == "start":
                (info,) = args
                state = self._trials.setdefault(info.id, _Logged())
                for i, logger in enumerate(self.loggers):
                    mark = self._call(i, logger.start, info)
                    state.marks[i] = mark if isinstance(mark, int) else -1
            elif kind == "log":
                trial, step, metrics = args
                state = self._trials[trial]
                for i, logger in enumerate(self.loggers):
                    if step > state.marks.get(i, -1):
                        self._call(i, logger.log, self.study, trial, step, metrics)
                        state.marks[i] = step
                        state.ended = False
            elif kind == "end":
                trial, status, metrics, restored = args
                state = self._trials[trial]
                if not (restored and state.ended):  # a restored trial whose end is logged already
                    for i, logger in enumerate(self.loggers):
                        self._call(i, logger.end, self.study, trial, status, metrics)
                state.ended = True
            elif kind == "flush":
                for i, logger in enumerate(self.loggers):
                    self._call(i, logger.flush, self.study)
                args[0].set()
            elif kind == "close":
                for i, logger in enumerate(self.loggers):
                    self._call(i, logger.flush, self.study)
                    self._call(i, logger.close, self.study)
                return
