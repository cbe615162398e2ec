"""MedianStopping and PBT on the simulated executor: the stopping rule recomputed from the
curves, stops that keep shared work running, and PBT lineages that branch in the search plan
at the exploit step."""

from __future__ import annotations

import math
import statistics

import pytest

import dagtune as dt
from dagtune.algos._base import Algorithm, Context, Stop, Submit
from dagtune.algos._median import MedianStopping
from dagtune.algos._pbt import PBT, Exploit, continued
from dagtune.config import config_first_difference, normalize_config
from dagtune.sim import SimulatedExecutor, SyntheticTrainer
from dagtune.study import Study, run_alone

# schedules that share prefixes; the tiny learning rates do badly and get stopped
MEDIAN_SPACE = dt.Random(
    {
        "lr": dt.choice(
            [
                dt.Constant(0.02),
                dt.Steps([0.02, 0.2], [8]),
                dt.Steps([0.02, 0.005], [8]),
                dt.Constant(0.002),
                dt.Steps([0.002, 0.1], [10]),
            ]
        ),
        "momentum": dt.choice([0.0, 0.5]),
        "batch_size": dt.choice([128, dt.Steps([128, 256], [12])]),
    },
    n=16,
    seed=2,
)

PBT_SPACE = dt.Random(
    {
        "lr": dt.loguniform(0.005, 0.5),
        "momentum": dt.uniform(0.1, 0.9),
        "batch_size": dt.choice([64, 128, 256]),
    },
    n=8,
    seed=1,
)


def sim_study(workers: int = 4) -> Study:
    return Study(SyntheticTrainer, executor=SimulatedExecutor(workers))


def distinct(space) -> list[dict]:
    """The configs of `space` without repeats, in order."""
    configs: list[dict] = []
    for config in space:
        if config not in configs:
            configs.append(config)
    return configs


# --------------------------------------------------------------------------- median stopping


class LoggingMedian(MedianStopping):
    """Records every result and every completion in the order the algorithm saw them."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.log: list[tuple] = []

    def on_result(self, trial, step, metrics):
        self.log.append(("result", trial.id, step, metrics["val_loss"]))
        return super().on_result(trial, step, metrics)

    def on_complete(self, trial):
        self.log.append(("complete", trial.id))
        return super().on_complete(trial)


def golovin_stops(log, grace: int, min_samples: int, max_steps: int) -> set[tuple[int, int]]:
    """Golovin et al.'s rule replayed on the events in order: stop trial T at step s if its
    best objective by s is strictly worse than the median of the running averages, up to s,
    of the completed trials' objectives. (trial, step) pairs to stop at."""
    curves: dict[int, list[tuple[int, float]]] = {}
    completed: list[int] = []
    stops = set()
    for event in log:
        if event[0] == "complete":
            completed.append(event[1])
            continue
        _, trial, step, loss = event
        curves.setdefault(trial, []).append((step, loss))
        if not grace <= step < max_steps or len(completed) < min_samples:
            continue
        averages = [statistics.fmean(v for s, v in curves[t] if s <= step) for t in completed]
        if min(v for s, v in curves[trial] if s <= step) > statistics.median(averages):  # val_loss: min
            stops.add((trial, step))
    return stops


def reported_stops(log, grace: int, min_samples: int, max_steps: int) -> set[tuple[int, int]]:
    """The Ray Tune variant replayed: the median over every other trial that has reported at
    step s or later."""
    curves: dict[int, list[tuple[int, float]]] = {}
    stops = set()
    for event in log:
        if event[0] == "complete":
            continue
        _, trial, step, loss = event
        curves.setdefault(trial, []).append((step, loss))
        if not grace <= step < max_steps:
            continue
        others = [curve for t, curve in curves.items() if t != trial and curve[-1][0] >= step]
        if len(others) < min_samples:
            continue
        median = statistics.median(statistics.fmean(v for s, v in curve if s <= step) for curve in others)
        if min(v for s, v in curves[trial] if s <= step) > median:
            stops.add((trial, step))
    return stops


@pytest.mark.parametrize(("median_of", "replay"), [(None, golovin_stops), ("reported", reported_stops)])
def test_median_stopping_stops_exactly_what_the_rule_says(median_of, replay):
    configs = distinct(MEDIAN_SPACE)
    study = sim_study(workers=3)
    option = {} if median_of is None else {"median_of": median_of}  # Golovin's rule is the default
    algo = LoggingMedian(configs, "val_loss", "min", max_steps=20, grace=2, min_samples=2, **option)
    report = study.run(algo).report
    for trial in algo.trials:  # the log is the curves, in the order results arrived
        assert [(s, m["val_loss"]) for s, m in trial.curve] == [
            (e[2], e[3]) for e in algo.log if e[0] == "result" and e[1] == trial.id
        ]
    assert all(t.status in ("completed", "stopped") for t in algo.trials)
    stopped = {(t.id, t.reported) for t in algo.trials if t.status == "stopped"}
    print(f"median of {median_of}: stopped {sorted(stopped)}")
    assert stopped == replay(algo.log, grace=2, min_samples=2, max_steps=20)
    assert 0 < len(stopped) < len(configs)
    # the two rules disagree on these results: the replay tells which one ran
    other = reported_stops if replay is golovin_stops else golovin_stops
    assert stopped != other(algo.log, grace=2, min_samples=2, max_steps=20)
    assert report["executed_steps"] == report["unique_steps"] < 20 * len(configs)
    if median_of is None:  # nothing is stopped before min_samples trials completed
        first_stop = min(i for i, e in enumerate(algo.log) if e[0] == "result" and (e[1], e[2]) in stopped)
        assert sum(e[0] == "complete" for e in algo.log[:first_stop]) >= 2


def test_a_stopped_trial_leaves_the_stage_another_trial_needs_running():
    # the Ray Tune variant stops early, while trials still share prefixes (Vizier's rule waits
    # for trials to complete, and here the stopped ones have branched off by then)
    study = sim_study(workers=3)
    algo = MedianStopping(
        distinct(MEDIAN_SPACE), "val_loss", "min", max_steps=20, grace=2, min_samples=2, median_of="reported"
    )
    report = study.run(algo).report
    sharing = [
        (stopped, other)
        for stopped in algo.trials
        if stopped.status == "stopped"
        for other in algo.trials
        if other.reported > stopped.reported
        and config_first_difference(stopped.config, other.config, 0, 20) > stopped.reported
    ]
    assert sharing  # a trial was stopped inside a prefix that another one went on training
    for _, other in sharing:
        assert [m for _, m in other.curve] == run_alone(SyntheticTrainer, other.config, other.reported)
    assert report["executed_steps"] == report["unique_steps"]


class StopAt(Algorithm):
    """Submits `configs`; stops trial 0 after `step` steps."""

    def __init__(self, configs, step):
        super().__init__("val_loss", "min")
        self.configs, self.step = configs, step

    def start(self, ctx):
        return [Submit(c, 20) for c in self.configs]

    def on_result(self, trial, step, metrics):
        return [Stop(trial.id)] if trial.id == 0 and step == self.step else []


def test_stop_cancels_only_the_stopped_trials_request():
    shared = dt.Steps([0.1, 0.05], [15])
    study = sim_study(workers=1)
    algo = StopAt([{"lr": shared}, {"lr": dt.Steps([0.1, 0.01], [15])}], step=5)
    report = study.run(algo).report
    stopped, kept = algo.trials
    assert (stopped.status, stopped.reported) == ("stopped", 5)
    assert kept.status == "completed"
    assert [m for _, m in kept.curve] == run_alone(SyntheticTrainer, kept.config, 20)
    assert report["executed_steps"] == report["unique_steps"] == 20  # [0, 15) ran on for the other


def test_median_stopping_with_a_budget_draws_that_many_trials():
    algo = MedianStopping(dt.Random(MEDIAN_SPACE.space, n=None), "val_loss", max_steps=10, budget=55)
    assert len(algo.configs) == 5


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_steps": 0}, "max_steps must be a positive int, got 0"),
        ({"max_steps": 10, "grace": 11}, "grace=11 must not exceed max_steps=10"),
        ({"max_steps": 10, "min_samples": 0}, "min_samples must be a positive int, got 0"),
        ({"max_steps": 10, "budget": 5}, "budget=5 is less than one trial of max_steps=10"),
        ({"max_steps": 10, "median_of": "all"}, "median_of must be 'completed' or 'reported', got 'all'"),
    ],
)
def test_median_stopping_arguments_are_checked(kwargs, message):
    with pytest.raises(ValueError, match=message):
        MedianStopping(MEDIAN_SPACE, "val_loss", **kwargs)


def test_median_stopping_needs_a_budget_or_a_finite_space():
    with pytest.raises(ValueError, match="needs a budget"):
        MedianStopping(MEDIAN_SPACE.sampler(), "val_loss", max_steps=10)
    with pytest.raises(ValueError, match="search space is empty"):
        MedianStopping([], "val_loss", max_steps=10)


# --------------------------------------------------------------------------- PBT


@pytest.fixture(scope="module")
def pbt_run():
    study = sim_study()
    algo = PBT(PBT_SPACE, "val_loss", "min", max_steps=30, interval=5, population=8, seed=3)
    return study, algo, study.run(algo)


def test_pbt_exploits_branch_from_the_donor_at_the_exploit_step(pbt_run):
    study, algo, _ = pbt_run
    plan = study.plan
    exploits = [t for t in algo.trials if isinstance(t.tag, Exploit)]
    assert len(exploits) == 2 * 5  # ceil(8 * 0.25) members replaced at each of 5 boundaries
    for trial in exploits:
        donor = algo.trials[trial.tag.donor]
        branch_step = config_first_difference(trial.config, donor.config, 0, trial.steps)
        assert branch_step == trial.tag.step  # floats perturbed or redrawn always change
        donor_path, path = plan.path(donor.node), plan.path(trial.node)
        fork = next(i for i, node in enumerate(path) if node not in donor_path)
        assert path[:fork] == donor_path[:fork]
        assert plan.nodes[path[fork]].start == branch_step
        assert plan.nodes[path[fork]].parent == donor_path[fork - 1]
        for name in algo.mutate:  # each lineage is the donor's sequence, then a new one at t
            assert trial.config[name].items[-1][0] == trial.tag.step


def test_pbt_trains_nothing_twice_and_matches_training_alone(pbt_run):
    _, algo, result = pbt_run
    report = result.report
    assert report["executed_steps"] == report["unique_steps"] < report["trial_steps"]
    for trial in algo.trials:
        assert trial.status == "completed"
        assert [m for _, m in trial.curve] == run_alone(SyntheticTrainer, trial.config, trial.steps)
    assert result.best.steps == 30


def test_pbt_replaces_the_bottom_quantile_with_top_donors(pbt_run):
    _, algo, _ = pbt_run
    for boundary in range(5, 30, 5):
        members = [
            t
            for t in algo.trials
            if t.steps >= boundary and (not isinstance(t.tag, Exploit) or t.tag.step < boundary)
        ]
        assert len(members) == 8
        ranked = sorted(members, key=lambda t: (dict(t.curve)[boundary]["val_loss"], t.id))
        made = [t.tag for t in algo.trials if isinstance(t.tag, Exploit) and t.tag.step == boundary]
        assert {e.replaced for e in made} == {t.id for t in ranked[-2:]}
        assert {e.donor for e in made} <= {t.id for t in ranked[:2]}
        assert all(t.steps == boundary for t in ranked[-2:])  # replaced members end there


def test_pbt_is_deterministic_for_a_seed():
    def configs(seed):
        algo = PBT(PBT_SPACE, "val_loss", "min", max_steps=12, interval=4, population=4, seed=seed)
        sim_study().run(algo)
        return [t.config for t in algo.trials]

    assert configs(5) == configs(5) != configs(6)


def test_pbt_explore_perturbs_numbers_and_resamples_categories():
    space = [
        {"lr": 0.1, "batch_size": 128, "opt": "sgd"},
        {"lr": dt.MultiStep(0.2, [3], 0.5), "batch_size": 256, "opt": "adam"},
    ]
    algo = PBT(space, "val_loss", max_steps=10, interval=5, population=2, resample_probability=0.0)
    assert algo.mutate == ("batch_size", "lr", "opt")
    algo.start(Context(slots=1, seed=0))
    donor = normalize_config(space[1])
    for _ in range(20):
        explored = algo.explore(donor, 5)
        assert explored["lr"].items[0] == (0, donor["lr"])
        assert explored["lr"](5) in (pytest.approx(0.1 * 0.8), pytest.approx(0.1 * 1.2))
        assert explored["batch_size"](5) in (205, 307) and isinstance(explored["batch_size"](5), int)
        assert explored["opt"](5) in ("sgd", "adam")  # strings are always drawn from the space
        assert all(explored[name](s) == donor[name](s) for name in donor for s in range(5))


def test_continued_lineages_stay_flat():
    once = continued(dt.Constant(0.1), 5, dt.Constant(0.2))
    twice = continued(once, 10, dt.Constant(0.3))
    assert twice == dt.Piecewise((0, 0.1), (5, 0.2), (10, 0.3))
    assert [twice(t) for t in (4, 5, 9, 10)] == [0.1, 0.2, 0.2, 0.3]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"interval": 0}, "interval must be a positive int, got 0"),
        ({"interval": 40}, "interval=40 must not exceed max_steps=30"),
        ({"quantile": 0.6}, r"quantile must be in \(0, 0.5\], got 0.6"),
        ({"resample_probability": 1.5}, r"resample_probability must be in \[0, 1\], got 1.5"),
        ({"factors": ()}, "factors must be positive numbers"),
        ({"population": 9}, "population=9 but the search space has only 8 configs"),
        ({"mutate": ["lr", "wd"]}, r"mutate names unknown hyper-parameters \['wd'\]"),
    ],
)
def test_pbt_arguments_are_checked(kwargs, message):
    with pytest.raises(ValueError, match=message):
        PBT(PBT_SPACE, "val_loss", **{"max_steps": 30, "interval": 5, **kwargs})


def test_pbt_unknown_metric_fails_on_the_first_result():
    algo = PBT(PBT_SPACE, "accuracy", max_steps=10, interval=5, population=4)
    with pytest.raises(ValueError, match="metric 'accuracy' is not among the reported metrics"):
        sim_study().run(algo)


def test_median_unknown_metric_fails_on_the_first_result():
    with pytest.raises(ValueError, match="metric 'accuracy' is not among the reported metrics"):
        sim_study().run(MedianStopping(MEDIAN_SPACE, "accuracy", max_steps=5))


def test_pbt_replaces_diverged_members():
    space = [{"lr": 0.05}, {"lr": 0.1}, {"lr": 0.2}, {"lr": 1e4}]  # the last one diverges at step 4
    algo = PBT(space, "val_loss", "min", max_steps=10, interval=5, population=4, quantile=0.25, seed=0)
    sim_study().run(algo)
    diverged = [t for t in algo.trials if t.status == "diverged"]
    assert [t.config["lr"] for t in diverged] == [dt.Constant(1e4)]
    replacements = [t for t in algo.trials if isinstance(t.tag, Exploit)]
    assert diverged[0].id in {t.tag.replaced for t in replacements}
    assert sum(t.steps == 10 and t.status == "completed" for t in algo.trials) == 4
    assert not math.isnan(min(t.metrics["val_loss"] for t in algo.trials if t.status == "completed"))
