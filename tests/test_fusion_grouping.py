"""Which tasks may be fused: `can_fuse` against a step-by-step oracle, and `fusion_groups`."""

from __future__ import annotations

from fusion_helpers import TinyMLP, task
from hypothesis import given
from hypothesis import strategies as st

import dagtune as dt
from dagtune.config import config_values, normalize_config
from dagtune.fusion import can_fuse, fusion_conflict, fusion_groups
from dagtune.sequences import same_value
from dagtune.sim import SyntheticTrainer
from dagtune.tasks import PathTask, Segment, TrainerSpec

TRAINERS = [
    TrainerSpec(TinyMLP, {}, 0, "00000000000000a0"),
    TrainerSpec(TinyMLP, {"hidden": 32}, 0, "00000000000000a1"),  # another width
    TrainerSpec(TinyMLP, {}, 1, "00000000000000a2"),  # another seed
    TrainerSpec(SyntheticTrainer, {}, 0, "00000000000000a3"),  # not fusible
]


def values(*choices):
    constant = st.sampled_from(choices).map(dt.Constant)
    steps = st.builds(
        lambda a, b, m: dt.Steps([a, b], [m]),
        st.sampled_from(choices),
        st.sampled_from(choices),
        st.integers(1, 8),
    )
    return constant | steps


CONFIGS = st.fixed_dictionaries(
    {"lr": values(0.1, 0.01)},
    optional={
        "momentum": values(0.0, 0.9),
        "batch_size": values(32, 64),
        "dropout": values(0.0, 0.5),
    },
)


@st.composite
def path_tasks(draw, key: str) -> PathTask:
    spec = draw(st.sampled_from(TRAINERS[:1] * 4 + TRAINERS[1:]))  # mostly the same trainer
    start = draw(st.sampled_from([0, 0, 2]))
    lengths = draw(st.lists(st.integers(1, 4), min_size=1, max_size=3))
    segments, lo = [], start
    for i, length in enumerate(lengths):
        segments.append(Segment(f"{key}{i}", normalize_config(draw(CONFIGS)), lo, lo + length))
        lo += length
    source = None if start == 0 else ("f" * 16, start)
    return PathTask(key, spec, tuple(segments), source, frozenset())


def oracle(a: PathTask, b: PathTask) -> bool:
    """The definition, step by step."""
    if a.key == b.key or a.trainer != b.trainer or a.start != b.start:
        return False
    if not issubclass(a.trainer.cls, dt.FusibleTrainer):
        return False
    fusible = a.trainer.cls.fusible_names()
    for t in range(a.start, min(a.end, b.end)):
        at_a = next(s for s in a.segments if s.start <= t < s.end)
        at_b = next(s for s in b.segments if s.start <= t < s.end)
        va = {n: v for n, v in config_values(at_a.config, t).items() if n not in fusible}
        vb = {n: v for n, v in config_values(at_b.config, t).items() if n not in fusible}
        if va.keys() != vb.keys() or not all(same_value(va[n], vb[n]) for n in va):
            return False
    return True


@given(path_tasks("a"), path_tasks("b"))
def test_can_fuse_is_the_step_by_step_definition(a, b):
    assert can_fuse(a, b) == oracle(a, b) == can_fuse(b, a)
    assert (fusion_conflict(a, b) is None) == can_fuse(a, b)


@given(
    st.lists(st.integers(0, 10**6), min_size=1, max_size=8, unique=True).flatmap(
        lambda keys: st.tuples(*(path_tasks(f"k{key}") for key in keys))
    ),
    st.integers(1, 4),
)
def test_fusion_groups_partition_into_fusible_groups(tasks, max_size):
    groups = fusion_groups(tasks, max_size)
    assert sorted(t.key for g in groups for t in g) == sorted(t.key for t in tasks)
    for group in groups:
        assert 1 <= len(group) <= max_size
        assert all(can_fuse(a, b) for i, a in enumerate(group) for b in group[i + 1 :])
    order = [t.key for t in tasks]
    assert all([order.index(t.key) for t in g] == sorted(order.index(t.key) for t in g) for g in groups)


def test_a_difference_after_the_common_range_does_not_matter():
    bs = {"batch_size": dt.Steps([32, 64], [3])}
    short = task("a", {"lr": 0.1, "batch_size": 32}, 3)
    assert can_fuse(short, task("b", {"lr": 0.2, **bs}, 5))
    assert not can_fuse(task("a", {"lr": 0.1, "batch_size": 32}, 4), task("b", {"lr": 0.2, **bs}, 5))
    # fusible values may differ anywhere, and be absent from one config (the trainer's default)
    assert can_fuse(task("a", {"lr": 0.1, "momentum": 0.5}, 5), task("b", {"lr": dt.Cosine(0.2, 4)}, 5))
