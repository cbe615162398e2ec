"""The cyclic garbage collector's handling for large studies (`dagtune.collector_pause`).

`collector_paused` turns the collector off while a block builds objects that all live on.
`survivors_frozen` (around every `Study.run`) sets aside what survived the last full
collection, so the next one walks only what came since (issue 24: the memory path's ASHA cost
per trial grew 1.9x from 1,000 to 100,000 trials, from full collections walking the whole
heap). What it must never do is lose garbage for good: cycles among set-aside objects are
freed once those double, and at the run's end.
"""

from __future__ import annotations

import gc
import weakref
from typing import ClassVar

import pytest

from dagtune.algos import GridSearch
from dagtune.collector_pause import collector_paused, survivors_frozen
from dagtune.sim import SimulatedExecutor, SyntheticTrainer
from dagtune.study import Study


class Node:
    """An object that can sit in a reference cycle and be watched by a weak reference."""

    def __init__(self) -> None:
        self.other: Node | None = None


def cycle() -> tuple[weakref.ref, Node]:
    """A two-node cycle, a weak reference to one node, and the node (the caller drops it)."""
    a, b = Node(), Node()
    a.other, b.other = b, a
    return weakref.ref(a), a


@pytest.fixture(autouse=True)
def nothing_frozen():
    """Each test starts and ends with no frozen objects (a test that froze some lets them go)."""
    gc.unfreeze()
    yield
    gc.unfreeze()


def test_collector_paused_turns_the_collector_off_and_back():
    assert gc.isenabled()
    with collector_paused():
        assert not gc.isenabled()
        made = [Node() for _ in range(1000)]
    assert gc.isenabled()
    assert gc.get_freeze_count() == 0
    assert any(o is made[0] for o in gc.get_objects(generation=2))  # moved to the oldest


def test_survivors_are_set_aside_and_the_next_full_collection_walks_only_newer_objects():
    with survivors_frozen():
        gc.collect()
        frozen = gc.get_freeze_count()
        assert frozen > 0
        newer = [Node() for _ in range(1000)]
        gc.collect()
        # the second walk saw the newer objects, not the whole heap again: they are set aside
        # too (counted by identity: set-aside objects freed by reference counting in between,
        # by a thread of an earlier test, say, make the freeze count no measure)
        walked = {id(o) for o in gc.get_objects()}
        assert not any(id(node) in walked for node in newer)
        assert len(gc.get_objects(generation=2)) < len(newer)
    assert gc.get_freeze_count() == 0  # all let go at the end


def test_young_cycles_are_still_freed_while_survivors_are_set_aside():
    with survivors_frozen():
        gc.collect()
        ref, node = cycle()
        del node
        gc.collect()
        assert ref() is None


def test_a_cycle_among_set_aside_objects_is_freed_once_they_double():
    with survivors_frozen():
        ref, node = cycle()
        gc.collect()  # the cycle is set aside alive
        del node
        gc.collect()
        assert ref() is not None  # dead, but set aside: not walked
        grown = [Node() for _ in range(2 * gc.get_freeze_count())]
        gc.collect()  # the frozen objects doubled: all let go for one walk
        gc.collect()
        assert ref() is None
        del grown


def test_a_cycle_among_set_aside_objects_is_freed_after_the_run():
    with survivors_frozen():
        ref, node = cycle()
        gc.collect()
        del node
    gc.collect()
    assert ref() is None


def test_nested_runs_share_one_state_and_only_the_outermost_lets_go():
    with survivors_frozen():
        with survivors_frozen():
            gc.collect()
        assert gc.get_freeze_count() > 0
        gc.collect()
    assert gc.get_freeze_count() == 0


def test_someone_elses_frozen_objects_are_left_as_they_are():
    gc.freeze()
    theirs = gc.get_freeze_count()
    with survivors_frozen():
        gc.collect()
        assert gc.get_freeze_count() <= theirs  # nothing added (frozen objects may die)
    assert 0 < gc.get_freeze_count() <= theirs  # and not let go


class CollectingTrainer(SyntheticTrainer):
    """A synthetic trainer whose step runs a full collection and notes what stayed frozen
    (on the simulator a step runs in the study's process and thread)."""

    seen: ClassVar[list[int]] = []

    def train(self) -> None:
        super().train()
        gc.collect()
        CollectingTrainer.seen.append(gc.get_freeze_count())


def test_a_study_run_sets_survivors_aside_and_lets_them_go_when_it_returns():
    CollectingTrainer.seen = []
    study = Study(CollectingTrainer, executor=SimulatedExecutor(2))
    grid = GridSearch([{"lr": 0.1}, {"lr": 0.2}], metric="val_loss", mode="min", steps=2)
    result = study.run(grid, progress=False)
    study.close()
    assert len(result.trials) == 2
    assert CollectingTrainer.seen and all(count > 0 for count in CollectingTrainer.seen)
    assert gc.get_freeze_count() == 0
