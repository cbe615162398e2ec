"""The coordinator's parts (issue 23): the trial ledger delivers what decisions queued only
after they are applied, so no callback runs inside another; the dispatcher answers events,
matched by type, with values the ledger applies; the typed events cross the Dask wire."""

from __future__ import annotations

import dataclasses

import pytest

from dagtune.algos import Algorithm, Extend, Stop, Submit
from dagtune.config import normalize_config
from dagtune.coordinator._outcomes import MetricsKnown, PointFailed
from dagtune.events import (
    CheckpointCorrupt,
    CheckpointDeclined,
    CheckpointSaved,
    FusionChecked,
    MetricsReported,
    StateLoaded,
    StepDone,
    TaskEnded,
    TaskFailed,
    TaskStarted,
    TrainerWarned,
    from_wire,
    to_wire,
)
from dagtune.records import MetricsPoint
from dagtune.sim import SimulatedExecutor, SyntheticTrainer
from dagtune.study import Study, run_alone

BASE = {"lr": 0.1, "momentum": 0.0, "batch_size": 128}


class Nested(Algorithm):
    """Trains BASE, then on its completion submits trials whose results are all known (its
    prefix), extends one, stops one: each callback records how deep it runs."""

    def __init__(self):
        super().__init__("val_loss", "min")
        self.depth = 0
        self.deepest = 0
        self.calls: list[tuple[str, int, int]] = []

    def _enter(self, what: str, trial, step: int = 0) -> None:
        self.depth += 1
        self.deepest = max(self.deepest, self.depth)
        self.calls.append((what, trial.id, step))

    def start(self, ctx):
        return [Submit(BASE, 6)]

    def on_result(self, trial, step, metrics):
        self._enter("result", trial, step)
        self.depth -= 1

    def on_complete(self, trial):
        self._enter("complete", trial)
        try:
            if trial.id == 0 and trial.steps == 6:  # each of these is known: delivered after this
                return [Submit(BASE, 2), Submit(BASE, 4), Submit(BASE, 3), Extend(0, 8), Stop(2)]
            return None
        finally:
            self.depth -= 1

    def on_end(self, trial):
        self._enter("end", trial)
        self.depth -= 1


def test_known_results_are_delivered_after_the_decision_and_nothing_reenters():
    study = Study(SyntheticTrainer, executor=SimulatedExecutor(2))
    algorithm = Nested()
    result = study.run(algorithm)
    assert algorithm.deepest == 1  # no callback ran inside another
    by_id = study.coordinator.trials
    expected = run_alone(SyntheticTrainer, BASE, 8)
    # the decisions of one callback are all applied before the first known result arrives
    first_nested = algorithm.calls.index(("result", 1, 1))
    assert algorithm.calls[first_nested - 1] == ("complete", 0, 0)
    assert [m for _, m in by_id[1].curve] == expected[:2] and by_id[1].status == "completed"
    assert [m for _, m in by_id[3].curve] == expected[:3] and by_id[3].status == "completed"
    assert by_id[2].status == "stopped" and by_id[2].curve == []  # stopped before its results came
    assert [m for _, m in by_id[0].curve] == expected and by_id[0].status == "completed"
    assert result.report["executed_steps"] == 8  # only the extension trained


def test_the_ledger_queues_a_submission_until_it_is_settled():
    study = Study(SyntheticTrainer, executor=SimulatedExecutor(1))
    study.submit(BASE, 3).result()
    coordinator = study.coordinator
    trial = coordinator.submit(normalize_config(BASE), 2)  # known already
    assert trial.status == "pending" and trial.curve == []
    coordinator.settle()
    assert trial.status == "completed" and [m for _, m in trial.curve] == run_alone(SyntheticTrainer, BASE, 2)


def test_a_trial_interrupted_before_it_is_placed_keeps_nothing_and_resumes():
    """A submission interrupted while its request still waits in the ledger's queue has no
    point yet: nothing is kept for it, and resuming it places its request."""
    study = Study(SyntheticTrainer, executor=SimulatedExecutor(1))
    study.submit(BASE, 3).result()
    coordinator = study.coordinator
    protected, version = coordinator.protected_points(), coordinator.kept.version
    trial = coordinator.submit(normalize_config({**BASE, "lr": 0.2}), 2)
    coordinator.interrupt(trial.id)
    assert trial.node == "" and coordinator.interrupted == {trial.id}
    assert coordinator.protected_points() == protected and coordinator.kept.version == version
    coordinator.resume(trial.id)
    coordinator.settle()
    assert trial.id in coordinator.plan.active[(trial.node, 2)] and not coordinator.interrupted


def test_the_dispatcher_answers_events_with_values():
    study = Study(SyntheticTrainer, executor=SimulatedExecutor(1))
    dispatcher = study.coordinator.dispatcher
    node = study.plan.locate(normalize_config(BASE), 2, create=True)
    metrics = {"val_loss": 1.0}
    known = dispatcher.handle(MetricsReported("t", "a", node, 1, metrics))
    assert known == [MetricsKnown(node, 1, MetricsPoint.of(1, metrics))]  # the point the plan keeps
    assert known[0].metrics is study.plan.point_at(node, 1) and known[0].metrics.as_dict() == metrics
    assert dispatcher.handle(MetricsReported("t", "a", node, 1, metrics)) == []  # known already
    assert dispatcher.handle(StepDone("t", "a", node, 1, 0.5, {})) == []  # a step only counts
    assert dispatcher.executed_steps == 1
    assert dispatcher.handle(StepDone("t", "a", node, 1, 0.5, {})) == []  # delivered twice: once
    assert dispatcher.executed_steps == 1


def test_the_events_of_an_ended_task_count_once_and_only_running_tasks_keep_a_record():
    """A task's events delivered again after its end (its result repeating what was
    streamed) count once; what the dispatcher keeps of them is a set per task still
    running (an ended task is one bit)."""
    study = Study(SyntheticTrainer, executor=SimulatedExecutor(2))
    coordinator = study.coordinator
    dispatcher = coordinator.dispatcher
    trials = [coordinator.submit(normalize_config({**BASE, "lr": lr}), 2) for lr in (0.1, 0.2)]
    coordinator.schedule()
    first, second = sorted(coordinator.running)
    node = trials[0].node
    steps = [StepDone(first, "a", node, step, 0.5, {}) for step in (1, 2)]
    for event in steps:
        dispatcher.handle(event)
    assert dispatcher.executed_steps == 2 and dispatcher.repeats.tasks_followed() == 1
    dispatcher.handle(TaskEnded(first, "a", node, 2, None, "done", 1.0))
    assert first not in coordinator.running and dispatcher.repeats.tasks_followed() == 0
    for event in [*steps, TaskStarted(first, "a", node, 0, None, 0.0)]:  # the result, after the end
        assert dispatcher.handle(event) == []
    assert dispatcher.executed_steps == 2
    dispatcher.handle(StepDone(second, "b", node, 1, 0.5, {}))  # another task's step is new
    assert dispatcher.executed_steps == 3 and dispatcher.repeats.tasks_followed() == 1


def test_a_point_failing_past_the_retries_fails_the_trials_through_the_ledger():
    study = Study(SyntheticTrainer, executor=SimulatedExecutor(1), max_retries=0)
    coordinator = study.coordinator
    trial = coordinator.submit(normalize_config(BASE), 3)
    coordinator.schedule()  # placed and launched
    (key,) = coordinator.running
    failed = TaskFailed(key, "a", trial.node, 1, None, "RuntimeError: boom", "Traceback: boom")
    outcomes = coordinator.dispatcher.handle(failed)
    assert outcomes == [PointFailed(trial.node, 1, "Traceback: boom", "trainer")]
    assert trial.status == "pending"  # the dispatcher knows no trial
    coordinator.apply(outcomes)
    assert trial.status == "failed" and trial.error == "Traceback: boom" and trial.cause == "trainer"


EVENTS = [
    TaskStarted("t", "a", "n", 0, "w", 1.0),
    StateLoaded("t", "a", "n", 2, "storage"),
    MetricsReported("t", "a", "n", 3, {"val_loss": 0.5}),
    CheckpointSaved("t", "a", "n", 3, 10, "ab"),
    StepDone("t", "a", "n", 3, 0.25, {"loss": 1.0}),
    CheckpointDeclined("t", "a", "n", 2),
    TrainerWarned("t", "a", "n", 1, "UserWarning", "careful", "once"),
    CheckpointCorrupt("t", "a", "n", 2, "w", 2.0, "bad checksum"),
    TaskEnded("t", "a", None, 0, "w", "stopped", 3.0),
    TaskFailed("t", "", "", 0, 4.0, "KilledWorker", lost=True, killed=True),
    FusionChecked("t", "a", "n", 0, "w", 5.0, False, "no vmap rule"),
]


@pytest.mark.parametrize("event", EVENTS, ids=lambda e: type(e).__name__)
def test_every_event_crosses_the_wire_unchanged_and_is_frozen(event):
    wire = to_wire(event)
    assert wire["kind"] == event.kind and isinstance(wire, dict)
    assert from_wire(wire) == event and type(from_wire(wire)) is type(event)
    with pytest.raises(dataclasses.FrozenInstanceError):
        event.step = 9


def test_an_unknown_kind_is_refused_by_name():
    with pytest.raises(ValueError, match="not a task event: kind 'teleport'"):
        from_wire({"kind": "teleport", "task": "t"})


def test_ids_by_node_hold_one_id_bare_and_forget_an_emptied_node():
    """`IdsByNode` (the ledger's watchers) answers as a set per node would,
    holding a lone id without a set and forgetting a node whose last id went."""
    from dagtune.coordinator._ids import IdsByNode

    ids, model = IdsByNode(), {}
    steps = [("a", 1), ("a", 1), ("a", 2), ("b", 3), ("a", 1), ("a", 2), ("b", 3), ("b", 4), ("c", 5)]
    for i, (node, trial) in enumerate(steps):
        if i in (4, 5, 6):
            ids.discard(node, trial)
            model.get(node, set()).discard(trial)
        else:
            ids.add(node, trial)
            model.setdefault(node, set()).add(trial)
        model = {n: s for n, s in model.items() if s}
        assert {n: set(ids.get(n)) for n in "abcd" if ids.get(n)} == model
        assert len(ids) == len(model)
    ids.discard("zz", 1)  # nothing there: nothing happens
    assert ids.get("a") == () and ids.get("b") == (4,) and len(ids) == 2
