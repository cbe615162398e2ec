"""Which tasks of a scheduling round train together as one fused task (`Study(fuse=...)`).

With fusion on, a round asks the scheduling policy for up to F paths per free slot (all the
ready ones with ``fuse=True``), builds their tasks, and `Fusion.groups` partitions them, in
the policy's order (priority first), into groups of pairwise fusible tasks
(`dagtune.fusion.fusion_groups`: same trainer, same start step, equal non-fusible values over
their common steps) of at most F each, and of no more than an even share of the round's tasks
per free slot (8 tasks on 2 free slots fuse 4 and 4, not 8 on one slot beside an idle one).
Only as many groups as there are free slots launch;
the other stages stay ready for a later round. Every task goes through the fused runner, a
task nothing fuses with as a group of one, so each trial's results are exactly
``run_alone(..., fused=True)``'s whatever its partners.

Before a trainer trains fused, its first fused tasks check it on their worker
(`dagtune.fusion.check_fusion`: a K = 2 probe, and with ``fusion_check`` on, the first
batch fused at K = 1 against unfused and against K = 2) and report a ``fusion`` event; until
one said yes, every fused launch carries the check. A trainer that cannot fuse, or not
exactly (or whose fusion count cannot be measured), trains unfused from then on:
`Fusion.refuse` turns fusion off and warns (`dagtune.FusionWarning`, naming the layer) in
this, the coordinator's process. The sizes of the fused tasks launched are counted for the
report (`sizes`; `dagtune.coordinator.report_figures`).

**Fuller groups**: a group with room for more members is *held* (its stages stay ready,
its slot free) while stages of the same signature (start step, non-fusible values there)
are about to become ready: they start from a point a running task reaches within one step
of the held group's stage (`Upcoming`, from the incremental planner). A group is held at
most that one step's time in all, then launches with whoever is ready; a slot is never
kept idle longer.

F is the study's cap (``fuse=int``; on CUDA also limited by the measured memory, as
`dagtune.fusion.fusion_count` does), or with ``fuse=True`` the count extrapolated from the
peak memory of groups of one and two (Hydro §4.3): the CUDA device's free memory, on a CPU an
even share of the machine's available memory per worker slot. It is measured once per
distinct non-fusible start values (the batch size changes the memory a member needs), in the
coordinator's process: on a cluster whose workers have other devices than the coordinator's
machine, give the count as an int.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import warnings
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import psutil
import torch

from dagtune.config import Config, config_values
from dagtune.coordinator._running import Running
from dagtune.events import FusionChecked
from dagtune.fusion import (
    CpuMemory,
    FusibleTrainer,
    FusionWarning,
    MemoryProbe,
    fusion_count,
    fusion_groups,
)
from dagtune.plan import SearchPlan
from dagtune.planner import IncrementalPlanner
from dagtune.scheduling import CostModel
from dagtune.tasks import PathTask, TrainerSpec
from dagtune.validation import check_int

__all__ = ["Fusion", "Upcoming", "check_fuse", "upcoming_stages"]

log = logging.getLogger("dagtune")


def check_fuse(fuse: Any, trainer: type) -> None:
    """Raise a ValueError naming `fuse` unless it is False, True or a positive int, and, when
    it turns fusion on, unless `trainer` is a `dagtune.FusibleTrainer`."""
    if not isinstance(fuse, bool):
        check_int(
            "fuse",
            fuse,
            minimum=1,
            expected="False, True (a count measured from memory) or a positive int (the most "
            "trials one fused task trains)",
        )
    if fuse is not False and not (isinstance(trainer, type) and issubclass(trainer, FusibleTrainer)):
        name = getattr(trainer, "__qualname__", repr(trainer))
        raise ValueError(f"fuse={fuse!r} needs a dagtune.FusibleTrainer; {name} is not one")


@dataclass(frozen=True)
class Upcoming:
    """A stage about to become ready: it starts at step `start` of `config` once a running
    task delivers its point, estimated `seconds` from now."""

    start: int
    config: Config
    seconds: float


def upcoming_stages(
    planner: IncrementalPlanner | None, running: Mapping[str, Running], cost: CostModel, plan: SearchPlan
) -> list[Upcoming]:
    """The stages about to become ready: those starting from a point a running task will
    deliver (`planner`'s), with the estimated seconds until it does; none without the
    incremental planner (a rebuilt tree)."""
    if planner is None:
        return []
    upcoming = []
    for key, task in running.items():
        for stage in planner.sourced_from(key):
            node, step = stage.source_point
            # the step under way counts as nearly done (when it began is not known)
            seconds = max(0, step - task.progress - 1) * cost.step_seconds(node, plan)
            upcoming.append(Upcoming(stage.start, plan.nodes[stage.node].config, seconds))
    return upcoming


class Fusion:
    """The study's fusion setting for `trainer`: off (`fuse` False), a cap, or measured.

    `slots` tells how many worker slots share the machine's memory (``fuse=True`` on a CPU);
    `probe` replaces the memory measurement (tests); `check` adds the agreement check to the
    probe of the first fused tasks."""

    def __init__(
        self,
        fuse: bool | int,
        trainer: TrainerSpec,
        slots: Callable[[], int],
        probe: MemoryProbe | None = None,
        check: bool = True,
    ):
        check_fuse(fuse, None if fuse is False else trainer.cls)
        if not isinstance(check, bool):
            raise ValueError(f"fusion_check must be True or False, got {check!r}")
        self.asked = self.on = fuse is not False  # `on` turns off if the trainer cannot fuse
        self.cap = None if fuse is True else int(fuse)
        self.trainer = trainer
        self.slots = slots
        self.probe = probe
        self.check = check
        self.verified = False  # a fused task's check said the trainer fuses
        self.refused: str | None = None  # why the trainer trains unfused after all
        self.counts: dict[str, int] = {}  # non-fusible start values -> F
        self.failed: set[tuple[str, int]] = set()  # points where a fused task failed
        self.sizes: Counter[int] = Counter()  # fused tasks launched, by their number of trials
        self.held: dict[str, float] = {}  # signature of a held group -> when it was first held

    # ------------------------------------------------------------------ the check

    def prepare(self, tasks: Sequence[PathTask]) -> list[PathTask]:
        """`tasks` of one fused launch, carrying the check while no verdict said yes; counts
        the launch."""
        self.sizes[len(tasks)] += 1
        if self.verified:
            return list(tasks)
        check = "agreement" if self.check else "probe"
        return [dataclasses.replace(task, fusion_check=check) for task in tasks]

    def verdict(self, event: FusionChecked) -> None:
        """A fused task's `FusionChecked`: the trainer fuses, or trains unfused from now on."""
        if event.ok:
            self.verified = True
        else:
            self.refuse(str(event.reason or "its fused task said it cannot fuse"))

    def refuse(self, reason: str) -> None:
        """Train unfused from now on, warning once why (the running fused tasks end or
        finish as they are)."""
        if self.refused is not None:
            return
        self.on, self.refused = False, reason
        message = f"dagtune: fusion is off for this study, its trials train unfused: {reason}"
        log.warning("%s", message)
        warnings.warn(message, FusionWarning, stacklevel=2)

    def paths_wanted(self, free: int) -> int:
        """How many paths a round with `free` slots asks the policy for."""
        if not self.on:
            return free
        if self.cap is not None:
            return free * self.cap
        return free * max(self.counts.values(), default=1 << 20)  # unmeasured yet: every ready path

    def groups(self, tasks: Sequence[PathTask], free: int) -> list[list[int]]:
        """Indices into `tasks` (given best first), grouped into at most `free` fused tasks,
        best first; off (or turned off while measuring F), each task is a group of its own."""
        for task in tasks:
            if self.on:
                self.size(task)  # measured before grouping: a failure turns fusion off
        if not self.on:
            return [[i] for i in range(min(len(tasks), free))]
        index = {id(task): i for i, task in enumerate(tasks)}
        spread = max(1, math.ceil(len(tasks) / max(free, 1)))  # no slot left idle for a bigger group
        chunks = [[task] for task in tasks if self._alone(task)]
        partnered = [task for task in tasks if not self._alone(task)]
        for group in fusion_groups(partnered, max_size=max(len(partnered), 1)):
            size = min(self.size(group[0]), spread)
            chunks.extend(group[lo : lo + size] for lo in range(0, len(group), size))
        chunks.sort(key=lambda chunk: index[id(chunk[0])])
        return [[index[id(task)] for task in chunk] for chunk in chunks[:free]]

    def hold(
        self,
        group: Sequence[PathTask],
        upcoming: Callable[[], list[Upcoming]],
        now: float,
        step_seconds: Callable[[str], float],
    ) -> bool:
        """Whether `group` (fusible tasks, best first) waits for more members: it has room,
        stages of its signature start from points running tasks reach within one step of
        its first stage (`step_seconds` of a node), and it has not waited that long yet."""
        first = group[0]
        signature = self._signature(first.segments[0].config, first.start)
        bound = step_seconds(first.segments[0].node)
        since = self.held.get(signature, now)
        if (
            len(group) < self.size(first)
            and now - since < bound
            and any(
                soon.start == first.start
                and soon.seconds <= bound
                and self._signature(soon.config, soon.start) == signature
                for soon in upcoming()
            )
        ):
            self.held[signature] = since
            return True
        self.held.pop(signature, None)
        return False

    @property
    def holding(self) -> bool:
        """A group waits: each step of a running task may release it."""
        return bool(self.held)

    def _signature(self, config: Config, step: int) -> str:
        """What tasks starting at `step` of `config` must share to fuse there: the step and
        the non-fusible values."""
        fusible = self.trainer.cls.fusible_names()
        values = config_values(config, step)
        return repr(
            (step, sorted((name, repr(value)) for name, value in values.items() if name not in fusible))
        )

    def isolate(self, point: tuple[str, int]) -> None:
        """A member of a fused task failed training point ``(node, step)``: a trainer's error
        ends every member (nobody can tell whose it was), so a task that trains that point
        again runs alone, as a group of one (still fused: its results stay
        ``run_alone(..., fused=True)``'s), and only the trial at fault fails."""
        self.failed.add(point)

    def _alone(self, task: PathTask) -> bool:
        """Whether `task` trains a point where a fused task failed."""
        return any(
            segment.node == node and segment.start < step <= segment.end
            for node, step in self.failed
            for segment in task.segments
        )

    def size(self, task: PathTask) -> int:
        """F for a group starting where `task` starts (measured once per non-fusible values)."""
        values = config_values(task.segments[0].config, task.start)
        fusible = self.trainer.cls.fusible_names()
        key = repr(sorted((name, value) for name, value in values.items() if name not in fusible))
        if key not in self.counts:
            spec = self.trainer
            try:
                self.counts[key] = fusion_count(
                    spec.cls, spec.kwargs, spec.seed, values, cap=self.cap, probe=self._probe()
                )
            except Exception as error:  # a fused batch fails: the trainer cannot fuse
                self.refuse(f"measuring the fusion count failed: {type(error).__name__}: {error}")
                self.counts[key] = 1
        return self.counts[key]

    def _probe(self) -> MemoryProbe | None:
        """Where F is measured: the given probe; CUDA's (None: `fusion_count` probes CUDA, or
        with a cap and no CUDA takes the cap); else a CPU share of the available memory."""
        if self.probe is not None or torch.cuda.is_available() or self.cap is not None:
            return self.probe
        return CpuMemory(max(1, psutil.virtual_memory().available // max(1, self.slots())))
