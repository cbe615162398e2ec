"""MLtuner's progress summarizer and online re-tuning (`Retune`) on the simulated executor."""

from __future__ import annotations

import math

import numpy as np
import pytest

import dagtune as dt
from dagtune.algos._retune import CONVERGING, DIVERGED, UNSTABLE, Progress, Retune, summarize_progress
from dagtune.config import config_first_difference, normalize_config
from dagtune.coordinator import COMPLETED
from dagtune.coordinator import DIVERGED as TRIAL_DIVERGED
from dagtune.sim import SimulatedExecutor, SyntheticTrainer
from dagtune.study import Study

TUNABLES = {"lr": dt.loguniform(1e-3, 1.0), "momentum": dt.uniform(0.0, 0.9)}
TOO_LARGE = {"lr": 3.0, "momentum": 0.0}  # 100x the best constant lr (about 0.03): diverges


def sim_study(trainer=SyntheticTrainer) -> Study:
    return Study(trainer, executor=SimulatedExecutor(4))


class Decay(dt.Trainer):
    """Noise-free progress: the loss shrinks by ``1 - lr`` per step, and is NaN once lr >= 1."""

    def __init__(self):
        self.loss, self.lr = 1.0, 0.1

    def setup(self, hp):
        self.lr = hp.get("lr", self.lr)

    def train(self):
        self.loss = self.loss * (1.0 - self.lr) if self.lr < 1.0 else math.nan
        return None

    def evaluate(self):
        return {"loss": self.loss}

    def state_dict(self):
        return {"loss": self.loss, "lr": self.lr}

    def load_state_dict(self, state):
        self.loss, self.lr = state["loss"], state["lr"]


# --------------------------------------------------------------------------- the summarizer


def test_summarizer_speed_is_the_slope_of_window_means():
    steps = list(range(20))
    progress = summarize_progress(steps, [2.0 - 0.1 * t for t in steps])
    assert progress.label == CONVERGING
    assert progress.speed == pytest.approx(0.1)


def test_summarizer_averages_noise_inside_windows():
    # 30 points in 10 windows of 3: the +-1 wiggle cancels in every window mean
    steps = list(range(30))
    wiggle = [1.0, -1.0, 0.0] * 10
    losses = [30.0 - (t // 3) * 3 + w for t, w in zip(steps, wiggle)]
    progress = summarize_progress(steps, losses)
    assert progress.label == CONVERGING
    assert progress.speed == pytest.approx(27.0 / 27.0)  # window means 30, 27, ..., 3 at steps 1, 4, ..., 28


def test_summarizer_penalizes_the_largest_rise():
    steps = list(range(10))
    small = summarize_progress(steps, [10, 9, 8, 8.5, 7, 6, 5, 4, 3, 2])
    assert small.speed == pytest.approx((8 - 0.5) / 9)
    assert small.label == CONVERGING  # the rise 0.5 is below epsilon * drop = 0.8
    large = summarize_progress(steps, [10, 9, 8, 9.0, 7, 6, 5, 4, 3, 2])
    assert large.speed == pytest.approx((8 - 1.0) / 9)
    assert large.label == UNSTABLE  # 1.0 is not below 0.8
    assert summarize_progress(steps, [10, 9, 8, 9.0, 7, 6, 5, 4, 3, 2], epsilon=0.2).label == CONVERGING


def test_summarizer_rising_or_short_traces_are_unstable_with_speed_zero():
    rising = summarize_progress(list(range(12)), [float(t) for t in range(12)])
    assert rising == Progress(0.0, UNSTABLE)
    short = summarize_progress([0, 1, 2], [3.0, 2.0, 1.0])  # fewer points than K windows
    assert short.label == UNSTABLE and short.speed == pytest.approx(1.0)
    assert summarize_progress([0], [1.0]).label == UNSTABLE


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_summarizer_diverged_traces_have_speed_zero(bad):
    losses = [10.0 - t for t in range(10)]
    losses[7] = bad
    assert summarize_progress(list(range(10)), losses) == Progress(0.0, DIVERGED)


def test_summarizer_checks_its_arguments():
    with pytest.raises(ValueError, match="one length"):
        summarize_progress([0, 1], [1.0])
    with pytest.raises(ValueError, match="windows must be an int >= 2, got 1"):
        summarize_progress([0, 1], [1.0, 0.5], windows=1)


# --------------------------------------------------------------------------- re-tuning


def test_retune_recovers_from_a_learning_rate_100x_too_large():
    baseline = sim_study()
    fixed = baseline.submit(TOO_LARGE, 100)
    fixed.result()
    assert fixed.status == TRIAL_DIVERGED

    study = sim_study()
    retune = Retune(TUNABLES, "val_loss", "min", max_steps=100, initial=TOO_LARGE, seed=4)
    res = study.run(retune)
    winner, schedule = retune.winner, retune.schedule
    first = retune.rounds[0]
    print(f"fixed lr=3.0: {fixed.trial.metrics}; discovered schedule: {schedule}")
    print(f"final val_loss {winner.metrics['val_loss']:.4f}, rounds at {[r.fork for r in retune.rounds]}")
    (kept,) = [b for b in first.branches if b.config == normalize_config(TOO_LARGE)]
    assert first.progress[kept.id].label != CONVERGING and first.winner is not kept  # the initial lr loses
    assert winner.status == COMPLETED and winner.steps == 100
    assert schedule["lr"](99) < 0.3  # a sane final learning rate (about 2 diverges)
    assert winner.metrics["val_loss"] < 0.07  # the loss starts at about 1.4
    assert res.best.id == winner.id and res.best.config == schedule


def test_branches_share_their_prefix_nothing_is_trained_twice():
    study = sim_study()
    retune = Retune(TUNABLES, "val_loss", "min", max_steps=100, initial=TOO_LARGE, seed=4)
    report = study.run(retune).report
    print(f"Retune report: {report}")
    assert len(retune.rounds) >= 2
    sizes = [len(r.branches) for r in retune.rounds]
    assert sizes[0] > 1 + retune.branches  # trial time doubled, a setting joined each time
    assert sizes[1:] == sorted(sizes[1:], reverse=True) and sizes[1] <= sizes[0]  # MLtuner §4.4 bound
    assert report["executed_steps"] == report["unique_steps"]
    assert report["trial_steps"] > 1.5 * report["unique_steps"]
    for round_ in retune.rounds[1:]:
        base = round_.base
        for branch in round_.branches:
            # every branch continues the schedule up to the fork, then goes its own way
            assert config_first_difference(branch.config, base, 0, round_.fork + 1) >= round_.fork
            lr = branch.config["lr"]
            if lr != base["lr"]:
                assert lr.items[:-1] == (
                    base["lr"].items if isinstance(base["lr"], dt.Piecewise) else ((0, base["lr"]),)
                )
                assert lr.items[-1][0] == round_.fork


def test_a_winner_that_diverges_is_retuned_from_its_last_checkpoint():
    # the initial schedule is the fastest at first and wins, then jumps to a diverging lr at 30
    study = sim_study(Decay)
    initial = {"lr": dt.Steps([0.1, 5.0], [30])}
    space = {"lr": dt.loguniform(0.01, 0.05)}
    retune = Retune(space, "loss", "min", max_steps=60, initial=initial, max_trial_steps=16)
    report = study.run(retune).report
    first, second = retune.rounds[:2]
    assert first.winner.config == normalize_config(initial)  # the fastest setting at first
    assert first.winner.status == TRIAL_DIVERGED and first.winner.reported == 31
    assert first.trial_steps == 16 and first.progress[first.winner.id].label == CONVERGING
    assert second.fork == 16  # its last completed step: it diverged in its next chunk, [16, 32)
    (kept,) = [b for b in second.branches if b.config == second.base]
    assert second.progress[kept.id].label == DIVERGED  # kept as it is, it diverges again
    assert retune.winner.steps == 60 and math.isfinite(retune.winner.metrics["loss"])
    lr = retune.schedule["lr"]
    assert [lr(t) for t in (0, 15, 16, 59)] == [0.1, 0.1, lr(16), lr(16)] and 0.01 <= lr(16) < 0.05
    assert report["executed_steps"] == report["unique_steps"]


def test_retune_maximizes_and_is_deterministic():
    def run():
        study = sim_study()
        retune = Retune(dt.Random(TUNABLES), "val_acc", "max", max_steps=60, seed=3, branches=3)
        study.run(retune)
        return retune

    a, b = run(), run()
    assert a.schedule == b.schedule and [r.fork for r in a.rounds] == [r.fork for r in b.rounds]
    assert a.winner.steps == 60 and a.winner.metrics["val_acc"] > 0.9
    assert a.rounds[0].base is None and len(a.rounds[0].branches) >= 3


def test_retune_stops_retuning_at_max_retunes():
    study = sim_study()
    retune = Retune(TUNABLES, "val_loss", "min", max_steps=100, initial=TOO_LARGE, seed=1, max_retunes=0)
    study.run(retune)
    assert len(retune.rounds) == 1 and retune.winner.steps == 100


def test_retune_checks_the_metric():
    with pytest.raises(ValueError, match="'nope' is not among the reported metrics"):
        sim_study().run(Retune(TUNABLES, "nope", "min", max_steps=20))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_steps": 0}, "Retune.max_steps must be a positive int, got 0"),
        ({"branches": -1}, "Retune.branches must be a positive int, got -1"),
        ({"trial_steps": 2.5}, "Retune.trial_steps must be a positive int, got 2.5"),
        ({"trial_steps": 20, "max_steps": 20}, "Retune.trial_steps must be less than max_steps=20, got 20"),
        ({"max_trial_steps": 2}, "Retune.max_trial_steps must be at least trial_steps=4, got 2"),
        ({"max_retunes": -1}, "Retune.max_retunes must be an int >= 0, got -1"),
        ({"windows": 1}, "Retune.windows must be an int >= 2, got 1"),
        ({"seed": "0"}, "Retune.seed must be an int, got '0'"),
        ({"mode": "up"}, "mode must be 'max' or 'min', got 'up'"),
        ({"space": {}}, "Retune.space must be a dt.Random or a dict"),
        ({"space": [0.1]}, "Retune.space must be a dt.Random or a dict"),
        ({"initial": {"momentum": 0.5}}, r"Retune.initial must name every tunable of the space; \['lr'\]"),
    ],
)
def test_retune_validates_its_arguments(kwargs, message):
    arguments = {"space": TUNABLES, "metric": "val_loss", "mode": "min", **kwargs}
    with pytest.raises(ValueError, match=message):
        Retune(**arguments)


def test_summarizer_matches_mltuners_false_positive_bound():
    # pure noise looks converging with probability below 2**-K (K = 10 windows)
    rng = np.random.default_rng(0)
    hits = sum(summarize_progress(range(10), rng.normal(size=10)).label == CONVERGING for _ in range(5_000))
    assert hits / 5_000 < 2**-10 * 2
