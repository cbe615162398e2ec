"""The Trainer contract helpers: seeding, RNG capture, trainer construction, resumable data order."""

from __future__ import annotations

import io
import random

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch.utils.data import DataLoader, TensorDataset

from dagtune.trainer import (
    ResumableBatches,
    ResumableBatchSampler,
    Trainer,
    build_trainer,
    capture_rng,
    check_rng_state,
    isolated_rng,
    restore_rng,
    seed_everything,
)


def through_bytes(obj):
    """What a checkpoint gives back: torch.save to real bytes, torch.load(weights_only=True)."""
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return torch.load(io.BytesIO(buffer.getvalue()), weights_only=True)


def draws() -> tuple:
    """Something from every generator, including the cached-gaussian paths."""
    return (
        random.random(),
        random.gauss(0.0, 1.0),
        np.random.random(3).tolist(),
        np.random.normal(),
        torch.rand(3).tolist(),
        torch.randint(0, 1000, (2,)).tolist(),
    )


# --------------------------------------------------------------------------- seeding and RNG state


def test_seed_everything_is_reproducible():
    seed_everything(7)
    first = draws()
    seed_everything(7)
    assert draws() == first
    seed_everything(8)
    assert draws() != first


def test_seed_everything_seeds_torch_as_torch_manual_seed_does():
    for seed in (0, 7, 2**40 + 3):
        torch.manual_seed(seed)
        expected = torch.rand(5), torch.get_rng_state()
        torch.manual_seed(seed + 1)
        seed_everything(seed)
        assert torch.equal(torch.rand(5), expected[0])
        assert torch.equal(torch.get_rng_state(), expected[1])


def test_seed_everything_accepts_large_seeds_and_rejects_bad_ones():
    seed_everything(2**40 + 3)
    a = draws()
    seed_everything(2**40 + 3)
    assert draws() == a
    for bad in (-1, 1.5, True, "3", 2**64):
        with pytest.raises(ValueError, match="seed"):
            seed_everything(bad)


def test_capture_restore_round_trips_through_weights_only_bytes():
    seed_everything(3)
    random.gauss(0.0, 1.0)  # leave a cached gaussian in python's state ...
    np.random.normal()  # ... and in numpy's
    state = capture_rng()
    expected = draws()
    draws()  # move on
    restore_rng(through_bytes(state))
    assert draws() == expected


def test_restore_rng_into_another_seeded_process_state():
    seed_everything(1)
    draws()
    saved = through_bytes(capture_rng())
    expected = draws()
    seed_everything(99)  # what a fresh worker does before building the trainer
    draws()
    restore_rng(saved)
    assert draws() == expected


def test_isolated_rng_leaves_the_generators_untouched():
    seed_everything(5)
    expected = draws()
    seed_everything(5)
    with isolated_rng():
        draws()
        draws()
    assert draws() == expected


def test_isolated_rng_restores_on_error():
    seed_everything(5)
    expected = draws()
    seed_everything(5)
    with pytest.raises(RuntimeError), isolated_rng():
        draws()
        raise RuntimeError("evaluation failed")
    assert draws() == expected


# --------------------------------------------------------------------------- build_trainer


class _Base(Trainer):
    def setup(self, hp):
        pass

    def train(self):
        return None

    def evaluate(self):
        return {}

    def state_dict(self):
        return {}

    def load_state_dict(self, state):
        pass


class SeedTaker(_Base):
    def __init__(self, width: int = 3, seed: int = -1):
        self.width, self.seed = width, seed
        self.init = torch.rand(width).tolist()  # randomness in __init__ comes from the seeded globals
        self.np_init = np.random.random()


class NoSeed(_Base):
    def __init__(self, width: int = 3):
        self.width = width
        self.init = torch.rand(width).tolist()


class KeywordsOnly(_Base):
    def __init__(self, **kwargs):
        self.kwargs = kwargs


def test_build_trainer_seeds_and_passes_seed():
    a = build_trainer(SeedTaker, {"width": 4}, seed=11)
    random.random(), torch.rand(5)  # disturb the globals between builds
    b = build_trainer(SeedTaker, {"width": 4}, seed=11)
    assert a.seed == b.seed == 11
    assert a.init == b.init and a.np_init == b.np_init
    assert build_trainer(SeedTaker, {"width": 4}, seed=12).init != a.init


def test_build_trainer_keeps_an_explicit_seed_and_skips_classes_without_one():
    assert build_trainer(SeedTaker, {"seed": 3}, seed=11).seed == 3
    assert build_trainer(NoSeed, {"width": 2}, seed=11).width == 2
    assert build_trainer(KeywordsOnly, None, seed=11).kwargs == {}  # only a parameter *named* seed


def test_build_trainer_rejects_non_trainers():
    class NotATrainer:
        pass

    with pytest.raises(TypeError, match="NotATrainer"):
        build_trainer(NotATrainer, {}, seed=0)
    with pytest.raises(TypeError, match="Trainer subclass"):
        build_trainer(SeedTaker(), {}, seed=0)


def test_trainer_is_abstract():
    class Incomplete(Trainer):
        def train(self):
            return None

    with pytest.raises(TypeError):
        Incomplete()


# --------------------------------------------------------------------------- resumable data order


def listed(batches) -> list[list[int]]:
    return [b.tolist() for b in batches]


def flat(batches) -> list[int]:
    return [i for batch in batches for i in batch]


def test_each_epoch_is_a_permutation_from_seed_and_epoch_only():
    order = ResumableBatches(23, 5, seed=4)
    epochs = []
    for _ in range(3):
        seed_everything(0)  # the global RNG plays no part
        batches = listed(order.epoch())
        assert [len(b) for b in batches] == [5, 5, 5, 5, 3]
        indices = flat(batches)
        assert sorted(indices) == list(range(23))
        epochs.append(indices)
    assert epochs[0] != epochs[1] != epochs[2]
    assert epochs[1] == np.random.default_rng([4, 1]).permutation(23).tolist()
    assert order.current_epoch == 3 and order.position == 0
    again = ResumableBatches(23, 5, seed=4)
    np.random.random(100), random.random(), torch.rand(9)
    assert flat(listed(again.epoch())) == epochs[0]


def test_batches_are_int64_arrays():
    batch = ResumableBatches(10, 4, seed=0).next_batch()
    assert isinstance(batch, np.ndarray) and batch.dtype == np.int64


def test_resume_mid_epoch_gives_the_same_remaining_batches():
    straight = ResumableBatches(50, 7, seed=1)
    expected = listed(straight.take(20))

    first = ResumableBatches(50, 7, seed=1)
    got = listed(first.take(3))  # stop in the middle of epoch 0
    assert first.position == 21
    state = through_bytes(first.state_dict())
    resumed = ResumableBatches(50, 7, seed=1)
    resumed.load_state_dict(state)
    got += listed(resumed.epoch())  # the rest of epoch 0
    got += listed(resumed.take(20 - len(got)))
    assert got == expected


def test_take_crosses_epoch_boundaries_like_consecutive_epochs():
    a = ResumableBatches(10, 4, seed=2)
    by_epoch = listed(a.epoch()) + listed(a.epoch()) + listed(a.epoch())
    b = ResumableBatches(10, 4, seed=2)
    assert listed(b.take(len(by_epoch))) == by_epoch
    assert b.state_dict() == a.state_dict()


def test_batch_size_change_mid_epoch_continues_at_the_same_sample():
    order = ResumableBatches(40, 6, seed=3)
    permutation = order.permutation(0).tolist()
    head = listed(order.take(2))
    order.set_batch_size(10)
    tail = listed(order.epoch())
    assert [len(b) for b in head + tail] == [6, 6, 10, 10, 8]
    assert flat(head + tail) == permutation
    assert order.current_epoch == 1 and order.batch_size == 10
    assert listed(order.take(1)) == [order.permutation(1)[:10].tolist()]


def test_batch_size_change_survives_a_checkpoint():
    straight = ResumableBatches(40, 6, seed=3)
    list(straight.take(2))
    straight.set_batch_size(9)
    expected = listed(straight.take(8))

    before = ResumableBatches(40, 6, seed=3)
    list(before.take(2))
    before.set_batch_size(9)
    resumed = ResumableBatches(40, 32, seed=3)  # built with another batch size
    resumed.load_state_dict(through_bytes(before.state_dict()))
    resumed.set_batch_size(9)  # setup(full values) after resuming: idempotent
    assert listed(resumed.take(8)) == expected


def test_setting_the_same_batch_size_is_a_no_op():
    a, b = ResumableBatches(30, 4, seed=5), ResumableBatches(30, 4, seed=5)
    list(a.take(3))
    list(b.take(3))
    b.set_batch_size(4)
    assert a.state_dict() == b.state_dict()
    assert listed(a.take(10)) == listed(b.take(10))


def test_state_dict_round_trips_and_holds_plain_values():
    order = ResumableBatches(17, 3, seed=9, drop_last=True)
    list(order.take(4))
    state = order.state_dict()
    assert through_bytes(state) == state
    assert state["epoch"] == 0 and state["position"] == 12 and state["batch_size"] == 3


def test_load_state_dict_refuses_another_order():
    state = ResumableBatches(17, 3, seed=9).state_dict()
    with pytest.raises(ValueError, match="seed"):
        ResumableBatches(17, 3, seed=10).load_state_dict(state)
    with pytest.raises(ValueError, match="n 17"):
        ResumableBatches(18, 3, seed=9).load_state_dict(state)


def test_drop_last_skips_the_short_batch():
    order = ResumableBatches(10, 4, seed=0, drop_last=True)
    assert order.batches_left() == 2
    assert [len(b) for b in order.epoch()] == [4, 4]
    assert order.current_epoch == 1 and order.position == 0
    list(order.take(1))
    order.set_batch_size(7)  # 6 samples left: no full batch, the next one opens epoch 2
    assert order.batches_left() == 1
    assert listed(order.epoch()) == [order.permutation(2)[:7].tolist()]
    with pytest.raises(ValueError, match="larger than"):
        order.set_batch_size(11)


def test_without_shuffle_the_order_is_the_dataset_order():
    order = ResumableBatches(7, 3, seed=0, shuffle=False)
    assert listed(order.epoch()) == [[0, 1, 2], [3, 4, 5], [6]]


def test_bad_arguments():
    with pytest.raises(ValueError, match="batch_size"):
        ResumableBatches(10, 0, seed=0)
    with pytest.raises(ValueError, match="batch_size"):
        ResumableBatches(10, 4, seed=0).set_batch_size(64.0)
    with pytest.raises(ValueError, match="n must"):
        ResumableBatches(0, 4, seed=0)
    with pytest.raises(ValueError, match="seed"):
        ResumableBatches(10, 4, seed=-1)
    with pytest.raises(ValueError, match="take"):
        ResumableBatches(10, 4, seed=0).take(-1)


def test_batch_sampler_drives_a_dataloader_with_the_same_order():
    data = TensorDataset(torch.arange(30))
    reference = ResumableBatches(30, 4, seed=6)
    expected = listed(reference.take(12))

    order = ResumableBatches(30, 4, seed=6)
    loader = DataLoader(data, batch_sampler=order.sampler())
    assert len(loader) == 8
    got = [batch.tolist() for (batch,) in loader]  # one pass = one epoch
    assert order.current_epoch == 1 and order.position == 0

    resumed = ResumableBatches(30, 4, seed=6)
    resumed.load_state_dict(through_bytes(order.state_dict()))
    stepper = DataLoader(data, batch_sampler=resumed.sampler(2))  # one pass = two batches
    assert len(stepper) == 2
    got += [batch.tolist() for (batch,) in stepper]
    got += [batch.tolist() for (batch,) in stepper]
    assert got == expected


def test_batch_sampler_yields_lists_of_ints():
    sampler = ResumableBatchSampler(ResumableBatches(5, 2, seed=0))
    batches = list(sampler)
    assert all(isinstance(b, list) and all(type(i) is int for i in b) for b in batches)
    assert sorted(flat(batches)) == list(range(5))


operations = st.lists(
    st.one_of(
        st.tuples(st.just("take"), st.integers(0, 7)),
        st.tuples(st.just("epoch"), st.just(0)),
        st.tuples(st.just("batch_size"), st.integers(1, 12)),
        st.tuples(st.just("checkpoint"), st.integers(1, 12)),
    ),
    max_size=25,
)


@given(
    n=st.integers(1, 30),
    batch_size=st.integers(1, 12),
    seed=st.integers(0, 2**32),
    shuffle=st.booleans(),
    ops=operations,
)
def test_checkpoints_anywhere_never_change_the_batches(n, batch_size, seed, shuffle, ops):
    """An uninterrupted order and one rebuilt from its state at arbitrary points (with another
    initial batch size) draw identical batches, and the stream of samples is always the
    concatenation of the epochs' permutations, whatever the batch sizes."""
    straight = ResumableBatches(n, batch_size, seed, shuffle=shuffle)
    broken = ResumableBatches(n, batch_size, seed, shuffle=shuffle)
    drawn: list[list[int]] = []
    for op, arg in ops:
        if op == "take":
            expected = listed(straight.take(arg))
            assert listed(broken.take(arg)) == expected
            drawn += expected
        elif op == "epoch":
            expected = listed(straight.epoch())
            assert listed(broken.epoch()) == expected
            drawn += expected
        elif op == "batch_size":
            straight.set_batch_size(arg)
            broken.set_batch_size(arg)
        else:
            rebuilt = ResumableBatches(n, arg, seed, shuffle=shuffle)
            rebuilt.load_state_dict(through_bytes(broken.state_dict()))
            broken = rebuilt
        assert broken.state_dict() == straight.state_dict()
    stream = flat(drawn)
    epochs = -(-len(stream) // n) if stream else 0
    reference = ResumableBatches(n, 1, seed, shuffle=shuffle)
    assert stream == flat(reference.permutation(e).tolist() for e in range(epochs))[: len(stream)]


def test_a_metric_that_is_not_one_number_is_named():
    from dagtune.runner import to_metrics

    assert to_metrics({"loss": torch.tensor(0.5), "n": np.int64(3)}, "Trainer.train()") == {
        "loss": 0.5,
        "n": 3.0,
    }
    with pytest.raises(
        TypeError, match=r"evaluate\(\) returned metric 'acc' as a Tensor of shape \(2,\), not one"
    ):
        to_metrics({"loss": torch.tensor(0.5), "acc": torch.ones(2)}, "Trainer.evaluate()")
    with pytest.raises(TypeError, match=r"metric 'acc' as a ndarray of shape \(3,\)"):
        to_metrics({"acc": np.zeros(3)}, "Trainer.evaluate()")


def test_an_rng_state_is_checked_without_touching_the_generators():
    seed_everything(3)
    state = through_bytes(capture_rng())
    check_rng_state(state)
    expected = draws()
    seed_everything(3)
    for bad in (
        {},
        [],
        {**state, "numpy": {"kind": "MT19937"}},
        {**state, "torch": torch.zeros(3)},
        {**state, "python": {"version": 3, "state": [1, 2], "gauss_next": None}},
    ):
        with pytest.raises(ValueError, match="RNG state"):
            check_rng_state(bad)
    assert draws() == expected  # checking restored nothing


def test_build_trainer_inspects_each_class_once(monkeypatch):
    """Every task builds a trainer: its constructor's signature is read once per class, not per
    build, and a class defined again (a notebook cell run twice) is a new class, read anew."""
    from dagtune import trainer as module

    calls = []
    real = module.inspect.signature
    monkeypatch.setattr(module.inspect, "signature", lambda obj: calls.append(obj) or real(obj))

    def define(with_seed: bool) -> type:
        class Redefined(_Base):
            if with_seed:

                def __init__(self, seed: int = -1):
                    self.seed = seed
            else:

                def __init__(self):
                    self.seed = None

        return Redefined

    first = define(with_seed=True)
    for _ in range(5):
        assert build_trainer(first, None, seed=7).seed == 7
    assert calls == [first]
    second = define(with_seed=False)  # same name, no seed now
    for _ in range(5):
        assert build_trainer(second, None, seed=7).seed is None
    assert calls == [first, second]
