"""How many trials to fuse: measured memory, extrapolated linearly (Hydro §4.3).

A fused group's memory grows linearly with its size F (weights, gradients, optimizer state
and activations are per member; the data and the framework's own are not), so Hydro profiles
F = 1 and F = 2 and extrapolates to the device's memory. `profile_fusion` measures the peak
memory of building a group and training it for one batch at F = 1 and F = 2 on a throwaway
trainer (inside `isolated_rng`, so nothing else notices); `FusionProfile.count` gives the
largest F whose predicted peak fits the memory available, capped by the user's cap.

Memory is read through a `MemoryProbe`: `CudaMemory` uses the CUDA caching allocator's
counters (``max_memory_allocated`` above what was allocated before, and ``mem_get_info``'s
free memory plus what the allocator holds unused); its ``cuda`` module is injectable, so the
CUDA arithmetic is tested on CPU with scripted readings. `CpuMemory` has no device to fill:
it measures torch's CPU allocations with the profiler's memory events (every allocation and
free of a tensor, in order; the peak of their running sum), which unlike the process's RSS
does not depend on what the allocator keeps or returns to the OS, and takes the memory
available from a budget the user gives.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from dagtune.fusion._group import FusedGroup
from dagtune.fusion._trainer import FusibleTrainer
from dagtune.trainer import build_trainer, isolated_rng
from dagtune.validation import check_int

__all__ = ["CpuMemory", "CudaMemory", "FusionProfile", "MemoryProbe", "fusion_count", "profile_fusion"]


class MemoryProbe(Protocol):
    """Where a fused group's memory is measured and how much it may use."""

    def peak(self, run: Callable[[], None]) -> int:
        """Peak bytes allocated while `run` runs, above what was allocated before."""

    def available(self) -> int:
        """Bytes a fused group may use."""


class CudaMemory:
    """A CUDA device: peaks from the caching allocator, available memory from the driver.

    `fraction` of the memory available is used (the rest is headroom for fragmentation and
    for what the profile did not see); `cuda` is the ``torch.cuda`` module (tests pass one
    with scripted readings).
    """

    def __init__(
        self, device: int | str | torch.device | None = None, fraction: float = 0.9, cuda: Any = torch.cuda
    ):
        if not 0 < fraction <= 1:
            raise ValueError(f"fraction must be in (0, 1], got {fraction!r}")
        self.device = device
        self.fraction = fraction
        self.cuda = cuda

    def peak(self, run: Callable[[], None]) -> int:
        cuda = self.cuda
        cuda.synchronize(self.device)
        before = cuda.memory_allocated(self.device)
        cuda.reset_peak_memory_stats(self.device)
        run()
        cuda.synchronize(self.device)
        return cuda.max_memory_allocated(self.device) - before

    def available(self) -> int:
        cuda = self.cuda
        free, _total = cuda.mem_get_info(self.device)
        cached = cuda.memory_reserved(self.device) - cuda.memory_allocated(self.device)
        return int(self.fraction * (free + cached))


class CpuMemory:
    """The CPU: peaks from the profiler's allocation events, available memory a `budget` in
    bytes (a CPU has no device memory to fill; the budget is the user's)."""

    def __init__(self, budget: int):
        self.budget = check_int("budget", budget, minimum=1, expected="a positive number of bytes")

    def peak(self, run: Callable[[], None]) -> int:
        from torch.autograd import DeviceType
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as profiler:
            run()
        events = [
            event
            for event in profiler.profiler.kineto_results.events()
            if event.name() == "[memory]" and event.device_type() == DeviceType.CPU
        ]
        events.sort(key=lambda event: event.start_ns())
        held = peak = 0
        for event in events:  # allocations count positive, frees negative
            held += event.nbytes()
            peak = max(peak, held)
        return peak

    def available(self) -> int:
        return self.budget


@dataclass(frozen=True)
class FusionProfile:
    """Peak memory (bytes) of fused groups of two sizes (Hydro: 1 and 2 members)."""

    members: tuple[int, int]
    peaks: tuple[int, int]

    def __post_init__(self) -> None:
        small, large = self.members
        if not 1 <= small < large:
            raise ValueError(f"a profile needs two group sizes 1 <= a < b, got {self.members!r}")

    @property
    def per_member(self) -> float:
        """What one more member adds (at least one byte: a flat profile leaves F to the cap)."""
        (small, large), (low, high) = self.members, self.peaks
        return max((high - low) / (large - small), 1.0)

    @property
    def base(self) -> float:
        """What a group needs whatever its size."""
        return self.peaks[0] - self.per_member * self.members[0]

    def predict(self, members: int) -> int:
        """The peak memory the linear model predicts for `members` members."""
        return round(self.base + self.per_member * members)

    def count(self, available: int, cap: int | None = None) -> int:
        """The largest F (at least 1, at most `cap`) whose predicted peak fits `available`."""
        fits = max(1, math.floor((available - self.base) / self.per_member))
        return fits if cap is None else max(1, min(fits, cap))


def profile_fusion(
    trainer: type[FusibleTrainer],
    trainer_kwargs: Mapping[str, Any] | None,
    seed: int,
    hyperparameters: Mapping[str, Any],
    probe: MemoryProbe,
    members: tuple[int, int] = (1, 2),
) -> FusionProfile:
    """Measure one fused batch of `trainer` with `hyperparameters` (the values the group
    starts with: the batch size matters) in groups of `members` (Hydro's F = 1 and F = 2), on
    a throwaway trainer."""
    with isolated_rng():
        host = build_trainer(trainer, trainer_kwargs, seed)
        if not isinstance(host, FusibleTrainer):
            raise TypeError(f"{trainer.__qualname__} is not a FusibleTrainer")
        state = host.state_dict()

        def one_batch(members: int) -> Callable[[], None]:
            def run() -> None:
                group = FusedGroup.from_states(host, [state] * members)
                group.setup([dict(hyperparameters)] * members)
                group.train_batch(host.batches.next_batch())

            return run

        one_batch(members[0])()  # warm up: one-time allocations are no member's
        return FusionProfile(members, (probe.peak(one_batch(members[0])), probe.peak(one_batch(members[1]))))


def fusion_count(
    trainer: type[FusibleTrainer],
    trainer_kwargs: Mapping[str, Any] | None,
    seed: int,
    hyperparameters: Mapping[str, Any],
    *,
    cap: int | None = None,
    probe: MemoryProbe | None = None,
) -> int:
    """The fusion count F for groups of `trainer` starting with `hyperparameters`.

    With a `probe`, F is the profile extrapolated to ``probe.available()``, capped by `cap`;
    without one, CUDA is probed when it is available, and on a CPU-only machine F is `cap`
    (give ``probe=CpuMemory(budget)`` to extrapolate to a memory budget instead).
    """
    check_int("cap", cap, minimum=1, optional=True)
    if probe is None:
        if not torch.cuda.is_available():
            if cap is None:
                raise ValueError(
                    "on a CPU, give a cap (the most trials to fuse) or probe=CpuMemory(budget_bytes)"
                )
            return cap
        probe = CudaMemory()
    profile = profile_fusion(trainer, trainer_kwargs, seed, hyperparameters, probe)
    return profile.count(probe.available(), cap)
