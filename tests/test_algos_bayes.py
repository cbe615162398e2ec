"""Model-based algorithms: the space introspection they share, BayesOpt and the Optuna adapter."""

from __future__ import annotations

import sys

import numpy as np
import pytest

import dagtune as dt
from dagtune.algos import RandomSearch
from dagtune.algos._bayes import BayesOpt, _copula, expected_improvement
from dagtune.algos._params import CATEGORICAL, CONTINUOUS, INT, LOG, ParamSpace
from dagtune.records import COMPLETED, DIVERGED, STOPPED
from dagtune.sim import SimulatedExecutor, SyntheticTrainer
from dagtune.study import Study

# lr, momentum and a batch size that trades noise for progress; large lrs diverge
SPACE = {
    "lr": dt.loguniform(1e-3, 3.0),
    "momentum": dt.uniform(0.0, 0.95),
    "batch_size": dt.choice([32, 128, 512]),
}
SEEDS = range(10)
STEPS, TRIALS = 30, 16


def sim_study(seed: int = 0) -> Study:
    return Study(SyntheticTrainer, executor=SimulatedExecutor(4), seed=seed)


def final(res) -> float:
    return res.best.metrics["val_loss"]


@pytest.fixture(scope="module")
def bayes_runs():
    """BayesOpt without early stopping on every seed (shared by two comparisons)."""
    return [
        sim_study(s).run(BayesOpt(SPACE, "val_loss", "min", steps=STEPS, n=TRIALS, seed=s)) for s in SEEDS
    ]


# --------------------------------------------------------------------------- space introspection

TEMPLATE = dt.Random(
    {
        "lr": dt.Warmup(dt.randint(1, 5), dt.MultiStep(dt.loguniform(1e-3, 1e-1), [30, 45], 0.1)),
        "momentum": dt.uniform(0.0, 0.9),
        "bs": dt.choice([64, 128]),
        "opt": dt.choice(
            [dt.Constant(0.1), dt.Piecewise((0, 0.2), (5, dt.Exponential(dt.uniform(0.1, 1.0), 0.9)))]
        ),
        "wd": 1e-4,
    }
)


def test_params_are_listed_with_stable_paths_and_kinds():
    params = ParamSpace(TEMPLATE, "Test").params
    assert [(p.path, p.kind) for p in params] == [
        ("bs", CATEGORICAL),
        ("lr.steps", INT),
        ("lr.then.init", LOG),
        ("momentum", CONTINUOUS),
        ("opt", CATEGORICAL),
        ("opt[1].items[1][1].init", CONTINUOUS),
    ]
    assert params[1].low == 1 and params[1].high == 5
    assert params[0].choices == (64, 128)
    assert params[4].choices == (0, 1)  # options that are sequences are named by index


def test_a_config_is_built_from_chosen_values():
    space = ParamSpace(TEMPLATE, "Test")
    values = {
        "bs": 1,
        "lr.steps": 3,
        "lr.then.init": 0.01,
        "momentum": 0.5,
        "opt": 1,
        "opt[1].items[1][1].init": 0.5,
    }
    assert space.config(values) == {
        "bs": dt.Constant(128),
        "lr": dt.Warmup(3, dt.MultiStep(0.01, [30, 45], 0.1)),
        "momentum": dt.Constant(0.5),
        "opt": dt.Piecewise((0, 0.2), (5, dt.Exponential(0.5, 0.9))),
        "wd": dt.Constant(1e-4),
    }
    assert space.config({**values, "opt": 0})["opt"] == dt.Constant(0.1)  # the inactive value is ignored


def test_unit_cube_encoding_round_trips_and_samples_like_random():
    space = ParamSpace(TEMPLATE, "Test")
    points = space.sample_unit(np.random.default_rng(0), 4000)
    assert points.shape == (4000, space.dims) == (4000, 8)
    for point in points[:50]:
        values = space.decode(point)
        assert space.decode(space.encode(values)) == pytest.approx(values)
    decoded = [space.decode(p) for p in points]
    lrs = np.log10([v["lr.then.init"] for v in decoded])
    assert lrs.min() >= -3 and lrs.max() <= -1 and abs(np.median(lrs) + 2) < 0.05  # log-uniform
    assert sorted({v["lr.steps"] for v in decoded}) == [1, 2, 3, 4]  # randint excludes high
    assert abs(np.mean([v["bs"] for v in decoded]) - 0.5) < 0.03


def test_param_space_rejects_spaces_without_distributions():
    with pytest.raises(ValueError, match=r"Test\.space has no distribution to tune"):
        ParamSpace({"lr": 0.1, "bs": dt.Constant(128)}, "Test")
    with pytest.raises(ValueError, match=r"Test\.space must be a dt\.Random or a dict"):
        ParamSpace([0.1, 0.2], "Test")
    with pytest.raises(ValueError, match=r"write dt\.choice"):
        ParamSpace({"lr": [0.1, 0.2]}, "Test")


# --------------------------------------------------------------------------- BayesOpt


def test_bayesopt_beats_random_search_on_average(bayes_runs):
    bayes = [final(res) for res in bayes_runs]
    random = [
        final(
            sim_study(s).run(RandomSearch(dt.Random(SPACE, seed=s), "val_loss", "min", steps=STEPS, n=TRIALS))
        )
        for s in SEEDS
    ]
    print(f"\nbest val_loss after {TRIALS} trials of {STEPS} steps, mean over {len(SEEDS)} seeds:")
    print(f"  BayesOpt     {np.mean(bayes):.4f}  {np.round(bayes, 4).tolist()}")
    print(f"  RandomSearch {np.mean(random):.4f}  {np.round(random, 4).tolist()}")
    assert np.mean(bayes) < np.mean(random)
    assert sum(b < r for b, r in zip(bayes, random)) >= 6


def test_early_stopping_saves_steps_at_similar_quality(bayes_runs):
    # the steps early stopping saves pay for half as many trials again
    more = TRIALS * 3 // 2
    stopped = [
        sim_study(s).run(
            BayesOpt(
                SPACE, "val_loss", "min", steps=STEPS, n=more, seed=s, early_stopping="asha", min_steps=4
            )
        )
        for s in SEEDS
    ]
    full_steps = np.mean([res.report["executed_steps"] for res in bayes_runs])
    asha_steps = np.mean([res.report["executed_steps"] for res in stopped])
    full_loss = np.mean([final(res) for res in bayes_runs])
    asha_loss = np.mean([final(res) for res in stopped])
    print(
        f"\nBayesOpt, {TRIALS} trials:        {full_steps:.0f} executed steps, best val_loss {full_loss:.4f}"
    )
    print(f"BayesOpt + ASHA, {more} trials: {asha_steps:.0f} executed steps, best val_loss {asha_loss:.4f}")
    assert asha_steps < 0.8 * full_steps
    assert asha_loss < 1.1 * full_loss
    statuses = {t for res in stopped for t in res.trials["status"]}
    assert STOPPED in statuses and COMPLETED in statuses


class RecordingBayesOpt(BayesOpt):
    """BayesOpt that records the rung results it saw, in order."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.seen: list[tuple[int, int, float]] = []

    def on_result(self, trial, step, metrics):
        if step in self.rungs:
            self.seen.append((step, trial.id, self.score(metrics)))
        return super().on_result(trial, step, metrics)


def test_asha_stops_a_trial_below_the_top_third_of_its_rung():
    algo = RecordingBayesOpt(SPACE, "val_loss", "min", steps=30, n=12, early_stopping="asha", min_steps=2)
    assert algo.rungs == (2, 6, 18)
    sim_study().run(algo)
    recorded: dict[int, list[float]] = {rung: [] for rung in algo.rungs}
    expected = {}
    for step, trial_id, score in algo.seen:  # the rule, replayed
        recorded[step].append(score)
        if score < np.quantile(recorded[step], 2 / 3):
            expected[trial_id] = step
    stopped = {t.id: t.reported for t in algo.trials if t.status == STOPPED}
    assert stopped == expected and stopped
    assert all(t.steps == 30 for t in algo.trials if t.status == COMPLETED)


def test_bayesopt_is_deterministic_and_keeps_every_slot_busy():
    def run():
        algo = BayesOpt(SPACE, "val_loss", "min", steps=10, n=10, seed=5, n_initial=4)
        return algo, sim_study().run(algo)

    (a, res_a), (b, res_b) = run(), run()
    assert sum(t.submitted_at == 0 for t in a.trials) == 4  # one trial per slot from the start
    assert [t.config for t in a.trials] == [t.config for t in b.trials]
    assert len(a.trials) == 10 and res_a.best.metrics == res_b.best.metrics


def test_bayesopt_honours_where_and_categoricals():
    space = dt.Random(SPACE, where=lambda c: c["momentum"] < 0.5)
    algo = BayesOpt(space, "val_acc", "max", steps=5, n=12, seed=1, n_initial=4)
    sim_study().run(algo)
    assert all(t.config["momentum"](0) < 0.5 for t in algo.trials)
    assert {t.config["batch_size"](0) for t in algo.trials} <= {32, 128, 512}


def test_the_model_ranks_completed_above_stopped_above_diverged():
    keys = [(2, -0.5), (0,), (1, 0, -3.0), (2, -0.1), (1, 1, -9.0), (0,)]
    y = _copula(keys)
    order = np.argsort(y, kind="stable")
    assert list(order) == [1, 5, 2, 4, 0, 3]
    assert y[1] == y[5]  # ties share a rank
    ei = expected_improvement(np.array([0.0, 1.0, 1.0]), np.array([1.0, 1.0, 2.0]), best=0.5)
    assert (ei > 0).all() and ei[0] < ei[1] < ei[2]


def test_diverged_trials_count_as_the_worst():
    space = {"lr": dt.loguniform(0.3, 30.0), "momentum": dt.uniform(0.0, 0.95)}  # mostly diverging
    algo = BayesOpt(space, "val_loss", "min", steps=40, n=10, seed=0, n_initial=3)
    res = sim_study().run(algo)
    diverged = [t for t in algo.trials if t.status == DIVERGED]
    assert diverged and res.best.status == COMPLETED
    assert all(algo._outcomes[t.tag] == (0,) for t in diverged)


def test_bayesopt_checks_the_metric():
    with pytest.raises(ValueError, match="'accuracy' is not among the reported metrics"):
        sim_study().run(BayesOpt(SPACE, "accuracy", "max", steps=3, n=2))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"steps": 0}, "BayesOpt.steps must be a positive int, got 0"),
        ({"n": 2.0}, "BayesOpt.n must be a positive int, got 2.0"),
        ({"n_initial": -1}, "BayesOpt.n_initial must be a positive int, got -1"),
        ({"candidates": 0}, "BayesOpt.candidates must be a positive int, got 0"),
        ({"seed": None}, "BayesOpt.seed must be an int, got None"),
        ({"early_stopping": "hyperband"}, "BayesOpt.early_stopping must be None or 'asha', got 'hyperband'"),
        ({"eta": 1}, "BayesOpt.eta must be an int >= 2, got 1"),
        ({"early_stopping": "asha", "min_steps": 10}, "BayesOpt.min_steps must be less than steps=10"),
        ({"xi": -0.1}, "BayesOpt.xi must be a number >= 0, got -0.1"),
        ({"mode": "best"}, "mode must be 'max' or 'min', got 'best'"),
        ({"space": {"lr": 0.1}}, "BayesOpt.space has no distribution to tune"),
    ],
)
def test_bayesopt_validates_its_arguments(kwargs, message):
    arguments = {"space": SPACE, "metric": "val_loss", "mode": "min", "steps": 10, **kwargs}
    with pytest.raises(ValueError, match=message):
        BayesOpt(**arguments)


# --------------------------------------------------------------------------- Optuna


def test_optuna_sampler_says_how_to_install_optuna(monkeypatch):
    from dagtune.algos._optuna import OptunaSampler

    monkeypatch.setitem(sys.modules, "optuna", None)  # import optuna now raises ImportError
    with pytest.raises(ImportError, match=r"pip install 'dagtune\[optuna\]'"):
        OptunaSampler(SPACE, "val_loss", "min", steps=5)


def test_optuna_tpe_runs_end_to_end():
    optuna = pytest.importorskip("optuna")
    from dagtune.algos._optuna import OptunaSampler

    space = {**SPACE, "lr": dt.MultiStep(dt.loguniform(1e-3, 3.0), [20], 0.1), "warmup": dt.randint(1, 4)}
    algo = OptunaSampler(space, "val_loss", "min", steps=STEPS, n=24, seed=0)
    dists = algo._distributions
    assert dists["lr.init"] == optuna.distributions.FloatDistribution(1e-3, 3.0, log=True)
    assert dists["warmup"] == optuna.distributions.IntDistribution(1, 3)
    assert dists["batch_size"] == optuna.distributions.CategoricalDistribution((32, 128, 512))
    res = sim_study().run(algo)
    states = [t.state.name for t in algo.study.trials]
    print(f"\nOptuna TPE: best val_loss {final(res):.4f}, states {states}")
    assert len(states) == 24 and set(states) <= {"COMPLETE", "PRUNED"}
    assert algo.study.best_value == pytest.approx(final(res))
    assert final(res) < 0.05
    trial = algo.study.best_trial
    assert set(trial.intermediate_values) == set(range(1, STEPS + 1))  # every step was reported
    for t in algo.trials:  # a diverged trial is told PRUNED, a completed one COMPLETE
        told = algo.study.trials[t.tag].state.name
        assert told == ("COMPLETE" if t.status == COMPLETED else "PRUNED")


def test_optuna_diverged_trials_are_told_pruned_and_runs_repeat():
    pytest.importorskip("optuna")
    from dagtune.algos._optuna import OptunaSampler

    space = {"lr": dt.loguniform(0.3, 30.0), "momentum": dt.uniform(0.0, 0.95)}  # mostly diverging

    def run():
        algo = OptunaSampler(space, "val_loss", "min", steps=40, n=8, seed=2)
        sim_study().run(algo)
        return algo

    a, b = run(), run()
    assert [t.config for t in a.trials] == [t.config for t in b.trials]
    diverged = [t for t in a.trials if t.status == DIVERGED]
    assert diverged
    assert all(a.study.trials[t.tag].state.name == "PRUNED" for t in diverged)
    assert all(a.study.trials[t.tag].state.name == "COMPLETE" for t in a.trials if t.status == COMPLETED)


def test_optuna_pruner_stops_trials_early():
    optuna = pytest.importorskip("optuna")
    from dagtune.algos._optuna import OptunaSampler

    def run(pruner):
        algo = OptunaSampler(SPACE, "val_loss", "min", steps=STEPS, n=20, seed=1, pruner=pruner)
        return algo, sim_study().run(algo)

    _, full = run(None)
    algo, pruned = run(optuna.pruners.MedianPruner(n_startup_trials=4, n_warmup_steps=4))
    states = [t.state.name for t in algo.study.trials]
    print(
        f"\nOptuna TPE + MedianPruner: {pruned.report['executed_steps']} executed steps "
        f"(without pruning {full.report['executed_steps']}), {states.count('PRUNED')} pruned"
    )
    assert "PRUNED" in states
    assert pruned.report["executed_steps"] < full.report["executed_steps"]
    for t in algo.trials:
        if algo.study.trials[t.tag].state.name == "PRUNED":
            assert t.status == DIVERGED or (t.status == STOPPED and t.reported < STEPS)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"steps": -1}, "OptunaSampler.steps must be a positive int, got -1"),
        ({"n": 0}, "OptunaSampler.n must be a positive int, got 0"),
        ({"sampler": "tpe"}, "OptunaSampler.sampler must be an optuna sampler, got 'tpe'"),
        ({"pruner": 3}, "OptunaSampler.pruner must be an optuna pruner, got 3"),
        ({"seed": 1.5}, "OptunaSampler.seed must be an int, got 1.5"),
    ],
)
def test_optuna_sampler_validates_its_arguments(kwargs, message):
    pytest.importorskip("optuna")
    from dagtune.algos._optuna import OptunaSampler

    with pytest.raises(ValueError, match=message):
        OptunaSampler(**{"space": SPACE, "metric": "val_loss", "mode": "min", **kwargs})
