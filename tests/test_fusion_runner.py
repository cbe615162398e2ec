"""FusedPathRunner: K path tasks lock-stepped, each with exactly its PathRunner event stream.

The 30-64-2 MLP trains fused bit for bit as unfused on this CPU, so there a fused task's
events (metrics, checkpoint sizes and SHA-256s included) are compared whole with the events
`PathRunner` gives the same task; the CNN is compared with `run_alone(..., fused=True)`.
"""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path

import pytest
import torch
from fusion_helpers import IDENTITY, NODES, TinyCNN, TinyMLP, comparable, drive, metrics, of, task

import dagtune as dt
from dagtune.checkpoints import CheckpointStore
from dagtune.events import CheckpointSaved, MetricsReported, StateLoaded, TaskEnded, TaskFailed
from dagtune.fusion import FusedPathRunner, FusionError, same_state
from dagtune.runner import PathRunner
from dagtune.sim import SyntheticTrainer
from dagtune.tasks import Directive

BS = {"batch_size": 32}


def unfused_events(tasks, store, directives=None):
    events = []
    for one in tasks:
        runner = PathRunner(one, store)
        events.extend(drive(runner.steps(), lambda _key, d, r=runner: r.update(d), directives or {}))
    return events


def fused_events(tasks, store, directives=None):
    runner = FusedPathRunner(tasks, store)
    return drive(runner.steps(), runner.update, directives or {})


def test_each_task_gets_the_events_its_path_runner_gives_it(tmp_path):
    tasks = [
        task("a", {"lr": 0.1, **BS}, 5, checkpoints=[2, 5], kwargs={"dropout": 0.2}),
        task(
            "b",
            [(0, 2, {"lr": 0.05, "momentum": 0.0, **BS}), (2, 6, {"lr": dt.Steps([0.05, 0.01], [2]), **BS})],
            checkpoints=[2, 6],
            eval_every=2,
            kwargs={"dropout": 0.2},
            node=10,
        ),
        task(
            "c",
            {"lr": dt.MultiStep(0.2, [2], 0.1), "weight_decay": 1e-3, **BS},
            6,
            checkpoints=[3, 6],
            kwargs={"dropout": 0.2},
            node=20,
        ),
    ]
    directives = {
        ("a", 1): Directive(checkpoints=frozenset({4})),  # a trial branched off a's path
        ("b", 1): Directive(pause_at=2),  # a longer stage waits for this worker
        ("c", 2): Directive(checkpoints=frozenset({1}), stop_at=4),  # too late for 1; cancelled after 4
    }
    fused = fused_events(tasks, CheckpointStore(str(tmp_path / "fused")), directives)
    unfused = unfused_events(tasks, CheckpointStore(str(tmp_path / "unfused")), directives)
    for one in tasks:
        assert comparable(of(fused, one.key)) == comparable(of(unfused, one.key))
    kinds = {key: [e.kind for e in of(fused, key)] for key in "abc"}
    assert kinds["a"].count("checkpoint") == 3 and kinds["a"][-1] == "end"
    assert [e.reason for e in fused if isinstance(e, TaskEnded)] == ["stopped", "stopped", "done"]  # b, c, a
    assert "declined" in kinds["c"]


def test_a_rerun_resumes_each_member_from_its_latest_checkpoint(tmp_path):
    store = CheckpointStore(str(tmp_path / "runs"))
    first = task("a", {"lr": 0.1, **BS}, 5, checkpoints=[2, 5])
    lost = PathRunner(first, store)  # the worker dies after saving step 2
    for events in lost.steps():
        if any(isinstance(e, CheckpointSaved) for e in events):
            break
    tasks = [first, task("b", {"lr": 0.02, **BS}, 5, checkpoints=[5], node=10)]
    reference_store = CheckpointStore(str(tmp_path / "reference"))
    for one in tasks:
        PathRunner(one, reference_store).run()
    runner = FusedPathRunner(tasks, store)
    fused = runner.run()
    assert len(runner.cohorts) == 2  # a at step 2, b at step 0
    loads = [e for e in fused if isinstance(e, StateLoaded)]
    assert [(e.task, e.step, e.origin) for e in loads] == [("a", 2, "storage")]
    # the checkpoint at 2 carries the metrics of steps 1 and 2, sent with it before step 3's:
    # the coordinator that never heard of it (the worker died first) gets the whole curve
    resumed = [(e.kind, e.step) for e in of(fused, "a") if isinstance(e, MetricsReported | CheckpointSaved)]
    assert resumed[:3] == [("metrics", 1), ("metrics", 2), ("checkpoint", 2)]
    assert metrics(of(fused, "a")) == dt.run_alone(TinyMLP, {"lr": 0.1, **BS}, 5)
    assert metrics(of(fused, "b")) == dt.run_alone(TinyMLP, {"lr": 0.02, **BS}, 5)


CONFIGS = [
    {"lr": 0.02, "momentum": 0.9, **BS},
    {"lr": dt.MultiStep(0.05, [2], 0.1), "momentum": 0.5, **BS},
    {"lr": 0.1, "momentum": 0.0, "weight_decay": 1e-3, **BS},
    {"lr": 0.01, "momentum": dt.Steps([0.0, 0.9], [1]), **BS},
    {"lr": 1e30, **BS},  # diverges to NaN and must not disturb anyone
]
ENDS = [4, 2, 3, 4, 3]


@pytest.fixture(scope="module")
def alone():
    """Each config trained alone through the fused path (the reference)."""
    return [dt.run_alone(TinyCNN, config, end, fused=True) for config, end in zip(CONFIGS, ENDS)]


@pytest.mark.parametrize(
    "members",
    [[0], [3, 1], [0, 1, 2], [4, 3, 2, 1, 0], [2, 4, 0]],
    ids=lambda m: "k" + "".join(map(str, m)),
)
def test_a_member_trains_as_alone_whatever_its_group_position_and_partners(members, alone):
    tasks = [task(f"t{i}", CONFIGS[i], ENDS[i], cls=TinyCNN, node=10 * i) for i in members]
    events = FusedPathRunner(tasks, None).run()
    for i in members:
        assert same_state(metrics(of(events, f"t{i}")), alone[i])  # members leave at their own ends


def test_fused_checkpoints_resume_unfused_and_the_reverse(tmp_path):
    store = CheckpointStore(str(tmp_path / "runs"))
    configs = {key: {"lr": lr, **BS} for key, lr in (("a", 0.1), ("b", 0.05), ("c", 0.02))}
    kwargs = {"dropout": 0.3}
    head = [
        task(key, configs[key], 2, checkpoints=[2], kwargs=kwargs, node=10 * i) for i, key in enumerate("ab")
    ]
    head_events = FusedPathRunner(head, store).run()  # a and b fused up to step 2
    c_head = task("c", configs["c"], 2, checkpoints=[2], kwargs=kwargs, node=20)
    c_events = PathRunner(c_head, store).run()  # c unfused up to step 2
    tail = {
        key: task(
            key + "2", configs[key], 5, start=2, source=(NODES[10 * i], 2), kwargs=kwargs, node=10 * i + 1
        )
        for i, key in enumerate("abc")
    }
    a_tail = PathRunner(tail["a"], store).run()  # a fused checkpoint, resumed unfused
    bc_tail = FusedPathRunner([tail["b"], tail["c"]], store).run()  # fused and unfused checkpoints, fused
    expected = {key: dt.run_alone(TinyMLP, configs[key], 5, kwargs) for key in "abc"}
    assert metrics(of(head_events, "a")) + metrics(a_tail) == expected["a"]
    assert metrics(of(head_events, "b")) + metrics(of(bc_tail, "b2")) == expected["b"]
    assert metrics(c_events) + metrics(of(bc_tail, "c2")) == expected["c"]
    assert dt.run_alone(TinyMLP, configs["a"], 5, kwargs, fused=True) == expected["a"]


def test_cnn_fused_checkpoints_resume_fused_exactly(tmp_path):
    store = CheckpointStore(str(tmp_path / "runs"))
    head = [task(f"h{i}", CONFIGS[i], 2, checkpoints=[2], cls=TinyCNN, node=10 * i) for i in (0, 1)]
    head_events = FusedPathRunner(head, store).run()
    tail = [
        task(f"t{i}", CONFIGS[i], 4, start=2, source=(NODES[10 * i], 2), cls=TinyCNN, node=10 * i + 1)
        for i in (1, 0)
    ]
    tail_events = FusedPathRunner(tail, store).run()
    for i in (0, 1):
        expected = dt.run_alone(TinyCNN, CONFIGS[i], 4, fused=True)
        assert metrics(of(head_events, f"h{i}")) + metrics(of(tail_events, f"t{i}")) == expected


def test_members_whose_states_differ_train_as_separate_cohorts(tmp_path):
    """Two siblings at step 2 whose RNG states differ (one drew dropout masks for more, smaller
    batches): each stays exactly what it is alone."""
    store = CheckpointStore(str(tmp_path / "runs"))
    kwargs = {"dropout": 0.3}
    configs = {
        "a": {"lr": 0.1, "batch_size": dt.Steps([16, 32], [2])},
        "b": {"lr": 0.05, "batch_size": 32},
    }
    for i, key in enumerate("ab"):
        PathRunner(task(key, configs[key], 2, checkpoints=[2], kwargs=kwargs, node=10 * i), store).run()
    tails = [
        task(key + "2", configs[key], 5, start=2, source=(NODES[10 * i], 2), kwargs=kwargs, node=10 * i + 1)
        for i, key in enumerate("ab")
    ]
    runner = FusedPathRunner(tails, store)
    events = runner.run()
    assert len(runner.cohorts) == 2
    for key in "ab":
        assert metrics(of(events, key + "2")) == dt.run_alone(TinyMLP, configs[key], 5, kwargs)[2:]


def test_a_corrupt_source_ends_only_its_member(tmp_path):
    store = CheckpointStore(str(tmp_path / "runs"))
    heads = [task(key, {"lr": 0.1, **BS}, 2, checkpoints=[2], node=10 * i) for i, key in enumerate("ab")]
    FusedPathRunner(heads, store).run()
    (data,) = Path(tmp_path / "runs" / IDENTITY / "checkpoints" / NODES[0]).glob("*/state-*.pt")
    data.write_bytes(data.read_bytes()[:-10] + b"0123456789")
    tails = [
        task(key + "2", {"lr": 0.1, **BS}, 4, start=2, source=(NODES[10 * i], 2), node=10 * i + 1)
        for i, key in enumerate("ab")
    ]
    events = FusedPathRunner(tails, store).run()
    assert [e.kind for e in of(events, "a2")] == ["corrupt"]
    assert [e.kind for e in of(events, "b2")].count("step") == 2
    assert metrics(of(events, "b2")) == dt.run_alone(TinyMLP, {"lr": 0.1, **BS}, 4)[2:]


class Exploding(TinyMLP):
    """Raises in the loss once hyper-parameter ``explode`` is 1."""

    def apply(self, name, value):
        if name == "explode":
            self.explode = value
        else:
            super().apply(name, value)

    def loss(self, model, batch):
        if self.explode:
            raise RuntimeError("exploded")
        return super().loss(model, batch)


def test_a_failing_step_ends_every_member_still_training_with_an_error():
    config = {"lr": 0.1, "explode": dt.Steps([0, 1], [2]), **BS}
    tasks = [
        task("a", config, 4, cls=Exploding),
        task("b", {**config, "lr": 0.2}, 4, cls=Exploding, node=10),
        task("c", config, 1, cls=Exploding, node=20),
    ]
    events = FusedPathRunner(tasks, None).run()
    errors = [e for e in events if isinstance(e, TaskFailed)]
    assert [(e.task, e.step) for e in errors] == [("a", 3), ("b", 3)]
    assert "RuntimeError: exploded" in errors[0].error
    assert [e.kind for e in of(events, "c")][-1] == "end"  # c had left before


@pytest.mark.parametrize(
    "other, reason",
    [
        (task("b", {"lr": 0.1, "batch_size": 16}, 3), "'batch_size' differs at step 0"),
        (task("b", {"lr": 0.1, "dropout": 0.2, **BS}, 3), r"\['dropout'\] are set for one only"),
        (task("b", {"lr": 0.1, **BS}, 3, kwargs={"hidden": 32}), "different trainers"),
        (task("b", {"lr": 0.1, **BS}, 3, seed=1), "different trainers"),
        (task("b", {"lr": 0.1, **BS}, 5, start=2, source=(NODES[0], 2)), "different steps"),
    ],
    ids=["batch-size", "dropout", "width", "seed", "start"],
)
def test_tasks_that_cannot_be_fused_are_refused(other, reason):
    with pytest.raises(FusionError, match=reason):
        FusedPathRunner([task("a", {"lr": 0.2, **BS}, 3), other], None)


def test_only_fusible_trainers_train_fused():
    with pytest.raises(FusionError, match="SyntheticTrainer"):
        dt.run_alone(SyntheticTrainer, {"lr": 0.1}, 3, fused=True)


def test_run_alone_fused_is_run_alone_for_the_mlp():
    for config in CONFIGS[:4]:
        assert dt.run_alone(TinyMLP, config, 3, fused=True) == dt.run_alone(TinyMLP, config, 3)


def test_groups_of_every_order_give_the_same_events(tmp_path):
    """Permuting the members changes nothing but the order of the events in a round."""
    tasks = [task(f"t{i}", CONFIGS[i], ENDS[i], checkpoints=[ENDS[i]], node=10 * i) for i in range(3)]
    reference = fused_events(tasks, CheckpointStore(str(tmp_path / "0")))
    for n, order in enumerate(itertools.permutations(tasks)):
        events = fused_events(list(order), CheckpointStore(str(tmp_path / str(n + 1))))
        for one in tasks:
            assert comparable(of(events, one.key)) == comparable(of(reference, one.key))


class MovesTheDataWhileEvaluating(TinyMLP):
    """Draws a batch from the training data order while evaluating: every later step (of the
    whole fused group, whose data order this is) would see other batches."""

    def evaluate_model(self, model):
        self.batches.next_batch()
        return super().evaluate_model(model)


class LeavesBatchNormStatsChanged(TinyMLP):
    """Updates a buffer of the model while evaluating (a running statistic)."""

    def make_model(self, features, hidden):
        model = super().make_model(features, hidden)
        model.register_buffer("seen", torch.zeros(()))
        return model

    def evaluate_model(self, model):
        model.seen += 1
        return super().evaluate_model(model)


@pytest.mark.parametrize(
    "cls, key",
    [(MovesTheDataWhileEvaluating, "['batches']"), (LeavesBatchNormStatsChanged, "['model']['seen']")],
)
def test_fused_evaluations_are_checked_like_unfused_ones(cls, key):
    config = {"lr": 0.1, **BS}
    with pytest.raises(dt.TrialError, match="run_alone failed at step 1:") as fused:
        dt.run_alone(cls, config, 3, fused=True)
    with pytest.raises(dt.TrialError, match="run_alone failed at step 1:") as unfused:
        dt.run_alone(cls, config, 3)
    for failure in (fused, unfused):
        assert "evaluate() changed the training state" in str(failure.value)
        assert key in str(failure.value)


def test_a_fused_check_names_the_member_being_evaluated_at_its_step():
    tasks = [task("a", {"lr": 0.1, **BS}, 3, cls=MovesTheDataWhileEvaluating)]
    tasks.append(task("b", {"lr": 0.2, **BS}, 3, cls=MovesTheDataWhileEvaluating, node=10))
    tasks = [dataclasses.replace(t, check_evaluate=2) for t in tasks]
    events = FusedPathRunner(tasks, None).run()
    errors = [(e.task, e.step) for e in events if isinstance(e, TaskFailed)]
    assert errors == [("a", 1), ("b", 1)]
    checked = [dataclasses.replace(t, check_evaluate=0) for t in tasks]
    assert not [e for e in FusedPathRunner(checked, None).run() if isinstance(e, TaskFailed)]
