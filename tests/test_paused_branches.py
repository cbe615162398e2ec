"""Where paused trials and announced configs would branch off a segment
(`LaterBranches.within`, issue 24).

The completed trials on a node are grouped by config and each group's branch step is
searched once: a chain of trials extended a step at a time (each a new trial of an equal
config, as `perf/dispatch.py`'s chained stages submit them) costs the same per stage at any
depth, counted, where every earlier trial of the chain was compared from its own end (the
chained stages slowed from 20 to 76 ms at depth 300). The grouping answers exactly as
comparing every paused trial does, on random plans. Announced configs (`expect`: ASHA's
configs not yet submitted) are compared only where they agree with a node at step 0 and at
its start, counted flat where they all share a warm-up, and answer as comparing every one.
"""

from __future__ import annotations

import random

import dagtune as dt
import dagtune.config
from dagtune.config import config_first_difference
from dagtune.coordinator._branches import LaterBranches
from dagtune.plan import SearchPlan
from dagtune.records import COMPLETED, PENDING, Trial
from dagtune.sim import SimulatedExecutor, SyntheticTrainer
from dagtune.study import Study
from dagtune.tasks import Segment
from perf.asha_warmup import measure

STEPS = 12


def schedule(values: list[float]) -> dict:
    """A config whose lr changes at every step (a new object each call: equal, not identical)."""
    return {"lr": dt.Steps(list(values), list(range(1, len(values))))}


def by_every_trial(plan: SearchPlan, paused: dict[int, Trial], segment: Segment) -> set[int]:
    """The steps the paused trials branch off at, each compared from its own end (what
    `LaterBranches` answered before it grouped them)."""
    steps = set()
    for trial in paused.values():
        if trial.node != segment.node or trial.steps > segment.start:
            continue
        branch = config_first_difference(segment.config, trial.config, trial.steps, segment.end)
        if segment.start < branch < segment.end:
            steps.add(branch)
    return steps


def test_the_groups_answer_as_comparing_every_paused_trial_does():
    rng = random.Random(0)
    base = [0.1 * (1 + i % 3) for i in range(STEPS + 4)]
    variants = [base] + [
        base[:cut] + [9.0 + rng.randrange(3) for _ in base[cut:]] for cut in rng.choices(range(1, STEPS), k=8)
    ]
    plan = SearchPlan()
    branches = LaterBranches(plan)
    paused: dict[int, Trial] = {}
    checked = found = 0
    for trial_id in range(300):
        if paused and rng.random() < 0.3:  # extended: it branches no more from where it paused
            trial = paused.pop(rng.choice(sorted(paused)))
            branches.resume(trial)
            trial.status = PENDING
            branches.resume(trial)  # a pending trial extended again: it was not paused
            if trial.steps < STEPS and rng.random() < 0.5:  # completes again further on
                trial.steps = rng.randrange(trial.steps + 1, STEPS + 1)
                trial.node = plan.locate(trial.config, trial.steps, create=True)
                trial.status = COMPLETED
                branches.pause(trial)
                paused[trial.id] = trial
        else:
            config = schedule(rng.choice(variants))  # equal configs come as different objects
            steps = rng.randrange(1, STEPS + 1)
            node = plan.locate(config, steps, create=True)
            trial = Trial(id=trial_id, config=config, steps=steps, status=COMPLETED, node=node)
            branches.pause(trial)
            paused[trial_id] = trial
        for _ in range(3):  # segments on random nodes, searches resumed further each time
            node = plan.nodes[rng.choice(sorted(plan.nodes))]
            start = rng.randrange(node.start, STEPS + 1)
            segment = Segment(node.id, node.config, start, rng.randrange(start + 1, STEPS + 5))
            expected = by_every_trial(plan, paused, segment)
            assert branches.within(segment) == expected, (segment.node, segment.start, segment.end)
            checked += 1
            found += bool(expected)
    assert checked == 900 and found >= 20  # branch steps were found, not only empty answers


def chained_stage_work(depths: tuple[int, ...], monkeypatch) -> dict[int, int]:
    """Config comparisons (`config_first_difference` calls: each walks the pieces between
    its bounds) spent on the stage that extends a simulated chain to each of `depths`: one
    trial per stage, each submitted with one step more and a new, equal config."""
    calls = 0
    compare = dagtune.config.config_first_difference

    def counted(*args):
        nonlocal calls
        calls += 1
        return compare(*args)

    for module in ("dagtune.coordinator._paused", "dagtune.plan._plan"):
        monkeypatch.setattr(f"{module}.config_first_difference", counted)
    values = [0.1 * (1 + i % 3) for i in range(max(depths) + 1)]
    work = {}
    with Study(SyntheticTrainer, name="chain", executor=SimulatedExecutor(2)) as study:
        for steps in range(1, max(depths) + 1):
            before = calls
            study.submit(schedule(values), steps).result()
            if steps in depths:
                work[steps] = calls - before
    return work


def test_a_chained_stage_compares_as_many_configs_at_depth_200_as_at_depth_20(monkeypatch):
    """Placing the new trial compares its config with its path once; the paused trials of
    the chain, one group, are searched once from where the last search stopped (before:
    once per earlier trial of the chain, from its own end: 19 calls at depth 20, 199 at 200)."""
    work = chained_stage_work((20, 200), monkeypatch)
    print(f"config comparisons per chained stage: {work}")
    assert work[200] == work[20] <= 2


def test_announced_configs_answer_as_comparing_every_one_does():
    rng = random.Random(1)
    base = [0.1 * (1 + i % 3) for i in range(STEPS + 4)]
    variants = [base] + [
        base[:cut] + [9.0 + rng.randrange(3) for _ in base[cut:]]
        for cut in rng.choices(range(1, STEPS), k=12)
    ]
    plan = SearchPlan()
    for values in variants[:6]:
        plan.locate(schedule(values), rng.randrange(1, STEPS + 1), create=True)
    prospects = [schedule(rng.choice(variants)) for _ in range(40)]
    branches = LaterBranches(plan)
    branches.expect(prospects)
    found = 0
    for _ in range(400):
        node = plan.nodes[rng.choice(sorted(plan.nodes))]
        start = rng.randrange(node.start, STEPS + 1)
        segment = Segment(node.id, node.config, start, rng.randrange(start + 1, STEPS + 5))
        expected = set()
        for config in prospects:  # each compared from step 0, as before the index by start
            branch = config_first_difference(node.config, config, 0, segment.end)
            if node.start < branch < segment.end and branch > segment.start:
                expected.add(branch)
        assert branches.within(segment) == expected, (segment.node, segment.start, segment.end)
        found += bool(expected)
    assert found >= 20  # branch steps were found, not only empty answers


def test_announced_configs_sharing_a_warm_up_cost_each_trial_the_same():
    """ASHA over configs that share their first step (`perf.asha_warmup`): about 2
    comparisons per trial at 60 and at 240 configs (ASHA's promotions vary it a
    little). Compared with every announced config of its step-0 values, the segments made
    about half as many comparisons per trial as there were configs (98 at 200, 394 at 800)."""
    assert measure(60)[1] <= 3 and measure(240)[1] <= 3  # (CPU ms, comparisons) per trial
