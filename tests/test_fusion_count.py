"""The fusion count F: memory profiled at F = 1 and F = 2, extrapolated linearly."""

from __future__ import annotations

import pytest
import torch
from fusion_helpers import TinyMLP

from dagtune.fusion import CpuMemory, CudaMemory, FusedGroup, FusionProfile, fusion_count, profile_fusion
from dagtune.trainer import build_trainer

VALUES = {"lr": 0.1, "batch_size": 32}


def test_the_profile_is_a_line_through_two_group_sizes():
    profile = FusionProfile((1, 2), (5000, 8000))
    assert (profile.per_member, profile.base) == (3000, 2000)
    assert profile.predict(10) == 32000
    assert profile.count(32000) == 10 and profile.count(31999) == 9
    assert profile.count(32000, cap=4) == 4
    assert profile.count(100) == 1  # one member always runs (alone, as unfused would)
    assert FusionProfile((2, 4), (8000, 14000)).count(32000) == 10
    assert FusionProfile((1, 2), (5000, 4000)).count(10**6, cap=7) == 7  # flat: the cap decides
    with pytest.raises(ValueError, match="two group sizes"):
        FusionProfile((2, 2), (1, 2))


class ScriptedCuda:
    """``torch.cuda`` with scripted readings: 1000 bytes allocated before each profile, the
    given peaks during them, 100 kB free on the device and 500 B cached by the allocator."""

    def __init__(self, peaks):
        self.peaks = list(peaks)
        self.calls = []

    def synchronize(self, device=None):
        self.calls.append("synchronize")

    def memory_allocated(self, device=None):
        return 1000

    def reset_peak_memory_stats(self, device=None):
        self.calls.append("reset")

    def max_memory_allocated(self, device=None):
        self.calls.append("max")
        return 1000 + self.peaks.pop(0)

    def memory_reserved(self, device=None):
        return 1500

    def mem_get_info(self, device=None):
        return 100_000, 200_000


def test_cuda_counts_from_the_allocator_and_the_free_memory():
    cuda = ScriptedCuda([5000, 8000])
    probe = CudaMemory(cuda=cuda)  # the profile itself trains on this CPU
    assert fusion_count(TinyMLP, {}, 0, VALUES, probe=probe) == (int(0.9 * 100_500) - 2000) // 3000
    assert cuda.calls == ["synchronize", "reset", "synchronize", "max"] * 2
    assert (
        fusion_count(TinyMLP, {}, 0, VALUES, probe=CudaMemory(cuda=ScriptedCuda([5000, 8000])), cap=16) == 16
    )


def test_cpu_memory_is_measured_and_linear_for_the_mlp():
    probe = CpuMemory(budget=2**20)
    profile = profile_fusion(TinyMLP, {}, 0, VALUES, probe)
    assert 0 < profile.peaks[0] < profile.peaks[1]
    host = build_trainer(TinyMLP, {}, 0)
    state = host.state_dict()

    def four():
        group = FusedGroup.from_states(host, [state] * 4)
        group.setup([VALUES] * 4)
        group.train_batch(host.batches.next_batch())

    measured = probe.peak(four)
    assert abs(measured - profile.predict(4)) <= 0.02 * measured
    assert profile.count(probe.available()) == fusion_count(TinyMLP, {}, 0, VALUES, probe=probe)


def test_profiling_leaves_the_global_rngs_alone():
    before = torch.get_rng_state()
    profile_fusion(TinyMLP, {"dropout": 0.5}, 0, VALUES, CpuMemory(budget=2**20))
    assert torch.equal(torch.get_rng_state(), before)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU-only default")
def test_on_a_cpu_without_a_probe_the_cap_decides():
    assert fusion_count(TinyMLP, {}, 0, VALUES, cap=8) == 8
    with pytest.raises(ValueError, match="CpuMemory"):
        fusion_count(TinyMLP, {}, 0, VALUES)
    with pytest.raises(ValueError, match="cap"):
        fusion_count(TinyMLP, {}, 0, VALUES, cap=0)
