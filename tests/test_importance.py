"""The importance of each hyper-parameter for a finished study, in the `Result` and on the page."""

from __future__ import annotations

import logging
import sys

import pytest

import dagtune as dt
from dagtune.algos import GridSearch
from dagtune.checkpoints import CheckpointStore
from dagtune.dashboard import snapshot as snapshots
from dagtune.dashboard.figures import StudyView, importance_html
from dagtune.dashboard.snapshot import live_snapshot, result_snapshot, stored_snapshot
from dagtune.importance import hyperparameter_importance, method_of
from dagtune.sim import SimulatedExecutor, SyntheticTrainer

optuna = pytest.importorskip("optuna")

# lr moves the loss a lot, momentum less, "tag" (a string the trainer ignores) not at all
SPACE = dt.Grid(
    {
        "lr": [0.3, 0.1, 0.03, 0.01, dt.MultiStep(0.1, [3], 0.1)],
        "momentum": [0.0, 0.5],
        "tag": ["a", "b"],
        "weight_decay": [0.0],
    }
)


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("importance"))
    executor = SimulatedExecutor(4, store=CheckpointStore(path))
    with dt.Study(SyntheticTrainer, name="imp", storage=path, executor=executor) as study:
        yield study.run(GridSearch(SPACE, metric="val_loss", mode="min", steps=8)), path, study


def test_the_hyper_parameters_that_move_the_metric_come_first(result):
    result, *_ = result
    scores = result.importance()
    assert list(scores) == ["lr", "momentum", "tag", "weight_decay"]
    assert sum(scores.values()) == pytest.approx(1.0)
    assert scores["lr"] > 0.5 and scores["tag"] < 0.05 and scores["weight_decay"] == 0.0  # one value
    assert result.importance() == scores  # reproducible (seeded)
    other = result.importance(evaluator=optuna.importance.PedAnovaImportanceEvaluator())
    assert set(other) == set(scores) and sum(other.values()) == pytest.approx(1.0)


def test_without_optuna_a_random_forest_stands_in_and_says_so(result, monkeypatch, caplog):
    result, *_ = result
    monkeypatch.setitem(sys.modules, "optuna", None)  # import optuna now fails
    with caplog.at_level(logging.WARNING, logger="dagtune"):
        scores = result.importance()
    assert "optuna is not installed" in caplog.text and "random-forest" in caplog.text
    assert next(iter(scores)) == "lr" and sum(scores.values()) == pytest.approx(1.0)
    with pytest.raises(ImportError, match="needs optuna"):
        result.importance(evaluator=object())


def test_too_few_trials_is_a_clear_error():
    study = dt.Study(SyntheticTrainer, executor=SimulatedExecutor(1))
    one = study.run(GridSearch([{"lr": 0.1}], metric="val_loss", mode="min", steps=2))
    with pytest.raises(ValueError, match="at least 2 completed trials with 'val_loss', there are 1"):
        one.importance()
    with pytest.raises(ValueError, match=r"no metric 'nope'|at least 2"):
        one.importance("nope")


def test_the_page_shows_the_importance_of_a_finished_study(result, monkeypatch):
    result, path, study = result
    snapshot = result_snapshot(result, "imp", importance=True)
    assert result_snapshot(result, "imp")["importance"] is None  # the notebook views go without
    found = snapshot["importance"]
    assert found["names"][0] == "lr" and found["method"] == "fANOVA (optuna)"
    assert found["values"] == pytest.approx(list(result.importance().values()))
    view = StudyView()
    view.update(snapshot)
    assert "Importance of each hyper-parameter for val_loss" in view.importance.text
    assert view.importance.text == importance_html(snapshot) and "<td>lr</td>" in view.importance.text
    from dagtune.catalog import load_study, open_storage

    stored = stored_snapshot(load_study(open_storage(path), "imp"), "val_loss", "min")
    assert stored["importance"]["names"][0] == "lr"  # `dagtune dashboard STORAGE` shows it too
    live = live_snapshot(study)  # the page of a study still open, its run finished
    assert live["importance"] == found
    monkeypatch.setattr(snapshots, "IMPORTANCE_TRIALS", 8)  # a huge study: scored on a sample
    sampled = live_snapshot(study)["importance"]
    assert sampled["method"] == "fANOVA (optuna), 8 of 20 trials" and sampled["names"][0] == "lr"


def test_a_hyper_parameter_that_alone_varies_gets_everything_without_an_evaluator():
    """36 learning-rate schedules, nothing else varying: fANOVA's time grows exponentially with
    a category's number of values (22 took 92 s, 26 over 300 s), so the one that varies gets 1 at once."""

    class Counting:
        calls = 0

        def evaluate(self, *args, **kwargs):
            Counting.calls += 1
            raise AssertionError("no evaluator runs when one hyper-parameter varies")

    space = [
        {"lr": dt.MultiStep(2.0**k, [milestone], 0.1), "momentum": 0.9}
        for k in range(-6, 0)
        for milestone in range(1, 7)
    ]
    study = dt.Study(SyntheticTrainer, executor=SimulatedExecutor(4))
    found = study.run(GridSearch(space, metric="val_loss", mode="min", steps=8))
    trials = list(study.coordinator.trials.values())
    assert len(trials) == 36
    assert hyperparameter_importance(trials, "val_loss", "min", evaluator=Counting()) == {
        "lr": 1.0,
        "momentum": 0.0,
    }
    assert found.importance() == {"lr": 1.0, "momentum": 0.0} and Counting.calls == 0


def test_a_category_too_wide_for_fanova_is_scored_by_impurity_and_said_so(monkeypatch):
    """Two hyper-parameters vary, one of them over 18 schedules: fANOVA (exponential in a
    category's values) is not run; Optuna's mean decrease in impurity scores them, and the
    method says why."""
    import optuna

    def refuse(*args, **kwargs):
        raise AssertionError("fANOVA must not run on a category of 18 values")

    monkeypatch.setattr(optuna.importance.FanovaImportanceEvaluator, "evaluate", refuse)
    space = [
        {"lr": dt.MultiStep(2.0**k, [milestone], 0.1), "momentum": momentum}
        for k in range(-6, 0)
        for milestone in range(1, 4)
        for momentum in (0.5, 0.9)
    ]
    study = dt.Study(SyntheticTrainer, executor=SimulatedExecutor(4))
    found = study.run(GridSearch(space, metric="val_loss", mode="min", steps=4))
    trials = list(study.coordinator.trials.values())
    scores = found.importance()
    assert set(scores) == {"lr", "momentum"} and sum(scores.values()) == pytest.approx(1.0)
    method = method_of(trials=trials, metric="val_loss")
    assert method.startswith("mean decrease in impurity") and "18 values" in method
    assert method_of() == "fANOVA (optuna)"
