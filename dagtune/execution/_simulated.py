"""The simulated executor: the real coordinator and runner, in virtual time.

`SimulatedExecutor` runs path tasks on `workers` virtual workers. Every step is really
executed by `PathRunner` (so checkpoints, live trainers, directives and events behave as on
a cluster) but its duration is virtual, given by a cost profile, so a study of 448 trials
of 120 epochs on 40 GPUs finishes in seconds. `dagtune.sim.SyntheticTrainer` is a cheap
trainer to run it with.

A fused group (`launch_group`) is driven through `dagtune.fusion.FusedPathRunner` on one
virtual worker, one round at a time. Its cost is a simple model: a round costs the costliest
member's step times ``1 + fused_member_seconds * (K - 1)`` for the K members training in it
(with the default 0.1, 32 fused members cost 4.1 steps, 7.8x less than 32 steps: about what
`perf/RESULTS.md` §7 measures for a tiny MLP on a CPU; a model that gains nothing: 1.0), and each member's
``step`` event carries its share of the round.
"""

from __future__ import annotations

import contextlib
import copy
import heapq
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from dagtune.config import config_values
from dagtune.evalcheck import EvaluateChecks
from dagtune.events import CheckpointCorrupt, TaskEnded, TaskEvent, TaskFailed
from dagtune.execution._interface import Executor
from dagtune.fusion import FusedPathRunner
from dagtune.records import CheckpointInfo
from dagtune.resumecheck import ResumeChecks
from dagtune.runner import LiveTrainers, PathRunner
from dagtune.tasks import Directive, PathTask

__all__ = ["MemoryStore", "SimulatedExecutor"]

StepCost = Callable[[dict[str, Any]], float]


class MemoryStore:
    """An in-process checkpoint store for simulations: no bytes, deep copies only."""

    def __init__(self, nbytes: int = 1_000_000):
        self.nbytes = nbytes
        self._states: dict[tuple[str, str, int], dict] = {}
        self.saves = 0
        self.loads = 0

    def save(self, identity: str, node: str, step: int, state: dict) -> CheckpointInfo:
        key = (identity, node, step)
        if key not in self._states:  # write-once: a second writer yields to the first
            self._states[key] = copy.deepcopy(state)
            self.saves += 1
        return CheckpointInfo(self.nbytes, "")

    def load(self, identity: str, node: str, step: int) -> dict:
        self.loads += 1
        return copy.deepcopy(self._states[(identity, node, step)])

    def info(self, identity: str, node: str, step: int) -> CheckpointInfo | None:
        return CheckpointInfo(self.nbytes, "") if (identity, node, step) in self._states else None

    def delete(self, identity: str, node: str, step: int) -> None:
        self._states.pop((identity, node, step), None)

    def points(self, identity: str):
        for (ident, node, step), _ in sorted(self._states.items()):
            if ident == identity:
                yield node, step, CheckpointInfo(self.nbytes, "")


@dataclass
class _Slot:
    runner: PathRunner | FusedPathRunner
    steps: Any  # the runner's generator
    worker: int
    launched: float
    keys: set[str]  # the tasks whose end is still to come
    charged: list[float]  # [virtual seconds of the step (the fused round) in flight]: its runner's
    rng: Any = None  # the global generators' states where its last step left them


class SimulatedExecutor(Executor):
    """`workers` virtual workers; a step lasts ``step_seconds(values)`` virtual seconds, a
    checkpoint save `save_seconds`, a load from storage `load_seconds`, and every task
    `launch_seconds` of dispatch overhead; a fused round costs as the module docstring says."""

    virtual = True

    def __init__(
        self,
        workers: int,
        step_seconds: float | StepCost = 1.0,
        *,
        save_seconds: float = 0.0,
        load_seconds: float = 0.0,
        launch_seconds: float = 0.0,
        fused_member_seconds: float = 0.1,
        store: MemoryStore | None = None,
    ):
        if workers <= 0:
            raise ValueError(f"workers must be positive, got {workers!r}")
        self.workers = workers
        self.step_cost: StepCost = step_seconds if callable(step_seconds) else (lambda _v, s=step_seconds: s)
        self.save_seconds = save_seconds
        self.load_seconds = load_seconds
        self.launch_seconds = launch_seconds
        if not 0 <= fused_member_seconds <= 1:
            raise ValueError(f"fused_member_seconds must be in [0, 1], got {fused_member_seconds!r}")
        self.fused_member_seconds = fused_member_seconds
        self.store = store if store is not None else MemoryStore()
        self._clock = 0.0
        self._heap: list[tuple[float, int, str]] = []
        self._sequence = 0
        self._slots: dict[str, _Slot] = {}
        self._slot_of: dict[str, str] = {}  # task key -> its slot's key (a fused group's first)
        self._free = list(range(workers))
        self._live = [LiveTrainers() for _ in range(workers)]
        self._checks = [EvaluateChecks() for _ in range(workers)]
        self._resume_checks = [ResumeChecks() for _ in range(workers)]
        self._pending: list[TaskEvent] = []

    def slots(self) -> int:
        return self.workers

    def now(self) -> float:
        return self._clock

    def _worker(self, key: str, prefer: str | None) -> int:
        if not self._free:
            raise RuntimeError(f"no free virtual worker for {key}: the coordinator over-launched")
        preferred = int(prefer.removeprefix("sim-")) if prefer else None
        worker = preferred if preferred in self._free else self._free[0]
        self._free.remove(worker)
        return worker

    def launch(self, task: PathTask, priority: float = 0.0, prefer: str | None = None) -> None:
        self._start([task], PathRunner, prefer)

    def launch_group(self, tasks: list[PathTask], priority: float = 0.0, prefer: str | None = None) -> None:
        self._start(tasks, FusedPathRunner, prefer)

    def _start(self, tasks: list[PathTask], runner_type: type, prefer: str | None) -> None:
        """Occupy a worker with `tasks` under the first one's key: one task by a `PathRunner`,
        a fused group by a `FusedPathRunner`; charged the launch and each load from storage."""
        key = tasks[0].key
        worker = self._worker(key, prefer)
        live = self._live[worker]
        charged: list[float] = []  # the step in flight's virtual seconds (set by `_queue`)
        runner = runner_type(
            tasks[0] if runner_type is PathRunner else tasks,
            self.store,
            live,
            worker=f"sim-{worker}",
            clock=self.now,  # virtual: a task's `checkpoint_interval` counts virtual seconds
            wallclock=self.now,
            checks=self._checks[worker],
            resume_checks=self._resume_checks[worker],
            step_seconds=lambda: charged[0],
            started=self._clock,
        )
        keys = {task.key for task in tasks}
        slot = _Slot(runner, runner.steps(), worker, launched=self._clock, keys=keys, charged=charged)
        self._slots[key] = slot
        self._slot_of.update(dict.fromkeys(keys, key))
        loads = sum(
            task.source is not None and not live.holds(task.trainer.identity, *task.source) for task in tasks
        )
        self._queue(key, slot, self.launch_seconds + loads * self.load_seconds)

    def direct(self, key: str, directive: Directive) -> None:
        slot = self._slots.get(self._slot_of.get(key, key))
        if slot is None:
            return
        self._pending.extend(slot.runner.members[key].update(directive))

    def fused_round_seconds(self, costs: list[float]) -> float:
        """Virtual seconds of a fused round whose members' steps cost `costs` alone."""
        return max(costs) * (1 + self.fused_member_seconds * (len(costs) - 1))

    def _queue(self, key: str, slot: _Slot, overhead: float = 0.0) -> None:
        """Schedule the runner's next step (its next round: a fused group) to complete after
        its virtual cost; the tasks that train in it are decided now (the others are halted:
        what is decided now holds, even if a later directive would continue them), and it is
        charged by `fused_round_seconds` (one task: its step's cost)."""
        runner = slot.runner
        costs = []
        for member_key, member in runner.members.items():
            step = None if member.done else member.next_step()
            if step is None:
                runner.halt(member_key)
                continue
            segment, t = step
            costs.append(self.step_cost(config_values(segment.config, t)))
            if t + 1 in member.task.checkpoints or t + 1 in member.directive.checkpoints:
                overhead += self.save_seconds
        charged = self.fused_round_seconds(costs) if costs else 0.0
        slot.charged[:] = [charged / max(1, len(costs))]  # each training task's share
        self._sequence += 1
        heapq.heappush(self._heap, (self._clock + overhead + charged, self._sequence, key))

    def poll(self, timeout: float | None = None) -> list[TaskEvent]:
        """The events of the next virtual instant at which something happens."""
        if self._pending:
            events, self._pending = self._pending, []
            return events
        while self._heap:
            when, _, key = heapq.heappop(self._heap)
            slot = self._slots.get(key)
            if slot is None:
                continue
            self._clock = when
            return self._advance(key, slot)
        return []

    def _advance(self, key: str, slot: _Slot) -> list[TaskEvent]:
        runner = slot.runner
        try:
            # each virtual worker has the global random generators to itself, as a process does
            with own_rng(slot):
                events = next(slot.steps)
        except Exception as error:  # the trainer's failure becomes an event
            events = runner.error_events(error)
        for event in events:
            if isinstance(event, TaskEnded | TaskFailed | CheckpointCorrupt):
                slot.keys.discard(event.task)
        if not slot.keys:
            del self._slots[key]
            for ended in runner.members:
                del self._slot_of[ended]
            self._free.append(slot.worker)
            self._free.sort()
        else:
            self._queue(key, slot)
        return events


@contextlib.contextmanager
def own_rng(slot: _Slot) -> Iterator[None]:
    """Run a step of `slot` with the global random generators where its previous step left
    them (its first step starts from whatever is there: it seeds or restores them itself),
    and keep where this one leaves them. Virtual workers share this process, and steps of
    different workers interleave."""
    if slot.rng is not None:
        python, numpy, cpu = slot.rng
        random.setstate(python)
        np.random.set_state(numpy)
        torch.set_rng_state(cpu)
    try:
        yield
    finally:
        slot.rng = (random.getstate(), np.random.get_state(), torch.get_rng_state())
