"""Progress of a running study: a bar in a terminal, log lines elsewhere, HTML in Jupyter.

`watch(study, ...)` is a context manager around long work (``study.run``): a daemon
thread reads the study's state every `interval` seconds (under the study's lock, which the
waiting caller releases) and shows trials finished, steps trained against steps reuse
saved (both counted from when the watch began: a resumed study's trials reached their
steps in an earlier session, whose training this one did not do), and the best metric so
far. Where it shows them:

- ``"terminal"``: a rich progress bar when the stream is a terminal, else plain log lines,
  so CI logs stay short: one when a trial finishes (at most every `log_seconds`), and a
  heartbeat at most every `heartbeat_seconds` while steps are trained but no trial finishes;
- ``"notebook"``: a live HTML view in Jupyter (`dagtune.notebook.LiveView`), nothing
  outside Jupyter;
- ``"auto"``: the notebook view in Jupyter, else the terminal forms;
- ``"interactive"``: the notebook view in Jupyter, the bar when the stream is a terminal,
  nothing otherwise (what `Study.run` shows by itself: a plain script run in a terminal gets
  a progress line, its output redirected to a file or a CI log gets none).

Watches don't nest: inside a block already watching a study (``dagtune run`` around
``Study.run``, which watches for notebooks itself), another watch of it shows nothing.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import IO, Any

from dagtune.records import FAILED, PENDING
from dagtune.summary import best_note, best_of, metric_of

__all__ = ["SHOWS", "ProgressState", "in_notebook", "read_state", "watch", "work"]

#: where `watch` shows progress (the module docstring says what each means)
SHOWS = ("auto", "terminal", "notebook", "interactive")

_watched: set[int] = set()  # ids of the studies being watched
_watched_lock = threading.Lock()


@dataclass(frozen=True)
class ProgressState:
    """What progress displays show."""

    study: str
    trials: int
    finished: int
    trained: int  # executed steps, since the watch began
    trial_steps: int  # steps the trials reached, since the watch began
    best: float | None
    metric: str | None
    elapsed: float
    failed: int = 0
    best_note: str = ""  # where the best value comes from ("trial 4, at step 18, running")

    @property
    def saved(self) -> int:
        """Steps a trial-based system would have trained on top of what was trained: the
        steps the trials reached, less those trained (none when steps were trained again)."""
        return max(0, self.trial_steps - self.trained)

    def best_text(self) -> str:
        """``best val_acc 0.9312 (trial 4, at step 18, running)``, or "" without a result."""
        if self.best is None:
            return ""
        return f"best {self.metric} {self.best:.4g}" + (f" ({self.best_note})" if self.best_note else "")

    def line(self) -> str:
        best = f", {self.best_text()}" if self.best is not None else ""
        failed = f" ({self.failed} failed)" if self.failed else ""
        return (
            f"dagtune {self.study}: {self.finished}/{self.trials} trials finished{failed}, "
            f"{self.trained} steps trained, {self.saved} saved by reuse{best}, {self.elapsed:.0f} s"
        )


def read_state(
    study: Any, metric: str | None, mode: str, started: float, before: tuple[int, int] = (0, 0)
) -> ProgressState:
    """The study's progress now (taken under its lock). `before` is its `work` when the
    watch began: the steps trained and the trial steps count from there, so that a resumed
    study's trials, which reached their steps in an earlier session, count no step of that
    session as saved by reuse in this one."""
    view = study.view()
    trials, report = view.trials, view.report
    if metric is None:
        metric, mode = metric_of(trials)
    best = best_of(trials, metric, mode)
    link = view.link  # half of a surrogate study: say which half
    return ProgressState(
        study=view.name if link is None else f"{view.name} ({link.role})",
        trials=len(trials),
        finished=sum(1 for t in trials if t.status != PENDING),
        trained=report["executed_steps"] - before[1],
        trial_steps=report["trial_steps"] - before[0],
        best=None if best is None else float(best.metrics[metric]),
        metric=metric,
        elapsed=time.monotonic() - started,
        failed=sum(1 for t in trials if t.status == FAILED),
        best_note="" if best is None else best_note(best),
    )


def work(study: Any) -> tuple[int, int]:
    """The study's trial steps (Σ of the steps its trials reached, restored trials' too) and
    the steps its session has trained, now."""
    report = study.view().report
    return report["trial_steps"], report["executed_steps"]


def in_notebook() -> bool:
    """True inside a Jupyter kernel."""
    shell = sys.modules.get("IPython") and sys.modules["IPython"].get_ipython()
    return type(shell).__name__ == "ZMQInteractiveShell"


class _Lines:
    """Plain log lines: one when the finished trial count changed, at most every `every` s,
    and a heartbeat when steps were trained since the last line, at most every `heartbeat`
    s (long trials). `clock` is injectable for tests."""

    def __init__(
        self,
        stream: IO[str],
        every: float,
        heartbeat: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.stream, self.every, self.heartbeat, self.clock = stream, every, heartbeat, clock
        self._at, self._finished, self._trained = -float("inf"), -1, -1

    def show(self, state: ProgressState, final: bool = False) -> None:
        now = self.clock()
        since = now - self._at
        finished = state.finished != self._finished and since >= self.every
        moved = state.trained != self._trained and since >= self.heartbeat
        if final or finished or moved:
            print(state.line(), file=self.stream, flush=True)
            self._at, self._finished, self._trained = now, state.finished, state.trained

    def close(self) -> None:
        """Nothing to release."""


class _Bar:
    """A rich progress bar over trials, with steps and the best metric beside it."""

    def __init__(self, stream: IO[str], console: Any = None):
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("trials · {task.fields[steps]} · {task.fields[best]}"),
            TimeElapsedColumn(),
            console=console if console is not None else Console(file=stream),
            transient=False,
        )
        self.task = self.progress.add_task("dagtune", total=None, steps="", best="")
        self.progress.start()

    def show(self, state: ProgressState, final: bool = False) -> None:
        best = state.best_text() or "no result yet"
        if state.failed:
            best += f" · [red]{state.failed} failed[/]"
        self.progress.update(
            self.task,
            description=state.study,
            completed=state.finished,
            total=max(state.trials, 1),
            steps=f"{state.trained} steps trained, {state.saved} saved by reuse",
            best=best,
        )

    def close(self) -> None:
        self.progress.stop()


def _display(study: Any, show: str, stream: IO[str], log_seconds: float, heartbeat_seconds: float):
    if show not in SHOWS:
        raise ValueError(f"show must be one of {', '.join(map(repr, SHOWS))}, got {show!r}")
    if show in ("auto", "notebook", "interactive") and in_notebook():
        from dagtune.notebook import LiveView  # loads bokeh and distributed: in Jupyter only

        return LiveView(study)
    if show == "notebook":
        return None
    if _is_terminal(stream):
        return _Bar(stream)
    return None if show == "interactive" else _Lines(stream, log_seconds, heartbeat_seconds)


def _is_terminal(stream: IO[str]) -> bool:
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty()) if isatty is not None else False
    except ValueError:  # a closed stream
        return False


@contextlib.contextmanager
def watch(
    study: Any,
    metric: str | None = None,
    mode: str = "max",
    *,
    show: str = "auto",
    stream: IO[str] | None = None,
    interval: float = 0.5,
    log_seconds: float = 10.0,
    heartbeat_seconds: float = 30.0,
) -> Iterator[None]:
    """Show the study's progress while the block runs (see the module docstring)."""
    with _watched_lock:
        nested = id(study) in _watched
        _watched.add(id(study))
    if nested:
        yield
        return
    try:
        display = _display(study, show, stream or sys.stderr, log_seconds, heartbeat_seconds)
        with _showing(study, metric, mode, display, interval):
            yield
    finally:
        with _watched_lock:
            _watched.discard(id(study))


@contextlib.contextmanager
def _showing(study: Any, metric: str | None, mode: str, display: Any, interval: float) -> Iterator[None]:
    """Refresh `display` (if any) from a daemon thread while the block runs."""
    if display is None:
        yield
        return
    started = time.monotonic()
    before = work(study)
    done = threading.Event()

    def loop() -> None:
        while not done.wait(interval):
            display.show(read_state(study, metric, mode, started, before))

    thread = threading.Thread(target=loop, name=f"dagtune-progress-{study.name}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join(timeout=5)
        display.show(read_state(study, metric, mode, started, before), final=True)
        display.close()
