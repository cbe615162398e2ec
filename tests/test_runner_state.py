"""How the runner lays out a checkpoint's state for storage: python's RNG state travels as
one tensor (torch.save pickles a list of its 625 words one object at a time) and comes
back exactly as `capture_rng` gives it."""

from __future__ import annotations

import io
import pickle
import random

import torch

from dagtune.checkpoints import CheckpointStore
from dagtune.runner import checkpoint_parts, checkpoint_state, stored_state
from dagtune.trainer import restore_rng

IDENTITY = "0123abcd0123abcd"
NODE = "fedcba9876543210"


class _Counting(pickle.Pickler):
    """Counts the objects torch.save's pickler would hand to `persistent_id` (one per object)."""

    def __init__(self, file):
        super().__init__(file)
        self.objects = 0

    def persistent_id(self, obj):
        self.objects += 1
        return None


def _objects(state: dict) -> int:
    pickler = _Counting(io.BytesIO())
    pickler.dump({key: value for key, value in state.items() if key != "trainer"})
    return pickler.objects


def test_python_rng_state_is_stored_as_one_tensor_and_read_back_exactly(tmp_path):
    random.seed(12345)
    random.random()
    state = checkpoint_state({"step": 3}, [])
    stored = stored_state(state)
    assert isinstance(stored["rng"]["python"]["state"], torch.Tensor)
    assert _objects(stored) < 100 < 625 < _objects(state)  # what torch.save's pickler visits
    store = CheckpointStore(str(tmp_path))
    store.save(IDENTITY, NODE, 1, stored)
    trainer, rng, carried = checkpoint_parts(store.load(IDENTITY, NODE, 1))
    assert trainer == {"step": 3} and carried == []
    assert rng["python"] == state["rng"]["python"]  # the list of ints capture_rng gave
    expected = random.random()
    restore_rng(rng)
    assert random.random() == expected


def test_a_checkpoint_with_the_list_layout_still_reads(tmp_path):
    state = checkpoint_state({"step": 3}, [])
    store = CheckpointStore(str(tmp_path))
    store.save(IDENTITY, NODE, 1, state)  # as checkpoints were saved before
    _, rng, _ = checkpoint_parts(store.load(IDENTITY, NODE, 1))
    assert rng["python"] == state["rng"]["python"]


def test_a_stored_rng_state_restores_the_generator_as_it_is_read(tmp_path):
    """`restore_rng` takes a loaded checkpoint's RNG state as it is (the tensor layout), as
    `dagtune.restore` and the fused runner's resume check give it."""
    random.seed(54321)
    random.random()
    state = checkpoint_state({"step": 3}, [])
    expected = random.random()
    store = CheckpointStore(str(tmp_path))
    store.save(IDENTITY, NODE, 1, stored_state(state))
    loaded = store.load(IDENTITY, NODE, 1)
    assert isinstance(loaded["rng"]["python"]["state"], torch.Tensor)
    random.seed(0)
    restore_rng(loaded["rng"])
    assert random.random() == expected
