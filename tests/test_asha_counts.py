"""ASHA's rung bookkeeping costs the same per callback however many trials it has ranked
(issue 24), proved by counting, never by timing: ASHA driven alone (no study) through
1,000 and through 10,000 configs executes about as many lines of `dagtune/algos` and of
its sorted containers per callback, so no promotion decision sorts or walks a rung. And
its promotions are those of the definition: at every decision, a promoted trial was among
the top ``floor(n / eta)`` of its rung's n results so far and not promoted before.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

import sortedcontainers

import dagtune as dt
from dagtune.algos import ASHA, Context, Extend, Submit
from dagtune.records import COMPLETED, PENDING, Trial

#: the code counted: the algorithms and the sorted containers ASHA ranks its rungs in
COUNTED = (str(Path(dt.__file__).resolve().parent / "algos"), str(Path(sortedcontainers.__file__).parent))


class LineCounter:
    """Lines executed in `COUNTED` code while it is on (`sys.settrace`, this thread)."""

    def __init__(self) -> None:
        self.lines = 0

    def _local(self, frame, event, arg):
        if event == "line":
            self.lines += 1
        return self._local

    def _global(self, frame, event, arg):
        return self._local if frame.f_code.co_filename.startswith(COUNTED) else None

    def __enter__(self) -> LineCounter:
        sys.settrace(self._global)
        return self

    def __exit__(self, *exc) -> None:
        sys.settrace(None)


def drive(
    n: int, slots: int = 50, counter: LineCounter | None = None, check: bool = False
) -> tuple[int, list[tuple[int, int]]]:
    """Run ASHA over `n` configs, completing its oldest pending trial each time (a seeded
    random loss per trial and rung); returns the callbacks made and its promotions
    ``(trial, steps)`` in order. With `check`, each promotion is checked against its rung's
    results at that moment (a sort per promotion: small studies only)."""
    space = dt.Random({"lr": dt.loguniform(0.01, 0.3)}, n=n, seed=1)
    asha = ASHA(space, "loss", "min", max_steps=9, eta=3)
    rng = random.Random(0)
    trials: dict[int, Trial] = {}
    pending: list[int] = []
    results: dict[int, dict[int, float]] = {steps: {} for steps in asha.rungs}
    promotions: list[tuple[int, int]] = []
    callbacks = 0

    def apply(decisions) -> None:
        for decision in decisions or ():
            if isinstance(decision, Submit):
                trial = trials[len(trials)] = Trial(len(trials), decision.config, decision.steps)
            else:
                assert isinstance(decision, Extend)
                trial = trials[decision.trial]
                if check:
                    rung = asha.rungs[asha.rungs.index(decision.steps) - 1]
                    ranked = sorted(results[rung], key=lambda t: (results[rung][t], t))
                    top = ranked[: max(1 if not pending else 0, len(ranked) // asha.eta)]
                    assert trial.id in top and (trial.id, decision.steps) not in promotions
                promotions.append((trial.id, decision.steps))
                trial.steps = decision.steps
            trial.status = PENDING
            pending.append(trial.id)

    with counter or LineCounter():
        apply(asha.start(Context(slots=slots, seed=0)))
        while pending:
            trial = trials[pending.pop(0)]
            loss = rng.random()
            trial.status, trial.metrics = COMPLETED, {"loss": loss}
            results[trial.steps][trial.id] = loss
            callbacks += 1
            apply(asha.on_complete(trial))
    return callbacks, promotions


def test_a_callback_costs_the_same_lines_with_ten_times_the_trials():
    per_callback = {}
    for n in (1_000, 10_000):
        counter = LineCounter()
        callbacks, promotions = drive(n, counter=counter)
        assert callbacks >= n and len(promotions) >= n // 3  # every config ran, a third went on
        per_callback[n] = counter.lines / callbacks
    print(per_callback)
    # sorting a rung per decision would multiply the large count by ten or more; the sorted
    # containers' depth grows with log n (measured: 1.1x)
    assert per_callback[10_000] <= 1.3 * per_callback[1_000]


def test_promotions_are_those_of_the_definition_and_repeat():
    callbacks, promotions = drive(1_000, check=True)
    assert len(set(promotions)) == len(promotions) >= 1_000 // 3
    assert drive(1_000) == (callbacks, promotions)
