"""A step's metrics kept compact (`MetricsPoint`, issue 24): what the plan and its trials hold
per point, while `Trial.metrics` and `Trial.curve` read exactly as the dicts reported."""

from __future__ import annotations

import json
import pickle

import dagtune as dt
from dagtune.algos import GridSearch
from dagtune.records import MetricsPoint, Trial
from dagtune.sim import SimulatedExecutor, SyntheticTrainer
from dagtune.study import Study

SPACE = [{"lr": dt.Constant(lr), "momentum": dt.Constant(0.9)} for lr in (0.1, 0.05)]


def test_a_point_shares_its_names_and_gives_back_the_dict_reported():
    reported = {"val_loss": 0.5, "loss": 0.25, "val_acc": 0.75}
    point, other = MetricsPoint.of(3, reported), MetricsPoint.of(4, dict(reported))
    assert point.names is other.names  # one names tuple for every point reporting them
    assert point.step == 3 and point.as_dict() == reported and point.as_dict() is not point.as_dict()
    assert list(point.as_dict()) == list(reported)  # in the order reported
    assert all(a is b for a, b in zip(point.values(), reported.values()))  # the very values
    assert point.get("loss") == 0.25 and point.get("missing") is None and point.get("missing", 1.0) == 1.0
    assert point.same({"loss": 0.25, "val_acc": 0.75, "val_loss": 0.5}) and not point.same({"loss": 0.25})
    copy = pickle.loads(pickle.dumps(point))
    assert type(copy) is MetricsPoint and copy == point and copy.as_dict() == reported


def test_a_trials_metrics_and_curve_read_as_dicts_and_lists():
    trial = Trial(0, {"lr": dt.Constant(0.1)}, 2)
    assert trial.metrics is None and trial.curve == [] and "metrics=None" in repr(trial)
    trial.curve, trial.reported = [(1, {"loss": 1.0}), (2, {"loss": 0.5})], 2
    trial.metrics = {"loss": 0.5}
    assert (
        type(trial.metrics) is dict and trial.metrics == {"loss": 0.5} and trial.last == (2, ("loss",), 0.5)
    )
    assert type(trial.curve) is list and trial.curve == [(1, {"loss": 1.0}), (2, {"loss": 0.5})]
    assert json.dumps(trial.metrics) == '{"loss": 0.5}'
    assert "metrics={'loss': 0.5}, reported=2, curve=[(1, {'loss': 1.0}), (2, {'loss': 0.5})]" in repr(trial)
    snapshot = trial.snapshot()
    assert dict(snapshot.metrics) == {"loss": 0.5} and snapshot.curve == (
        (1, {"loss": 1.0}),
        (2, {"loss": 0.5}),
    )
    assert snapshot.points == tuple(trial.points) and snapshot.points[0] is trial.points[0]  # nothing copied
    assert (
        "metrics=mappingproxy({'loss': 0.5}), reported=2, curve=((1, {'loss': 1.0}), (2, {'loss': 0.5}))"
        in repr(snapshot)
    )


def test_trials_keep_the_plans_points_and_read_what_was_reported():
    study = Study(SyntheticTrainer, executor=SimulatedExecutor(2))
    seen: list[tuple[int, int, dict]] = []

    class Watching(GridSearch):
        def on_result(self, trial, step, metrics):
            seen.append((trial.id, step, metrics))
            assert metrics == trial.metrics and type(metrics) is dict
            return super().on_result(trial, step, metrics)

    study.run(Watching(SPACE, metric="val_loss", mode="min", steps=3))
    plan = study.plan
    for trial in study.coordinator.trials.values():
        assert all(point is plan.point_at(trial.node, point.step) for point in trial.points)  # shared
        assert trial.last is trial.points[-1] and trial.metrics == trial.curve[-1][1]
        assert trial.curve == [(s, m) for i, s, m in seen if i == trial.id]
        assert trial.curve == plan.curve(trial.node, trial.steps)
        assert json.loads(json.dumps(trial.metrics)) == trial.metrics
