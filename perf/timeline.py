"""Where a real dagtune run spends its time: per-stage timings from events and worker timers.

`TimedStudy` is a `dagtune.Study` that keeps every event the coordinator handles (with its
arrival time) and times the coordinator's own work (handling events, re-planning and
scheduling, journaling). `install_worker_timers`, run on every Dask worker with
``client.run``, wraps the calls a stage makes besides ``Trainer.train``: building the trainer,
loading and saving checkpoints (``torch.save``/``torch.load``, SHA-256, fsync), ``evaluate``,
the directive read after every step and the events sent back. The timers cost a
``perf_counter`` call each, nothing measurable next to a training step.

`account` turns both into one account of the worker-seconds of a run (workers x wall time):
training, evaluation, checkpoint saves and loads, trainer construction, per-step messaging,
the rest of a running stage (the members of a fused task share one span of their worker), and
the idle time between stages (dispatch latency: the end event's trip to the coordinator,
re-planning, submission, Dask's scheduling and the next stage's start), plus the idle time at
the end when fewer stages than workers remain.
"""

from __future__ import annotations

import cProfile
import functools
import itertools
import pstats
import sys
import threading
import time
from collections import defaultdict
from typing import Any

import dagtune as dt
from dagtune.events import (
    CheckpointSaved,
    StateLoaded,
    StepDone,
    TaskEnded,
    TaskEvent,
    TaskFailed,
    TaskStarted,
)

_TIMES: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])  # name -> [calls, seconds]
_LOCK = threading.Lock()
_INSTALLED: set[str] = set()


def _timed(name: str, function):
    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        began = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            seconds = time.perf_counter() - began
            with _LOCK:
                entry = _TIMES[name]
                entry[0] += 1
                entry[1] += seconds

    wrapper.__wrapped_by_perf__ = True
    return wrapper


def _patch(owner: Any, attribute: str, name: str) -> None:
    key = f"{getattr(owner, '__module__', owner)}.{getattr(owner, '__qualname__', owner)}.{attribute}"
    if key in _INSTALLED:
        return
    _INSTALLED.add(key)
    setattr(owner, attribute, _timed(name, getattr(owner, attribute)))


def install_worker_timers(trainer_cls: type) -> bool:
    """Wrap the worker-side calls of a stage with timers (idempotent); run with client.run."""
    import distributed
    from distributed import Worker

    import dagtune.runner  # loaded, so that its build_trainer is found below
    import dagtune.trainer
    from dagtune.checkpoints import CheckpointStore

    _patch(CheckpointStore, "save", "checkpoint save")
    _patch(CheckpointStore, "load", "checkpoint load")
    build_trainer = dagtune.trainer.build_trainer  # timed where the runners imported it
    for name, module in list(sys.modules.items()):  # the runners, fused and unfused
        if (
            name.startswith("dagtune.")
            and name != "dagtune.trainer"
            and module.__dict__.get("build_trainer") is build_trainer
        ):
            _patch(module, "build_trainer", "build trainer")
    _patch(trainer_cls, "evaluate", "evaluate")
    _patch(trainer_cls, "load_state_dict", "load_state_dict")
    _patch(distributed.Variable, "get", "directive read")
    _patch(Worker, "log_event", "event sends")
    return True


def worker_times() -> dict[str, list[float]]:
    """The timers of this worker, then reset (run with client.run)."""
    with _LOCK:
        times = {name: list(entry) for name, entry in _TIMES.items()}
        _TIMES.clear()
    return times


class TimedStudy(dt.Study):
    """A Study that records the events it handles and times its coordinator; with
    ``profile=True`` the driver thread also runs under cProfile."""

    def __init__(self, *args: Any, profile: bool = False, **kwargs: Any):
        self.events: list[tuple[float, TaskEvent]] = []
        self.coordinator_seconds: dict[str, float] = defaultdict(float)
        self.profiler = cProfile.Profile() if profile else None
        self._profiled = threading.Event()
        super().__init__(*args, **kwargs)
        coordinator = self.coordinator
        handle, schedule, tick = coordinator.handle, coordinator.schedule, self._loop.periodic

        def timed_handle(event: dict) -> None:
            began = time.perf_counter()
            self.events.append((time.time(), event))
            handle(event)
            self.coordinator_seconds["handle events"] += time.perf_counter() - began

        def timed_schedule() -> None:
            began = time.perf_counter()
            schedule()
            self.coordinator_seconds["re-plan and schedule"] += time.perf_counter() - began

        def timed_tick(force: bool = False) -> None:
            began = time.perf_counter()
            tick(force)
            self.coordinator_seconds["journal and results"] += time.perf_counter() - began

        coordinator.handle, coordinator.schedule, self._loop.periodic = (
            timed_handle,
            timed_schedule,
            timed_tick,
        )
        if self.profiler is not None:  # the driver thread's turns (its waits for events excluded)
            self._loop.turn = self._profiled_turn(self._loop.turn)
        if getattr(self, "client", None) is not None:
            self.client.run(install_worker_timers, self.trainer)
            self.client.run(worker_times)  # start from zero

    def _profiled_turn(self, turn: Any) -> Any:
        """The loop's `turn`, run under cProfile (in the driver thread, where it turns)."""

        def profiled(events: Any = None) -> int:
            self.profiler.enable()
            try:
                return turn(events)
            finally:
                self.profiler.disable()
                self._profiled.set()

        return profiled

    def worker_times(self) -> dict[str, list[float]]:
        """Every worker's timers, summed."""
        total: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
        for times in self.client.run(worker_times).values():
            for name, (calls, seconds) in times.items():
                total[name][0] += calls
                total[name][1] += seconds
        return dict(total)

    def profile_top(self, n: int = 12) -> list[dict[str, Any]]:
        """The coordinator thread's functions with the most own time (waiting for events
        excluded), from cProfile; call after the study is closed (the driver has stopped)."""
        if self.profiler is None or not self._profiled.wait(10):
            return []
        stats = pstats.Stats(self.profiler)
        rows = []
        for (filename, line, function), (_, calls, own, cumulative, _) in stats.stats.items():
            if function in ("wait", "get", "acquire", "<method 'acquire' of '_thread.lock' objects>"):
                continue
            if "acquire" in function and "lock" in function:
                continue
            where = f"{filename.rsplit('/', 1)[-1]}:{line}" if filename != "~" else "builtin"
            rows.append(
                {
                    "function": f"{where}({function})",
                    "calls": calls,
                    "own_s": own,
                    "cumulative_s": cumulative,
                }
            )
        rows.sort(key=lambda r: -r["own_s"])
        return rows[:n]


def _union(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """`spans` merged where they overlap, in order: the members of a fused task run at once in
    one worker slot, so the worker is busy for the union of their spans, not their sum."""
    merged: list[tuple[float, float]] = []
    for begin, stop in sorted(spans):
        if merged and begin <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], stop))
        else:
            merged.append((begin, stop))
    return merged


def account(study: TimedStudy, wall: float, began: float, workers: int) -> dict[str, Any]:
    """Worker-seconds of a run (workers x `wall` from time.time() `began`), by activity."""
    starts: dict[str, TaskStarted] = {}
    ends: dict[str, TaskEnded | TaskFailed] = {}
    train = 0.0
    steps = checkpoints = 0
    loads = {"memory": 0, "storage": 0}
    seen: set[tuple] = set()
    for _, event in study.events:
        key = (event.task, event.attempt, event.kind, event.step, event.node)
        if key in seen:  # events arrive twice: streamed, then repeated in the task's result
            continue
        seen.add(key)
        if isinstance(event, TaskStarted):
            starts.setdefault(event.task, event)
        elif isinstance(event, TaskEnded | TaskFailed):
            ends.setdefault(event.task, event)
        elif isinstance(event, StepDone):
            train += event.seconds
            steps += 1
        elif isinstance(event, CheckpointSaved):
            checkpoints += 1
        elif isinstance(event, StateLoaded):
            loads[event.origin] += 1
    per_worker: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for key, start in starts.items():
        end = ends.get(key)
        if end is not None and end.time is not None:
            per_worker[start.worker].append((start.time, end.time))
    busy = {worker: _union(spans) for worker, spans in per_worker.items()}
    in_stage = sum(stop - begin for spans in busy.values() for begin, stop in spans)
    gaps, tail = [], 0.0
    finish = began + wall
    for spans in busy.values():
        gaps += [nxt[0] - prev[1] for prev, nxt in itertools.pairwise(spans)]
        tail += max(0.0, finish - spans[-1][1])
    tail += (workers - len(per_worker)) * wall
    times = study.worker_times() if getattr(study, "client", None) is not None else {}
    seconds = {name: entry[1] for name, entry in times.items()}
    # a stage's start event is sent once its trainer is built or loaded: building and loading
    # happen before the span [start, end] of a stage, everything else inside it
    inside = [
        ("training (Trainer.train)", train),
        ("evaluation (Trainer.evaluate)", seconds.get("evaluate", 0.0)),
        ("checkpoint saves (torch.save, SHA-256, fsync)", seconds.get("checkpoint save", 0.0)),
        ("directive read after each step (scheduler round trip)", seconds.get("directive read", 0.0)),
        ("sending events (log_event)", seconds.get("event sends", 0.0)),
    ]
    before = [
        ("building trainers (first one per worker: imports, data)", seconds.get("build trainer", 0.0)),
        (
            "checkpoint loads (torch.load, checks, load_state_dict)",
            seconds.get("checkpoint load", 0.0) + seconds.get("load_state_dict", 0.0),
        ),
    ]
    total = workers * wall
    worker_rows = [
        *inside,
        (
            "rest of a running stage (runner, setup, RNG capture)",
            max(0.0, in_stage - sum(s for _, s in inside)),
        ),
        *before,
        (
            "between stages: dispatch (end event to coordinator, re-plan, submit, Dask) and worker start",
            max(0.0, total - in_stage - tail - sum(s for _, s in before)),
        ),
        ("idle at the end (fewer stages than workers, last events)", tail),
    ]
    return {
        "worker_seconds": total,
        "rows": [
            {"activity": name, "seconds": s, "share": s / total if total else 0.0} for name, s in worker_rows
        ],
        "stages": len(starts),
        "steps": steps,
        "checkpoints": checkpoints,
        "loads": loads,
        "mean_gap_ms": 1000 * sum(gaps) / len(gaps) if gaps else float("nan"),
        "median_gap_ms": 1000 * sorted(gaps)[len(gaps) // 2] if gaps else float("nan"),
        "train_seconds_per_step": train / steps if steps else float("nan"),
        "coordinator_seconds": dict(study.coordinator_seconds),
        "calls": {name: int(entry[0]) for name, entry in times.items()},
    }


def account_table(runs: list[tuple[str, list[dict[str, Any]], float]], workers: int) -> str:
    """A markdown table of the accounts of several runs, one column each: `runs` are (label,
    the rows of `account` or any rows of activity, seconds and share, the run's wall time)."""
    from perf.table import table

    activities: list[str] = []
    for _, rows, _ in runs:
        for entry in rows:
            if entry["activity"] not in activities:
                activities.append(entry["activity"])
    lines = []
    for activity in activities:
        line = {"activity": activity}
        for label, rows, _ in runs:
            found = next((e for e in rows if e["activity"] == activity), None)
            line[label] = "" if found is None else f"{found['seconds']:.1f} ({100 * found['share']:.0f}%)"
        lines.append(line)
    lines.append(
        {"activity": "**workers x wall time**", **{label: f"{workers * wall:.1f}" for label, _, wall in runs}}
    )
    return table(lines, [("activity", "activity")] + [(label, label + " (s)") for label, _, _ in runs])
