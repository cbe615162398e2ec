"""SuccessiveHalving, Hyperband and ASHA on the simulated executor: rung sizes and budgets
against the reference formulas, promotions that continue (never restart), and validation."""

from __future__ import annotations

import itertools
import math
import re

import pytest

import dagtune as dt
from dagtune.algos._base import Extend
from dagtune.algos._halving import ASHA, Hyperband, SuccessiveHalving, hyperband_brackets, rung_steps
from dagtune.sim import SimulatedExecutor, SyntheticTrainer
from dagtune.study import Study, run_alone

# distinct constant learning rates: no two trials share a step, so sizes are easy to count
DISTINCT = {"lr": dt.loguniform(0.01, 0.3), "momentum": dt.uniform(0.0, 0.6), "batch_size": 128}

# schedules branching at rung steps (1, 3, 9, 27 for eta=3): trials share prefixes
SHARING = dt.Grid(
    {
        "lr": [
            dt.Constant(0.1),
            dt.MultiStep(0.1, [3, 9], 0.3),
            dt.Constant(0.03),
            dt.Steps([0.03, 0.1], [9]),
        ],
        "momentum": [0.0, dt.Steps([0.0, 0.5], [3])],
        "batch_size": [128, dt.Steps([128, 256], [9])],
    }
)


def sim_study(workers: int = 4) -> Study:
    return Study(SyntheticTrainer, executor=SimulatedExecutor(workers))


def metric_at(trial, step: int, name: str = "val_loss") -> float:
    return dict(trial.curve)[step][name]


def reference_sizes(n: int, eta: int, rungs: int) -> list[int]:
    """Li et al.'s n_k = floor(n / eta**k), keeping at least the best config."""
    return [max(1, n // eta**k) for k in range(rungs)]


@pytest.mark.parametrize(
    ("n", "eta", "min_steps", "max_steps", "rungs"),
    [(27, 3, 1, 27, [1, 3, 9, 27]), (20, 2, 2, 30, [2, 4, 8, 16, 30]), (10, 3, 5, 60, [5, 15, 45, 60])],
)
def test_successive_halving_rungs_match_the_reference(n, eta, min_steps, max_steps, rungs):
    algo = SuccessiveHalving(
        dt.Random(DISTINCT, n=n, seed=n), "val_loss", "min", min_steps=min_steps, max_steps=max_steps, eta=eta
    )
    assert algo.rungs == rungs == rung_steps(min_steps, max_steps, eta)
    report = sim_study().run(algo).report
    sizes = reference_sizes(n, eta, len(rungs))
    assert [sum(t.steps >= r for t in algo.trials) for r in rungs] == sizes
    assert {t.steps for t in algo.trials} <= set(rungs)
    assert all(t.status == "completed" for t in algo.trials)
    budget = sum(size * (r - prev) for size, r, prev in zip(sizes, rungs, [0, *rungs]))
    assert report["trial_steps"] == report["executed_steps"] == report["unique_steps"] == budget
    # the survivors of each rung are its top floor(n_k / eta) by the metric at the rung's step
    for r, survivors in zip(rungs, sizes[1:]):
        rung = [t for t in algo.trials if t.steps >= r]
        ranked = sorted(rung, key=lambda t: (metric_at(t, r), t.id))
        assert {t.id for t in ranked[:survivors]} == {t.id for t in algo.trials if t.steps > r}


def test_successive_halving_shares_prefixes_and_continues_promoted_trials():
    study = sim_study()
    algo = SuccessiveHalving(SHARING, "val_loss", "min", max_steps=27, eta=3)
    report = study.run(algo).report
    assert [sum(t.steps >= r for t in algo.trials) for r in (1, 3, 9, 27)] == [16, 5, 1, 1]
    assert report["executed_steps"] == report["unique_steps"] < report["trial_steps"]
    for trial in algo.trials:
        assert [s for s, _ in trial.curve] == list(range(1, trial.steps + 1))
        assert [m for _, m in trial.curve] == run_alone(SyntheticTrainer, trial.config, trial.steps)


def test_hyperband_docstring_table_is_the_default_brackets():
    rows = re.findall(r"s=(\d):(.*)", Hyperband.__doc__)
    table = [(int(s), [(int(n), int(r)) for n, r in re.findall(r"(\d+)x(\d+)", row)]) for s, row in rows]
    expected = [
        (len(rungs) - 1, [(n // 3**i, r) for i, r in enumerate(rungs)])
        for n, rungs in hyperband_brackets(1, 81, 3)
    ]
    assert table == expected
    assert [n for n, _ in hyperband_brackets(1, 81, 3)] == [81, 34, 15, 8, 5]  # Li et al. 2018, Table 1


def test_hyperband_brackets_match_the_reference():
    eta, max_steps = 3, 27
    algo = Hyperband(dt.Random(DISTINCT, n=None, seed=1), "val_loss", "min", max_steps=max_steps, eta=eta)
    report = sim_study().run(algo).report
    s_max = 3
    budget = 0
    for bracket, s in enumerate(range(s_max, -1, -1)):
        n = math.ceil((s_max + 1) / (s + 1) * eta**s)
        rungs = [max_steps * eta ** (i - s) for i in range(s + 1)]
        trials = [t for t in algo.trials if t.tag == bracket]
        sizes = [n // eta**i for i in range(s + 1)]
        assert [sum(t.steps >= r for t in trials) for r in rungs] == sizes
        budget += sum(size * (r - prev) for size, r, prev in zip(sizes, rungs, [0, *rungs]))
    assert len(algo.trials) == 27 + 12 + 6 + 4
    assert report["trial_steps"] == report["executed_steps"] == report["unique_steps"] == budget


def test_hyperband_brackets_get_fewer_configs_when_a_finite_space_runs_out():
    algo = Hyperband(SHARING, "val_loss", "min", max_steps=9, eta=3)  # wants 9 + 5 + 3 of 16
    assert [len(b.configs) for b in algo.brackets] == [9, 5, 2]
    sim_study().run(algo)
    assert [sum(t.steps == 9 for t in algo.trials if t.tag == b) for b in range(3)] == [1, 1, 2]


class LoggingASHA(ASHA):
    """ASHA that records each rung result and each decision, with the callback that made it
    (``start``, ``on_complete``, ``on_end`` or ``on_idle``), in the order they happened."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.log: list[tuple] = []

    def _logged(self, callback, decisions):
        pending = sum(t.status == "pending" for t in self.trials)
        self.log.extend(("decision", d, callback, pending) for d in decisions)
        return decisions

    def start(self, ctx):
        return self._logged("start", super().start(ctx))

    def on_complete(self, trial):
        self.log.append(("result", trial.id, trial.steps, trial.metrics["val_loss"]))
        return self._logged("on_complete", super().on_complete(trial))

    def on_end(self, trial):
        return self._logged("on_end", super().on_end(trial))

    def on_idle(self, free):
        return self._logged("on_idle", super().on_idle(free))


@pytest.mark.parametrize(
    ("space", "workers"), [(dt.Random(DISTINCT, n=40, seed=4), 4), (SHARING, 4)], ids=["distinct", "sharing"]
)
def test_asha_promotes_the_top_fraction_seen_so_far(space, workers):
    eta = 3
    algo = LoggingASHA(space, "val_loss", "min", max_steps=27, eta=eta)
    sim_study(workers).run(algo)
    rungs = [1, 3, 9, 27]
    seen: dict[int, dict[int, float]] = {r: {} for r in rungs}
    promotions: dict[str, int] = {}
    for entry in algo.log:
        if entry[0] == "result":
            _, trial, steps, loss = entry
            seen[steps][trial] = loss
        elif isinstance(entry[1], Extend):
            _, decision, callback, pending = entry
            rung = rungs[rungs.index(decision.steps) - 1]
            ranked = sorted(seen[rung], key=lambda t: (seen[rung][t], t))
            if len(ranked) // eta:  # the top floor(n / eta) of the results at the rung so far
                assert decision.trial in ranked[: len(ranked) // eta], (callback, decision)
            else:  # too few for a promotion: only the rung's best, once nothing else is left
                assert decision.trial == ranked[0] and pending == 0, (callback, decision)
            promotions[callback] = promotions.get(callback, 0) + 1
    print(f"promotions by callback: {promotions}")
    assert sum(promotions.values()) == sum(
        sum(t.steps > r for t in algo.trials) for r in rungs[:-1]
    )  # every promotion made went through a decision checked above
    if space is SHARING:  # shared prefixes leave workers idle: ASHA promotes there too
        assert promotions.get("on_idle", 0) > 0
    # at the end every trial in a rung's top floor(n / eta) has been promoted
    for lower, upper in itertools.pairwise(rungs):
        ranked = sorted(seen[lower], key=lambda t: (seen[lower][t], t))
        assert all(algo.trials[t].steps >= upper for t in ranked[: len(ranked) // eta])
    assert len(algo.trials) == len(list(space)) and all(t.status == "completed" for t in algo.trials)


def test_asha_promotions_continue_from_checkpoints_and_share_prefixes():
    study = sim_study()
    algo = ASHA(SHARING, "val_loss", "min", max_steps=27, eta=3)
    report = study.run(algo).report
    assert report["executed_steps"] == report["unique_steps"] < report["trial_steps"]
    promoted = [t for t in algo.trials if t.steps > 1]
    assert promoted
    for trial in algo.trials:
        assert [s for s, _ in trial.curve] == list(range(1, trial.steps + 1))
        assert [m for _, m in trial.curve] == run_alone(SyntheticTrainer, trial.config, trial.steps)


# schedules branching *between* rungs (at 2, 5, 7 and 13 for rungs 1, 3, 9, 27): a trial
# promoted past such a step before the config branching there is even submitted must leave a
# checkpoint behind, or that config's own promotion later retrains the shared steps
BETWEEN_RUNGS = dt.Grid(
    {
        "lr": [
            dt.Steps([0.1, 0.05], [7]),
            dt.Constant(0.1),
            dt.Steps([0.1, 0.05], [13]),
            dt.Steps([0.2, 0.02], [7]),
            dt.Steps([0.02, 0.2], [7]),
            dt.Steps([0.03, 0.05], [5]),
        ],
        "momentum": [0.0, dt.Steps([0.0, 0.5], [5]), dt.Steps([0.0, 0.9], [2])],
    }
)


class WithoutProspects(ASHA):
    def prospects(self):
        return ()


@pytest.mark.parametrize("workers", [1, 3])
def test_asha_trains_nothing_twice_when_configs_branch_between_rungs(workers):
    algo = ASHA(BETWEEN_RUNGS, "val_loss", "min", max_steps=27, eta=3)
    assert algo.prospects() == list(BETWEEN_RUNGS)  # nothing submitted yet: the whole space
    report = sim_study(workers).run(algo).report
    print(
        f"{workers} workers: trial/unique/executed {report['trial_steps']}/{report['unique_steps']}/"
        f"{report['executed_steps']}"
    )
    assert report["executed_steps"] == report["unique_steps"] < report["trial_steps"]
    assert max(t.steps for t in algo.trials) == 27
    for trial in algo.trials:
        assert [m for _, m in trial.curve] == run_alone(SyntheticTrainer, trial.config, trial.steps)
    # the same run without prospects recomputes: the test above could fail
    baseline = sim_study(workers).run(WithoutProspects(BETWEEN_RUNGS, "val_loss", "min", max_steps=27, eta=3))
    assert baseline.report["executed_steps"] > baseline.report["unique_steps"]


def test_asha_prospects_are_the_configs_not_submitted_yet():
    space = dt.Random(DISTINCT, n=None, seed=3)
    algo = ASHA(space, "val_loss", "min", max_steps=9, eta=3, budget=40)
    first = list(itertools.islice(iter(space), 45))
    algo.start(dt.algos.Context(slots=2, seed=0))
    assert algo.prospects() == first[2:40]  # a look-ahead bounded by what the budget affords
    algo.lookahead = 5
    assert algo.prospects() == first[2:7]
    assert [algo.source.next() for _ in range(3)] == first[2:5]  # looking ahead takes nothing
    finite = ASHA(dt.Random(DISTINCT, n=6, seed=3), "val_loss", "min", max_steps=9, eta=3)
    finite.start(dt.algos.Context(slots=4, seed=0))
    assert finite.prospects() == list(dt.Random(DISTINCT, n=6, seed=3))[4:]


def test_asha_gets_a_small_space_to_max_steps_by_promoting_each_rungs_best_at_the_end():
    algo = ASHA(dt.Random(DISTINCT, n=8, seed=5), "val_loss", "min", max_steps=9, eta=3)
    sim_study().run(algo)
    assert [sum(t.steps >= r for t in algo.trials) for r in (1, 3, 9)] == [8, 2, 1]  # floor(2/3) = 0
    at_three = [t for t in algo.trials if t.steps >= 3]
    (final,) = [t for t in algo.trials if t.steps == 9]
    assert final is min(at_three, key=lambda t: metric_at(t, 3))


def test_asha_keeps_every_slot_busy_and_honours_the_budget():
    algo = ASHA(dt.Random(DISTINCT, n=None, seed=2), "val_loss", "min", max_steps=9, eta=3, budget=100)
    study = sim_study(workers=3)
    busy = []
    schedule = study.coordinator.schedule

    def watch():
        schedule()
        busy.append(sum(t.status == "pending" for t in algo.trials))

    study.coordinator.schedule = watch
    report = study.run(algo).report
    assert algo.requested == report["trial_steps"] == 100  # new configs (1 step each) fill the budget
    assert max(busy) == 3
    assert report["executed_steps"] == report["unique_steps"] == report["trial_steps"]


def test_asha_is_deterministic():
    def run():
        algo = ASHA(dt.Random(DISTINCT, n=30, seed=7), "val_loss", "min", max_steps=27, eta=3)
        sim_study().run(algo)
        return [(t.config, t.steps) for t in algo.trials]

    assert run() == run()


# --------------------------------------------------------------------------- validation

FAMILY = [SuccessiveHalving, Hyperband, ASHA]


@pytest.mark.parametrize("make", FAMILY, ids=lambda c: c.__name__)
@pytest.mark.parametrize("eta", [1, 0, 2.5, True])
def test_eta_below_two_or_not_an_int_is_rejected(make, eta):
    with pytest.raises(ValueError, match=rf"eta must be an int >= 2, got {eta!r}"):
        make(SHARING, "val_loss", max_steps=9, eta=eta)


@pytest.mark.parametrize("make", FAMILY, ids=lambda c: c.__name__)
def test_min_steps_above_max_steps_is_rejected(make):
    with pytest.raises(ValueError, match="min_steps=10 must not exceed max_steps=9"):
        make(SHARING, "val_loss", max_steps=9, min_steps=10)


@pytest.mark.parametrize("make", FAMILY, ids=lambda c: c.__name__)
@pytest.mark.parametrize("steps", [0, -1, 1.5])
def test_non_positive_steps_are_rejected(make, steps):
    with pytest.raises(ValueError, match=r"max_steps must be a positive int"):
        make(SHARING, "val_loss", max_steps=steps)


@pytest.mark.parametrize("make", FAMILY, ids=lambda c: c.__name__)
def test_an_empty_space_is_rejected(make):
    with pytest.raises(ValueError, match="search space is empty"):
        make([], "val_loss", max_steps=9)


def test_an_endless_space_needs_n_or_a_budget():
    endless = dt.Random(DISTINCT, n=None)
    with pytest.raises(ValueError, match="needs a budget"):
        ASHA(endless, "val_loss", max_steps=9)
    with pytest.raises(ValueError, match="needs n"):
        SuccessiveHalving(endless, "val_loss", max_steps=9)
    with pytest.raises(ValueError, match=r"budget must be a positive int, got 0"):
        ASHA(endless, "val_loss", max_steps=9, budget=0)


@pytest.mark.parametrize("make", FAMILY, ids=lambda c: c.__name__)
def test_an_unknown_metric_fails_on_the_first_result(make):
    algo = make(SHARING, "accuracy", max_steps=9)
    with pytest.raises(ValueError, match=r"metric 'accuracy' is not among the reported metrics"):
        sim_study().run(algo)


def test_the_custom_algorithm_example_halves_and_doubles():
    from custom_algorithm import SuccessiveDoubling

    algo = SuccessiveDoubling(SHARING, "val_loss", "min", steps=2)
    report = sim_study().run(algo).report
    assert [sum(t.steps >= s for t in algo.trials) for s in (2, 4, 8, 16, 32)] == [16, 8, 4, 2, 1]
    assert report["executed_steps"] == report["unique_steps"] < report["trial_steps"]
