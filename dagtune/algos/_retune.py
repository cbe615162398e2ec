"""MLtuner's online re-tuning: one training run whose schedule is discovered as it trains.

MLtuner (papers/mltuner.txt §3–4) snapshots the training state, forks *branches* that
continue it with different settings of the training tunables (learning rate, momentum,
...), trains each for a short *trial time*, keeps the branch that converges fastest and
throws the others away; when training stops making progress it re-tunes from the current
state. On the stage tree a branch is just a trial whose config is the current schedule up
to the fork step `t` followed by the candidate from `t` on::

    {"lr": Piecewise((0, current_lr), (t, candidate_lr)), ...}

so every branch resumes from the checkpoint at `t` (the winner's last completed step) and
nothing before `t` is trained again; losing branches are simply not extended and their
stages stay in the plan as nodes. The winner's config, after the last re-tuning, is the
discovered schedule.

`summarize_progress` is MLtuner's progress summarizer (§4.1): the progress trace is cut into
K = 10 windows of equal size and averaged; speed = max((-range - noise) / time range, 0)
where noise is the largest rise between consecutive window means; a trace is *converging*
when it went down, its noise is below epsilon = 1/K of the drop and it has at least K points
(fewer cannot fill K windows, and K is what bounds the chance that noise alone looks
converging), *diverged* when a value is NaN or infinite (speed 0: diverged branches are
pruned, never ranked among themselves), and *unstable* otherwise. The step is the clock (a
dagtune step is the user's logical iteration, so it is what MLtuner's timestamps measure).

The tuning loop (§4.2–4.4, Algorithm 1), from fork step `t`:

1. branch: the current schedule kept as it is (once there is one, or `initial`) and
   `branches` candidates sampled from `space`, each trained for the trial time;
2. summarize each branch's metric over its steps after `t` (the metric is negated for
   ``mode="max"``, so progress always goes down). While no branch is converging the trial
   time doubles: the live branches are extended to it and, as Algorithm 1 asks its searcher
   for a setting at every iteration, new candidates join (one per diverged branch, at least
   one). Once some branch converges the trial time is decided, and the search goes on with
   it (§4.3): `branches` more candidates at a time, each trained for the decided trial time,
   until the five fastest converging speeds differ by less than 10% (MLtuner's stopping
   rule), or the round has tried as many settings as it may; then the fastest converging
   branch wins. A tuning may try `max_settings` settings; a re-tuning no more than the
   tuning before it (§4.4). At `max_trial_steps` with nothing converging, the live branch
   with the best metric wins (speeds are noise by then) and, in a re-tuning, the model is
   taken to have converged (§4.4): there is no further re-tuning;
3. train the winner on in chunks of ``max(trial time, windows)`` steps, summarizing each
   chunk: while it converges, go on; on a plateau (not converging) or a divergence, re-tune
   from the winner's last completed step, which has a checkpoint.

With ``tune_initial=False`` (MLtuner §5.5) there is no initial tuning: `initial` trains from
step 0 as if it had won, and only re-tunings change it.

The run ends when the winner reaches `max_steps`, or when it diverges with no re-tuning
left (`max_retunes`, or the model converged), or when every branch of a round diverged.

Deviations from MLtuner: the searcher is random sampling from `space` (MLtuner's default is
HyperOpt; its speeds do not guide the sampling here); the branches of a round train side by
side on the executor's workers, `branches` new settings at a time, where MLtuner time-shares
one training instance between them; and the initial tuning is bounded by `max_settings`,
which MLtuner leaves to its stopping rule alone.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from collections.abc import Sequence as Seq
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dagtune.algos._base import Algorithm, Context, Decision, Extend, Submit, check_positive
from dagtune.config import Config, normalize_config
from dagtune.records import COMPLETED, PENDING, Trial
from dagtune.sequences import Piecewise, Sequence
from dagtune.space import Random
from dagtune.validation import check_int

__all__ = ["CONVERGING", "DIVERGED", "UNSTABLE", "Progress", "Retune", "Round", "summarize_progress"]

CONVERGING, UNSTABLE, DIVERGED = "converging", "unstable", "diverged"

# MLtuner's rule of thumb for when to stop searching (§4.3): the TOP fastest converging
# speeds are within WITHIN of each other
TOP, WITHIN = 5, 0.10


@dataclass(frozen=True)
class Progress:
    """A progress trace summarized: its convergence `speed` (>= 0) and its label."""

    speed: float
    label: str


def summarize_progress(
    steps: Seq[float], losses: Seq[float], windows: int = 10, epsilon: float | None = None
) -> Progress:
    """MLtuner's progress summarizer (§4.1) of a trace of `losses` (lower is better) at `steps`.

    The trace is cut into ``min(windows, len(losses))`` windows of equal size whose means are
    compared; `epsilon` defaults to one over the number of windows. A trace shorter than two
    points is unstable.
    """
    if len(steps) != len(losses):
        raise ValueError(f"steps and losses must have one length, got {len(steps)} and {len(losses)}")
    check_int("windows", windows, minimum=2)
    x = np.asarray(losses, dtype=float)
    if not np.all(np.isfinite(x)):
        return Progress(0.0, DIVERGED)
    if len(x) < 2:
        return Progress(0.0, UNSTABLE)
    t = np.asarray(steps, dtype=float)
    parts = np.array_split(np.arange(len(x)), min(windows, len(x)))
    t_means = np.array([t[p].mean() for p in parts])
    x_means = np.array([x[p].mean() for p in parts])
    drop = x_means[-1] - x_means[0]  # MLtuner's range(x): negative when converging
    noise = max(float(np.max(np.diff(x_means))), 0.0)
    speed = max((-drop - noise) / (t_means[-1] - t_means[0]), 0.0)
    eps = 1.0 / len(parts) if epsilon is None else epsilon
    converging = len(x) >= windows and drop < 0 and noise < eps * abs(drop)
    return Progress(float(speed), CONVERGING if converging else UNSTABLE)


@dataclass
class Round:
    """One tuning round: where it forked, its trial time and how its branches fared."""

    fork: int
    trial_steps: int
    base: Config | None  # the schedule its branches continue (None: from scratch)
    size: int  # settings tried (the branches, once all reported)
    branches: list[Trial] = field(default_factory=list)
    progress: dict[int, Progress] = field(default_factory=dict)  # trial id -> its summary
    winner: Trial | None = None
    tuned: bool = True  # False: `initial` trained without tuning (``tune_initial=False``)
    decided: bool = False  # the trial time is decided (some branch converged with it)


def _continue(current: Sequence, fork: int, candidate: Sequence) -> Sequence:
    """`current` until `fork`, then `candidate` (on its own clock), as one flat Piecewise."""
    items = current.items if isinstance(current, Piecewise) else ((0, current),)
    return Piecewise(*items, (fork, candidate))


class Retune(Algorithm):
    """MLtuner's tuning and online re-tuning of the training tunables in `space`.

    `space` (a `dt.Random`, or a dict of name -> distribution) gives the tunables and where
    candidates are drawn from; `initial` (a config naming at least those tunables, and any
    fixed hyper-parameters) is the setting to start from, tried as one of the first branches.
    `max_steps` bounds the training run; `branches` candidates are tried at a time in a
    tuning round, first for `trial_steps` steps, doubled up to `max_trial_steps` (default: a
    fifth of `max_steps`); a tuning tries at most `max_settings` settings; at most
    `max_retunes` re-tunings follow the first tuning; `windows` is the summarizer's K.
    ``tune_initial=False`` trains `initial` from the start without tuning it (re-tunings
    only). After the run, `schedule` is the discovered config, `winner` its trial, `rounds`
    the tuning history and `converged` whether a re-tuning found the model converged.
    """

    def __init__(
        self,
        space: Random | Mapping[str, Any],
        metric: str,
        mode: str = "min",
        max_steps: int = 100,
        initial: Mapping[str, Any] | None = None,
        branches: int = 4,
        trial_steps: int = 4,
        max_trial_steps: int | None = None,
        max_retunes: int = 5,
        windows: int = 10,
        seed: int = 0,
        max_settings: int = 20,
        tune_initial: bool = True,
    ):
        super().__init__(metric, mode)
        owner = type(self).__name__
        check_positive(
            owner,
            max_steps=max_steps,
            branches=branches,
            trial_steps=trial_steps,
            max_trial_steps=max_trial_steps,
            max_settings=max_settings,
        )
        if max_settings < branches:
            raise ValueError(f"{owner}.max_settings must be at least branches={branches}, got {max_settings}")
        if not isinstance(tune_initial, bool):
            raise ValueError(f"{owner}.tune_initial must be True or False, got {tune_initial!r}")
        if not tune_initial and initial is None:
            raise ValueError(f"{owner}: tune_initial=False needs an initial setting to train")
        check_int(f"{owner}.max_retunes", max_retunes, minimum=0)
        check_int(f"{owner}.windows", windows, minimum=2)
        check_int(f"{owner}.seed", seed)
        if trial_steps >= max_steps:
            raise ValueError(
                f"{owner}.trial_steps must be less than max_steps={max_steps}, got {trial_steps!r}"
            )
        max_trial_steps = max_trial_steps or max(trial_steps, max_steps // 5)
        if max_trial_steps < trial_steps:
            raise ValueError(
                f"{owner}.max_trial_steps must be at least trial_steps={trial_steps}, got {max_trial_steps!r}"
            )
        if isinstance(space, Random):
            space = Random(space.space, n=None, seed=seed, where=space.where)
        elif isinstance(space, Mapping) and space:
            space = Random(space, n=None, seed=seed)
        else:
            raise ValueError(
                f"{owner}.space must be a dt.Random or a dict of name -> distribution, got {space!r}"
            )
        self.tunables = space.names
        if initial is not None:
            initial = normalize_config(initial, owner=f"{owner}.initial")
            missing = sorted(set(self.tunables) - set(initial))
            if missing:
                raise ValueError(
                    f"{owner}.initial must name every tunable of the space; {missing} are missing"
                )
        self.initial: Config | None = initial
        self.max_steps = max_steps
        self.branches = branches
        self.trial_steps = trial_steps
        self.max_trial_steps = max_trial_steps
        self.max_retunes = max_retunes
        self.windows = windows
        self.seed = seed
        self.max_settings = max_settings
        self.tune_initial = tune_initial
        self.rounds: list[Round] = []
        self.winner: Trial | None = None
        self.converged = False  # a re-tuning found nothing converging: no more re-tuning
        self._candidates: Iterator[Config] = space.sampler()
        self._last_good = 0  # the winner's last completed step (a checkpoint)
        self._chunk = max(trial_steps, windows)
        self._done = False

    @property
    def schedule(self) -> Config | None:
        """The discovered config: the winner's, or None before any round was won."""
        return None if self.winner is None else self.winner.config

    def best_trial(self) -> Trial | None:
        """The final winner (a losing branch may have ended on a luckily better value)."""
        return self.winner

    # ---- callbacks

    def start(self, ctx: Context) -> list[Decision]:
        if self.tune_initial:
            return self._tune(0, self.initial, self.trial_steps)
        # MLtuner §5.5: no initial tuning; `initial` trains as the winner of a round of one
        self.rounds.append(Round(0, self.trial_steps, None, 1, tuned=False))
        return [Submit(self.initial, min(self._chunk, self.max_steps), tag=0)]

    def on_result(self, trial: Trial, step: int, metrics: dict[str, float]) -> None:
        self.check_metric(metrics)

    def on_complete(self, trial: Trial) -> list[Decision]:
        return self._on_done(trial)

    def on_end(self, trial: Trial) -> list[Decision]:
        self.check_ended(trial)
        return self._on_done(trial)

    def is_finished(self) -> bool:
        return self._done

    # ---- the loop

    def _branches(self) -> list[Trial]:
        """The trials of the current round (the round's index is their tag)."""
        return [t for t in self.trials if t.tag == len(self.rounds) - 1]

    def _on_done(self, trial: Trial) -> list[Decision]:
        if self._done:
            return []
        current = self.rounds[-1]
        if not current.tuned and current.winner is None:  # `initial`, trained untuned
            current.branches = [trial]
            current.winner = self.winner = trial
        if trial is current.winner:
            return self._train_on(trial)
        branches = self._branches()
        end = current.fork + current.trial_steps
        ready = len(branches) == current.size and all(
            b.status != PENDING and (b.status != COMPLETED or b.steps >= end) for b in branches
        )  # counts and steps too: a decision applied before the others may finish at once
        return self._judge(current, branches) if current.winner is None and ready else []

    def _tune(self, fork: int, base: Config | None, trial_steps: int) -> list[Decision]:
        """Start a tuning round at `fork`: `base` kept as it is, plus sampled candidates."""
        end = min(fork + trial_steps, self.max_steps)
        before = [r for r in self.rounds if r.tuned]
        bound = before[-1].size if before else self.max_settings  # §4.4: no more than before
        settings = [self._branch(base, fork) for _ in range(min(self.branches, bound - (base is not None)))]
        # the kept setting goes last: its results may be known already (a winner that
        # diverged), and a trial that finishes inside its submit should find its round
        # complete (see `_on_done`) and the session with the other branches pending
        settings += [] if base is None else [base]
        self.rounds.append(Round(fork, end - fork, base, len(settings)))
        return [Submit(config, end, tag=len(self.rounds) - 1) for config in settings]

    def _branch(self, base: Config | None, fork: int) -> Config:
        """The config continuing `base` from `fork` with a sampled candidate."""
        candidate = next(self._candidates)
        if base is None:
            return candidate
        config = dict(base)
        for name in self.tunables:
            config[name] = _continue(base[name], fork, candidate[name]) if fork else candidate[name]
        return config

    def _progress(self, trial: Trial, after: int) -> Progress:
        """The summary of `trial`'s metric over its steps after `after`."""
        if trial.status != COMPLETED:  # diverged, failed
            return Progress(0.0, DIVERGED)
        curve = [(step, metrics) for step, metrics in trial.curve if step > after]
        sign = 1.0 if self.mode == "min" else -1.0
        losses = [sign * metrics.get(self.metric, math.nan) for _, metrics in curve]
        return summarize_progress([step for step, _ in curve], losses, self.windows)

    def _judge(self, current: Round, branches: list[Trial]) -> list[Decision]:
        """Every branch of the round reached the trial time: crown one or try longer."""
        current.branches = branches
        current.progress = {t.id: self._progress(t, current.fork) for t in branches}
        alive = [t for t in branches if current.progress[t.id].label != DIVERGED]
        converging = [t for t in alive if current.progress[t.id].label == CONVERGING]
        if converging:  # the trial time is decided: search on with it, or crown the fastest
            current.decided = True
            speeds = sorted((current.progress[t.id].speed for t in converging), reverse=True)
            settled = len(speeds) >= TOP and speeds[TOP - 1] > (1.0 - WITHIN) * speeds[0]
            more = 0 if settled else min(self.branches, self._room(current))
            if more:
                current.size += more
                end = current.fork + current.trial_steps
                return [
                    Submit(self._branch(current.base, current.fork), end, tag=len(self.rounds) - 1)
                    for _ in range(more)
                ]
            speed = current.progress
            return self._crown(current, max(converging, key=lambda t: (speed[t.id].speed, -t.id)))
        longer = 2 * current.trial_steps
        if longer <= self.max_trial_steps and current.fork + longer <= self.max_steps:
            return self._lengthen(current, alive, longer)
        if not alive:
            self._done = True
            return []
        # Nothing converges with the longest trial time. In a re-tuning this means the model
        # has converged (§4.4): no more re-tuning. Speeds are then noise, so the branch with
        # the best metric trains on.
        self.converged = len(self.rounds) > 1
        return self._crown(current, max(alive, key=lambda t: (self.score(t.metrics), -t.id)))

    def _crown(self, current: Round, winner: Trial) -> list[Decision]:
        current.winner = self.winner = winner
        self._last_good = winner.steps
        self._chunk = max(current.trial_steps, self.windows)
        if winner.steps >= self.max_steps:
            self._done = True
            return []
        return [Extend(winner.id, min(winner.steps + self._chunk, self.max_steps))]

    def _lengthen(self, current: Round, alive: list[Trial], longer: int) -> list[Decision]:
        """Double the trial time: extend the live branches and, as MLtuner's Algorithm 1
        asks its searcher for a setting at every doubling, add a new one (one per diverged
        branch, at least one)."""
        new = min(max(1, current.size - len(alive)), self._room(current))
        if not alive and new <= 0:
            self._done = True
            return []
        current.trial_steps = longer
        end = current.fork + longer
        current.size += new
        decisions: list[Decision] = [Extend(t.id, end) for t in alive]
        decisions += [
            Submit(self._branch(current.base, current.fork), end, tag=len(self.rounds) - 1)
            for _ in range(new)
        ]
        return decisions

    def _room(self, current: Round) -> int:
        """How many more settings `current` may try: a tuning `max_settings`, a re-tuning no
        more than the tuning before it (§4.4)."""
        before = [r for r in self.rounds[:-1] if r.tuned]
        return max(0, (before[-1].size if before else self.max_settings) - current.size)

    def _train_on(self, winner: Trial) -> list[Decision]:
        """The winner finished a chunk (or diverged in it): go on, re-tune or stop."""
        if winner.status == PENDING:
            # extended already: a completion that came after the `Extend` (a resumed session's
            # winner whose steps were all known); the extended chunk's own completion decides
            return []
        can_retune = not self.converged and len(self.rounds) - 1 < self.max_retunes
        if winner.status == COMPLETED:
            self._last_good = winner.steps
            if winner.steps >= self.max_steps:
                self._done = True
                return []
            plateau = self._progress(winner, winner.steps - self._chunk).label != CONVERGING
            if not (plateau and can_retune):
                return [Extend(winner.id, min(winner.steps + self._chunk, self.max_steps))]
        elif not can_retune:  # diverged or failed, and no re-tuning left
            self._done = True
            return []
        return self._tune(self._last_good, winner.config, self.rounds[-1].trial_steps)
