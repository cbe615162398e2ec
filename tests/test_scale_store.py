"""The scale benchmark's in-memory checkpoint store (`perf.scale.PickledStore`, issue 24's
million-trial stretch): it keeps the random generators' states once per distinct content,
yet every load gives back exactly the state saved, as a fresh copy, and a simulated study
on it ends with the same trials as on the simulator's own `MemoryStore`."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

import dagtune as dt
from dagtune.runner import checkpoint_parts, checkpoint_state
from dagtune.sim import MemoryStore, SimulatedExecutor, SyntheticTrainer
from dagtune.trainer import capture_rng, restore_rng
from perf.scale import PickledStore, algorithm

NODE = "a269bd8ebe2f3823"  # a stage tree node, as the runner names them


def a_checkpoint(w: float) -> dict:
    """What the runner saves: a trainer's state, the generators' states, carried metrics."""
    return checkpoint_state({"w": [w] * 8, "step": 2, "hp": {"lr": w}}, [(NODE, 2, {"val_loss": w})])


def equal(a, b) -> bool:
    """Deep equality, tensors by dtype, shape and values."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(equal, a, b))
    return type(a) is type(b) and a == b


def test_a_load_gives_back_the_state_saved_as_a_fresh_copy():
    store = PickledStore()
    saved = a_checkpoint(0.5)
    store.save("model", "node", 2, saved)
    loaded = store.load("model", "node", 2)
    assert equal(loaded, saved)
    checkpoint_parts(loaded)  # a training state the runner accepts
    loaded["rng"]["torch"].zero_()  # changing what a load gave changes nothing kept
    loaded["rng"]["python"]["state"][0] += 1
    assert equal(store.load("model", "node", 2), saved)
    assert (store.saves, store.loads) == (1, 2)


def test_the_generators_states_are_kept_once_per_distinct_content():
    store = PickledStore()
    store.save("model", "a", 1, a_checkpoint(0.1))
    one = store.held_bytes
    for i in range(2, 52):  # the generators where they were: only the trainer's part grows
        store.save("model", f"n{i}", 1, a_checkpoint(0.1 * i))
    assert len(store.interned) == 3  # python's list, numpy's key and torch's state
    assert (store.held_bytes - one) / 50 < 1_000 < one
    random.random(), np.random.random(), torch.rand(1)  # the generators moved: kept anew
    store.save("model", "b", 1, a_checkpoint(0.1))
    assert len(store.interned) == 6
    before = capture_rng()
    restore_rng(checkpoint_parts(store.load("model", "a", 1))[1])  # restores where they were
    restore_rng(checkpoint_parts(store.load("model", "b", 1))[1])
    assert equal(capture_rng(), before)


def test_what_is_not_interned_round_trips_as_it_is():
    store = PickledStore()
    state = {
        "floats": [float(i) for i in range(100)],  # not ints: pickled as they are
        "mixed": [1, 2.0, True] * 30,
        "ints": list(range(100)),
        "half": torch.arange(70, dtype=torch.float16),
        "strided": torch.arange(12).reshape(3, 4).t(),
        "conjugate": torch.tensor([1 + 2j, 3 - 1j]).conj(),
        "parameter": torch.nn.Parameter(torch.ones(3)),
        "grad": torch.ones(2, requires_grad=True),
    }
    store.save("model", "node", 1, state)
    loaded = store.load("model", "node", 1)
    assert set(loaded) == set(state)
    for name in ("floats", "mixed", "ints"):
        assert equal(loaded[name], state[name])
    for name in ("half", "strided", "conjugate"):
        assert loaded[name].dtype == state[name].dtype and torch.equal(loaded[name], state[name])
    assert type(loaded["parameter"]) is torch.nn.Parameter and loaded["grad"].requires_grad


def test_write_once_info_points_and_delete():
    store = PickledStore()
    store.save("model", "node", 1, a_checkpoint(0.1))
    store.save("model", "node", 1, a_checkpoint(0.9))  # a second writer yields to the first
    assert store.load("model", "node", 1)["trainer"]["w"][0] == 0.1
    assert store.info("model", "node", 1) is not None and store.info("model", "node", 2) is None
    store.save("other", "node", 3, a_checkpoint(0.2))
    assert [(node, step) for node, step, _ in store.points("model")] == [("node", 1)]
    store.delete("model", "node", 1)
    assert store.info("model", "node", 1) is None and store.saves == 2


@pytest.mark.parametrize("name", ["grid", "asha"])
def test_a_study_ends_as_on_the_simulators_own_store(name):
    def trials(store):
        study = dt.Study(SyntheticTrainer, name="s", executor=SimulatedExecutor(20, store=store))
        result = study.run(algorithm(name, 60))
        ended = sorted(study.coordinator.trials.values(), key=lambda t: t.id)
        return [(t.config, t.status, t.steps, t.curve) for t in ended], result.report["executed_steps"]

    pickled = PickledStore()
    assert trials(pickled) == trials(MemoryStore())
    assert pickled.loads > 0  # the study read checkpoints back, and found them
