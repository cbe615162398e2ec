"""`checkpoint_interval`: a task saves a checkpoint of its own accord once that many seconds
have passed since its last save, bounding what an interrupt or a lost worker trains again.

Time here is a clock the test advances (a runner's `clock`; a simulated executor's virtual
time), never a sleep; assertions count steps and checkpoints.
"""

from __future__ import annotations

import dataclasses

import pytest
from fusion_helpers import TinyMLP, comparable, metrics, of, task

import dagtune as dt
from dagtune.checkpoints import CheckpointStore
from dagtune.events import CheckpointSaved, MetricsReported, StateLoaded, StepDone
from dagtune.fusion import FusedPathRunner
from dagtune.gc import GcPolicy
from dagtune.runner import PathRunner
from dagtune.sim import SimulatedExecutor, SyntheticTrainer
from dagtune.study import Study
from dagtune.validation import InvalidValueError

BS = {"batch_size": 32}
STEP = 10.0  # seconds each step takes on the test's clock


class Clock:
    """A clock the test moves: each step the runner yields takes `STEP` seconds."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def timed(runner, clock: Clock, stop_after: int | None = None) -> list:
    """Run `runner`'s steps, advancing `clock` by `STEP` per step; with `stop_after`, the
    worker dies once the checkpoint at that step is saved. Every event it produced."""
    everything = []
    for events in runner.steps():
        everything.extend(events)
        if stop_after is not None and any(
            isinstance(e, CheckpointSaved) and e.step == stop_after for e in events
        ):
            break
        clock.now += STEP
    return everything


def saved_steps(events) -> list[int]:
    return [e.step for e in events if isinstance(e, CheckpointSaved)]


def evaluated_steps(events) -> list[int]:
    return [e.step for e in events if isinstance(e, MetricsReported)]


def test_a_task_saves_when_the_interval_has_passed_and_reports_the_same(tmp_path):
    # step k ends at 10 (k - 1) s on the clock, training began at 0: with 55 s, steps 7, 13,
    # 19 and 25 are the first to end 55 s or more after the last save; 30 is the planned end
    config = {"lr": 0.1, **BS}
    plain = task("a", config, 30, checkpoints=[30], eval_every=5)
    timed_task = dataclasses.replace(plain, checkpoint_interval=55.0)
    clock = Clock()
    events = timed(PathRunner(timed_task, CheckpointStore(str(tmp_path / "a")), clock=clock), clock)
    assert saved_steps(events) == [7, 13, 19, 25, 30]
    clock = Clock()
    reference = timed(PathRunner(plain, CheckpointStore(str(tmp_path / "b")), clock=clock), clock)
    assert saved_steps(reference) == [30]
    # no evaluation added: what is trained and reported is the same, only checkpoints differ
    assert evaluated_steps(events) == evaluated_steps(reference) == [5, 10, 15, 20, 25, 30]
    assert metrics(events) == metrics(reference)
    alone = dt.run_alone(TinyMLP, config, 30)
    assert metrics(events) == [alone[s - 1] for s in (5, 10, 15, 20, 25, 30)]


def test_a_rerun_resumes_from_the_unplanned_checkpoint(tmp_path):
    config = {"lr": 0.1, **BS}
    store = CheckpointStore(str(tmp_path / "runs"))
    one = dataclasses.replace(task("a", config, 30, checkpoints=[30]), checkpoint_interval=55.0)
    clock = Clock()
    lost = timed(PathRunner(one, store, clock=clock), clock, stop_after=19)  # the worker dies
    assert saved_steps(lost) == [7, 13, 19]
    clock = Clock()
    again = timed(PathRunner(one, store, clock=clock), clock)  # Dask runs the same task again
    loads = [(e.step, e.origin) for e in again if isinstance(e, StateLoaded)]
    assert loads == [(19, "storage")]
    assert sum(isinstance(e, StepDone) for e in again) == 11  # steps 20 to 30 only
    # the checkpoint carries the curve up to it, sent before training on
    assert evaluated_steps(again)[:19] == list(range(1, 20))
    assert metrics(again) == dt.run_alone(TinyMLP, config, 30)


class ListingStore(CheckpointStore):
    """A local store that counts the listings a task's start makes (`steps`)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.listed: list[str] = []

    def steps(self, identity: str, node: str) -> list[int]:
        self.listed.append(node)
        return super().steps(identity, node)


def test_a_start_lists_only_segments_it_could_resume_in(tmp_path):
    """Each listing is a storage request (an S3 LIST): a task lists its segments from the
    last until one holds a checkpoint, and never one without a step to resume at (a one-step
    task lists nothing)."""
    config = {"lr": 0.1, **BS}
    store = ListingStore(str(tmp_path / "runs"))
    one_step = dataclasses.replace(task("a", config, 1, checkpoints=[1]), checkpoint_interval=55.0)
    next(iter(PathRunner(one_step, store).steps()))
    assert store.listed == []
    pieces = [(0, 4, config), (4, 8, {"lr": 0.05, **BS}), (8, 12, {"lr": 0.01, **BS})]
    three = dataclasses.replace(task("b", pieces, checkpoints=[12], node=3), checkpoint_interval=55.0)
    next(iter(PathRunner(three, store).steps()))
    assert store.listed == [segment.node for segment in reversed(three.segments)]  # nothing saved yet
    store.listed.clear()
    untimed = dataclasses.replace(three, checkpoint_interval=None)
    next(iter(PathRunner(untimed, store).steps()))
    assert store.listed == []  # without the interval, only the planned checkpoints are asked


def test_fused_members_save_as_they_would_alone(tmp_path):
    tasks = [
        dataclasses.replace(task("a", {"lr": 0.1, **BS}, 20, checkpoints=[20]), checkpoint_interval=55.0),
        dataclasses.replace(
            task("b", {"lr": 0.05, **BS}, 16, checkpoints=[16], node=10), checkpoint_interval=55.0
        ),
    ]
    clock = Clock()
    fused = timed(FusedPathRunner(tasks, CheckpointStore(str(tmp_path / "fused")), clock=clock), clock)
    for one in tasks:
        clock = Clock()
        alone = timed(PathRunner(one, CheckpointStore(str(tmp_path / one.key)), clock=clock), clock)
        # the same events, checkpoint sizes and SHA-256s included (TinyMLP fuses bit for bit)
        assert comparable(of(fused, one.key)) == comparable(alone)
    assert saved_steps(of(fused, "a")) == [7, 13, 19, 20]
    assert saved_steps(of(fused, "b")) == [7, 13, 16]


# --------------------------------------------------------------------------- a study


def study_on(storage, name: str, **options) -> Study:
    store = CheckpointStore(storage.url, storage.options)
    executor = SimulatedExecutor(1, step_seconds=STEP, store=store)  # virtual seconds
    return Study(SyntheticTrainer, name=name, executor=executor, **options)


@pytest.fixture
def local(tmp_path):
    from durable_helpers import Storage

    return Storage("local", str(tmp_path / "runs"))


def cut(storage, name: str, steps: int, at: int, lr: float = 0.05, **options) -> list[int]:
    """A study of one trial of `steps` steps interrupted once `at` steps were trained: the
    checkpoints its plan holds then."""
    with study_on(storage, name, **options) as first:
        first.submit({"lr": lr}, steps)
        while first.coordinator.executed_steps < at:
            first.coordinator.pump()
        node = next(iter(first.coordinator.trials.values())).node
        return sorted(first.plan.nodes[node].checkpoints)


def test_an_interrupted_study_resumes_from_its_last_unplanned_checkpoint(local):
    saved = cut(local, "cut", 30, 22, checkpoint_interval=55.0)
    assert saved and max(saved) < 22  # interval checkpoints only: nothing is planned before 30
    latest = max(saved)
    with study_on(local, "cut", checkpoint_interval=55.0) as again:
        (trial,) = again.trials
        assert trial.status == "pending"
        result = again.run(dt.algos.GridSearch([{"lr": 0.05}], metric="val_loss", mode="min", steps=30))
        assert again.coordinator.executed_steps == 30 - latest  # only the steps after it
        assert result.best.metrics == dt.run_alone(SyntheticTrainer, {"lr": 0.05}, 30)[-1]
    # without it, the same cut leaves no checkpoint to resume from: all 30 are trained again
    assert cut(local, "plain", 30, 22, lr=0.02, checkpoint_interval=None) == []


def test_garbage_collection_keeps_the_resume_point_and_collects_the_earlier_ones(local):
    saved = cut(local, "gc", 30, 22, checkpoint_interval=55.0)
    assert len(saved) >= 2
    with study_on(local, "gc", checkpoint_interval=55.0) as again:
        node = next(iter(again.coordinator.trials.values())).node
        again.gc(GcPolicy(keep_best=0, keep_latest=False, orphan_seconds=None))
        assert sorted(again.plan.nodes[node].checkpoints) == [max(saved)]  # the pending trial's
        again.run(dt.algos.GridSearch([{"lr": 0.05}], metric="val_loss", mode="min", steps=30))
        assert again.coordinator.executed_steps == 30 - max(saved)


def test_the_option_is_on_by_default_and_checked(tmp_path):
    def study(**options):
        return Study(SyntheticTrainer, name="x", executor=SimulatedExecutor(1), **options)

    with study() as default:
        assert default.coordinator.dispatcher.checkpoint_interval == 600.0
    for off in (None, 0, 0.0):
        with study(checkpoint_interval=off) as s:
            assert s.coordinator.dispatcher.checkpoint_interval is None
    for bad in (-1, "600", float("nan"), True):
        with pytest.raises(InvalidValueError, match=rf"checkpoint_interval must be .*, got {bad!r}"):
            study(checkpoint_interval=bad)
