"""MLtuner's progress summarizer and online re-tuning (`Retune`) on the simulated executor."""

from __future__ import annotations

import math

import numpy as np
import pytest

import dagtune as dt
from dagtune.algos._retune import CONVERGING, DIVERGED, UNSTABLE, Progress, Retune, summarize_progress
from dagtune.config import config_first_difference, normalize_config
from dagtune.records import COMPLETED
from dagtune.records import DIVERGED as TRIAL_DIVERGED
from dagtune.sim import SimulatedExecutor, SyntheticTrainer
from dagtune.study import Study

TUNABLES = {"lr": dt.loguniform(1e-3, 1.0), "momentum": dt.uniform(0.0, 0.9)}
TOO_LARGE = {"lr": 3.0, "momentum": 0.0}  # 100x the best constant lr (about 0.03): diverges
# 100x the best constant lr for 100 steps (about 0.015): finite, but the loss stays near 1
NOISY_100X = {"lr": 1.5, "momentum": 0.0}


def sim_study(trainer=SyntheticTrainer, **trainer_kwargs) -> Study:
    return Study(trainer, trainer_kwargs, executor=SimulatedExecutor(4))


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


class NoisyDecay(Decay):
    """`Decay` observed through noise: the loss reported is the decaying signal plus
    ``noise * N(0, 1)`` (the same draw for every branch at a step, as a fixed validation set
    would give), so a short trial may not tell a converging setting from noise."""

    def __init__(self, noise: float = 0.0, seed: int = 0):
        super().__init__()
        self.noise, self.seed, self.step = noise, seed, 0

    def train(self):
        self.step += 1
        return super().train()

    def evaluate(self):
        draw = float(np.random.default_rng([self.seed, self.step]).standard_normal())
        return {"loss": self.loss + self.noise * draw}

    def state_dict(self):
        return {**super().state_dict(), "step": self.step}

    def load_state_dict(self, state):
        super().load_state_dict(state)
        self.step = state["step"]


def summary(trial, after: int, until: int) -> Progress:
    """The summarizer on a trial's loss over steps (after, until]."""
    curve = [(s, m["loss"]) for s, m in trial.curve if after < s <= until]
    return summarize_progress([s for s, _ in curve], [v for _, v in curve])


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
    assert sizes == [r.size for r in retune.rounds]
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


def test_retune_without_initial_tuning_recovers_from_a_learning_rate_100x_too_large():
    # MLtuner §5.5: the initial setting trains untuned; only re-tuning, from a checkpoint, can fix it
    fixed = sim_study().submit(NOISY_100X, 300)
    fixed.result()
    study = sim_study()
    retune = Retune(
        TUNABLES, "val_loss", "min", max_steps=300, initial=NOISY_100X, tune_initial=False, seed=0
    )
    report = study.run(retune).report
    untuned, first = retune.rounds[:2]
    winner = retune.winner
    loss = {s: m["val_loss"] for s, m in winner.curve}
    print(
        f"lr=1.5 alone: val_loss {fixed.trial.metrics['val_loss']:.3f}; re-tuned at "
        f"{[r.fork for r in retune.rounds[1:]]}: {loss[first.fork]:.3f} at the first re-tuning, "
        f"{loss[300]:.4f} at the end; schedule {retune.schedule}"
    )
    alone = [m["val_loss"] for _, m in fixed.trial.curve]
    assert fixed.trial.status == COMPLETED and min(alone) > 0.1  # bad all along, yet not diverged
    assert not untuned.tuned and untuned.branches == [untuned.winner]
    assert untuned.winner.config == normalize_config(NOISY_100X)
    assert [s for s, _ in untuned.winner.curve][:10] == list(range(1, 11))  # it trained from step 0
    assert first.tuned and first.fork == 10  # a plateau after the first chunk: re-tuned from there
    assert min(loss[s] for s in range(1, first.fork + 1)) > 0.5  # bad before re-tuning
    assert loss[300] < 0.05  # good after it (training alone at the best constant lr: about 0.02)
    assert winner.steps == 300 and retune.schedule["lr"](0) == 1.5 and retune.schedule["lr"](299) < 0.15
    assert len(first.branches) > retune.branches  # a re-tuning after no tuning is not bounded by it
    assert report["executed_steps"] == report["unique_steps"]


def test_trial_time_doubles_until_a_noisy_branch_is_seen_converging():
    # noise-free, 10 points suffice; with noise, the trial time doubles twice (10 -> 20 -> 40)
    rounds = {}
    for noise in (0.0, 0.15):
        study = sim_study(NoisyDecay, noise=noise)
        space = {"lr": dt.loguniform(0.01, 0.05)}
        retune = Retune(
            space, "loss", "min", max_steps=200, trial_steps=10, max_trial_steps=80, max_retunes=0
        )
        report = study.run(retune).report
        assert report["executed_steps"] == report["unique_steps"]
        rounds[noise] = retune.rounds[0]
    quiet, noisy = rounds[0.0], rounds[0.15]
    print(
        f"trial time noise-free {quiet.trial_steps}, noisy {noisy.trial_steps}; settings {quiet.size}, {noisy.size}"
    )
    assert quiet.trial_steps == 10 and all(summary(b, 0, 10).label == CONVERGING for b in quiet.branches[:4])
    assert noisy.trial_steps == 40
    # replayed: the 4 first branches at 10 steps, with one more setting at each doubling
    assert not any(summary(b, 0, 10).label == CONVERGING for b in noisy.branches[:4])
    assert not any(summary(b, 0, 20).label == CONVERGING for b in noisy.branches[:5])
    assert any(summary(b, 0, 40).label == CONVERGING for b in noisy.branches[:6])
    for branch in noisy.branches:  # every setting of the round was judged at the decided trial time
        assert branch.curve[-1][0] >= 40 and noisy.progress[branch.id] == summary(branch, 0, 40)


@pytest.mark.parametrize("max_settings", [100, 12])
def test_search_goes_on_with_the_decided_trial_time_until_the_top_five_are_within_ten_percent(max_settings):
    study = sim_study(Decay)
    space = {"lr": dt.loguniform(0.01, 0.05)}
    retune = Retune(
        space, "loss", "min", max_steps=200, trial_steps=10, max_retunes=0, max_settings=max_settings
    )
    study.run(retune)
    first = retune.rounds[0]
    speeds = [first.progress[b.id].speed for b in first.branches]
    assert all(p.label == CONVERGING for p in first.progress.values())  # noise-free: decided at once
    assert first.trial_steps == 10 and all(b.curve[-1][0] >= 10 for b in first.branches)
    print(f"settings tried {first.size}; speeds {[round(v, 4) for v in speeds]}")

    def settled(k: int) -> bool:  # MLtuner's rule on the first k settings
        top = sorted(speeds[:k], reverse=True)[:5]
        return len(top) == 5 and (top[0] - top[4]) / top[0] < 0.10

    batches = list(range(4, first.size + 1, 4))  # `branches` new settings at a time
    assert batches[-1] == first.size and not any(settled(k) for k in batches[:-1])
    if max_settings == 100:
        assert settled(first.size) and first.size > 8  # searching stopped by the rule...
    else:
        assert first.size == 12 and not settled(12)  # ...or by the bound on a tuning's settings
    assert first.winner is first.branches[speeds.index(max(speeds))]


def test_a_converged_model_is_not_retuned_again():
    # the signal is gone after about 20 steps; then every setting only sees noise: the first
    # re-tuning finds nothing converging up to the longest trial time, and there is no other
    study = sim_study(NoisyDecay, noise=0.01)
    retune = Retune(
        {"lr": dt.loguniform(0.3, 0.6)}, "loss", "min", max_steps=120, trial_steps=10, max_trial_steps=40
    )
    report = study.run(retune).report
    assert [r.fork for r in retune.rounds] == [0, 20]
    tuning, retuning = retune.rounds
    assert tuning.decided and not retuning.decided and retune.converged
    assert retuning.trial_steps == 40 and retuning.size <= tuning.size
    assert not any(p.label == CONVERGING for p in retuning.progress.values())
    winner = retune.winner
    assert winner is retuning.winner and winner.steps == 120
    # later chunks do not converge either (the plateau a re-tuning would follow), yet none came
    assert summary(winner, 80, 120).label != CONVERGING
    assert report["executed_steps"] == report["unique_steps"]


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
        ({"max_settings": 0}, "Retune.max_settings must be a positive int, got 0"),
        ({"max_settings": 3}, "Retune.max_settings must be at least branches=4, got 3"),
        ({"tune_initial": 0}, "Retune.tune_initial must be True or False, got 0"),
        ({"tune_initial": False}, "Retune: tune_initial=False needs an initial setting to train"),
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
    # pure noise looks converging with probability below 2**-K (K = 10 windows): long traces,
    # 100 points averaged 10 to a window, as a real trial time gives
    rng = np.random.default_rng(0)
    n = 5_000
    hits = sum(summarize_progress(range(100), rng.normal(size=100)).label == CONVERGING for _ in range(n))
    assert hits / n < 2**-10
    # the same noise on a line falling by 1 per window (3 window-mean SDs): seen converging
    line = 10.0 - np.arange(100) / 10
    seen = sum(
        summarize_progress(range(100), line + rng.normal(size=100)).label == CONVERGING for _ in range(200)
    )
    assert seen >= 195
