"""The stage tree built from the search plan (Hippo Alg. 1, Figures 3-5).

The property tests build random plans (random trials, checkpoints, metrics, cancellations and
running tasks) and check the tree against brute force: the values every trial is trained
with, step by step, and the set of (prefix of values, step) pairs trained.

The worked example (``TRIAL1`` ... ``TRIAL5``, ``test_figure*``) follows Section 3 of
../shared/papers/hippo-paper.txt. The text gives the value set {0.1, 0.05, 0.02, 0.01}
(lines 260-261), trial 1's values (lines 261-265: 0.1 for 200 steps, then 0.01 for 100),
trial 2's three stages of 100 steps (lines 265-266), that trials 2-4 share 0.1 for their
first 100 steps (lines 275-277) and that B1 is shared by three trials (lines 288-289), and
trial 5's split of A2 into A3 (steps 100-150) and A4 (steps 150-200), with its last stage F
after A3 (lines 308-316; Figure 5's caption, lines 320-325: trial 5 shares A1 and A3 with
trial 1). The other values are in the figures, which the text extraction lacks. Trial 4's
values are reconstructed (the paper's text does not give them), and so are the later values
of trials 2 and 3: B1 = 0.05 over [100, 200) shared by trials 2-4, which then take 0.02,
0.01 and 0.05, so that the plan has the figures' shape. Trial 5's F = 0.01 is the only
figure label the thesis extraction keeps (../shared/papers/hippo-thesis.txt, line 502, "A
0.1 F 0.01").

Our stages end only where a request needs metrics or where another trial branches off, not
where a trial's own value changes. So Figure 4's A2 (steps 100-200) and trial 1's 0.01 stage
after it (200-300) are one stage [100, 300) here, and Figure 5's A4 (150-200) and that same
0.01 stage are one stage [150, 300): the figures draw them split because the paper cuts
stages at every change of value (lines 271-273), and no trial branches off trial 1 at 200.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from strategies import brute_unique_steps, more_examples, prefixes, step_values, trial_lists

import dagtune as dt
from dagtune.config import normalize_config
from dagtune.plan import SearchPlan, StageTree, build_stage_tree
from dagtune.records import CheckpointInfo

CKPT = CheckpointInfo(nbytes=1, sha256="0" * 64)


# ----------------------------------------------------------------------------- fakes


class FakeInFlight:
    """Running tasks: task id -> (node, progress, end); the task has trained its node's path up
    to `progress` and will deliver every point ``(node, t)`` with ``progress < t <= end``."""

    def __init__(self, tasks: dict[str, tuple[str, int, int]]):
        self.tasks = tasks
        self.claims: list[tuple[str, str, int]] = []  # (task, node, step)

    def claim(self, node: str, step: int) -> str | None:
        for task, (n, progress, end) in self.tasks.items():
            if n == node and progress < step <= end:
                self.claims.append((task, node, step))
                return task
        return None

    def latest_before(self, node: str, step: int) -> tuple[int, str] | None:
        best = None
        for task, (n, progress, end) in self.tasks.items():
            if n == node and progress < end < step and (best is None or end > best[0]):
                best = (end, task)
        if best is not None:
            self.claims.append((best[1], node, best[0]))
        return best


# ----------------------------------------------------------------------------- scenarios


@dataclass
class Scenario:
    plan: SearchPlan
    trials: list[tuple[dict, int]]
    nodes: list[str]  # the node each trial's request was added at
    paths: list[list[tuple]]  # paths[i][t]: prefix of trial i's values over steps [0, t)
    active: list[int]  # trials still waiting (not cancelled, no metrics yet)
    # what exists before the tree is built, by owned point (node, step) -> prefix at that point
    checkpoints: dict[tuple[str, int], tuple]
    running: dict[tuple[str, int], tuple]  # points running tasks will deliver
    in_flight: FakeInFlight | None


def make_scenario(trials, checkpoints=(), metrics=(), cancel=(), tasks=()) -> Scenario:
    """`checkpoints`/`metrics`: (trial, step) pairs recorded on the trial's path, step 0 meaning
    the trial's last step and -1 its node's branch step; `cancel`: trials whose request is
    removed; `tasks`: (trial, progress, end) running on the trial's node."""
    plan = SearchPlan()
    trials = [(normalize_config(c), s) for c, s in trials]
    nodes = [plan.add_request(config, steps, waiter=i) for i, (config, steps) in enumerate(trials)]
    paths = [prefixes(config, steps) for config, steps in trials]

    def point(i, k):
        return (plan.owner(nodes[i], k), k)

    known: dict[tuple[str, int], tuple] = {}  # owned point -> prefix; one prefix per point
    prefix_points: dict[tuple, tuple[str, int]] = {}  # and one point per prefix

    def register(i, k):
        p, prefix = point(i, k), paths[i][k]
        assert known.setdefault(p, prefix) == prefix, f"two prefixes at point {p}"
        assert prefix_points.setdefault(prefix, p) == p, f"one prefix at two points {p}"
        return p

    def step(i, k):
        if k == -1 and plan.nodes[nodes[i]].start > 0:
            return plan.nodes[nodes[i]].start
        return trials[i][1] if k <= 0 else min(k, trials[i][1])

    saved = {}
    for i, k in checkpoints:
        k = step(i, k)
        plan.record_checkpoint(nodes[i], k, CKPT)
        saved[register(i, k)] = paths[i][k]
    for i, k in metrics:
        k = step(i, k)
        plan.record_metrics(nodes[i], k, {"loss": 1.0})
        register(i, k)
    for i in set(cancel):
        plan.remove_request(nodes[i], trials[i][1], i)
    in_flight, running = None, {}
    if tasks:
        table = {}
        for n, (i, progress, end) in enumerate(tasks):
            start = plan.nodes[nodes[i]].start
            end = start + 1 + end % (trials[i][1] - start)  # in (start, steps]
            progress = start + progress % (end - start)  # in [start, end)
            table[f"task{n}"] = (nodes[i], progress, end)
            for t in range(progress + 1, end + 1):
                running[register(i, t)] = paths[i][t]
        in_flight = FakeInFlight(table)
    active = [
        i
        for i, (config, steps) in enumerate(trials)
        if i not in set(cancel) and plan.metrics_at(nodes[i], steps) is None
    ]
    return Scenario(plan, trials, nodes, paths, active, saved, running, in_flight)


# ----------------------------------------------------------------------------- checking a tree


def check_tree(sc: Scenario, tree: StageTree) -> dict[int, list[tuple]]:
    """Structural checks; returns, per stage, the prefixes at steps start..end along its path."""
    plan = sc.plan
    along: dict[int, list[tuple]] = {}
    for stage in tree.stages:
        assert tree.stages[stage.index] is stage
        assert stage.start < stage.end, f"empty stage {stage}"
        assert stage.start >= plan.nodes[stage.node].start
        for child in stage.children:
            assert tree.stages[child].parent == stage.index
            assert tree.stages[child].start == stage.end

    def prefixes_of(stage):
        if stage.index in along:
            return along[stage.index]
        if stage.source == "stage":
            parent = tree.stages[stage.parent]
            assert stage.index in parent.children
            base = prefixes_of(parent)[-1]
        else:
            assert stage.parent is None
            if stage.source == "scratch":
                assert stage.start == 0
                base = ()
            elif stage.source == "checkpoint":
                node, k = stage.source_point
                assert k == stage.start and k in plan.nodes[node].checkpoints, stage
                base = sc.checkpoints[(node, k)]
            elif stage.source == "running":
                node, k = stage.source_point
                assert k == stage.start
                assert (stage.source_task, node, k) in sc.in_flight.claims, stage
                base = sc.running[(node, k)]
            else:
                raise AssertionError(f"unknown source {stage.source!r}")
        config = plan.nodes[stage.node].config
        out = [base]
        for t in range(stage.start, stage.end):
            out.append((out[-1], step_values(config, t)))
        along[stage.index] = out
        return out

    for stage in tree.stages:
        prefixes_of(stage)
    return along


def needed_points(sc: Scenario) -> set[tuple]:
    """Brute force: the (prefix, step) pairs the active requests still need trained: each from
    the latest state on its path that exists or will be delivered, before its own step."""
    available = set(sc.checkpoints.values()) | set(sc.running.values())
    need = set()
    for i in sc.active:
        steps = sc.trials[i][1]
        path = sc.paths[i]
        if path[steps] in sc.running.values():
            continue  # a running task delivers it, with its metrics
        begin = max((k for k in range(steps) if path[k] in available), default=0)
        need.update(path[begin + 1 : steps + 1])
    return need


def check_against_brute_force(sc: Scenario, tree: StageTree) -> None:
    along = check_tree(sc, tree)
    # (1) each active request's stage trains exactly the trial's values at every step
    delivered = set(sc.running.values())
    for i in sc.active:
        steps = sc.trials[i][1]
        ends = [s for s in tree.stages if s.node == sc.nodes[i] and s.end == steps and s.metrics_needed]
        if sc.paths[i][steps] in delivered:
            assert ends == []
            continue
        assert len(ends) == 1, (i, ends)
        assert along[ends[0].index] == sc.paths[i][ends[0].start : steps + 1]
    # every stage asked for metrics serves an active request
    wanted = {(sc.nodes[i], sc.trials[i][1]) for i in sc.active}
    assert all((s.node, s.end) in wanted for s in tree.stages if s.metrics_needed)
    # (2) nothing trained twice, nothing missing, nothing extra
    trained = Counter(p for s in tree.stages for p in along[s.index][1:])
    assert max(trained.values(), default=1) == 1, "a step is trained twice"
    assert set(trained) == needed_points(sc)
    assert sum(trained.values()) == tree.total_steps
    # (4) every chain starts from the latest state available on its path: no checkpoint or
    # running task's point lies strictly inside a chain
    available = set(sc.checkpoints.values()) | delivered
    for stage in tree.stages:
        assert not (set(along[stage.index][1:-1]) & available), stage
        if stage.source == "stage":
            assert along[stage.index][0] not in available, stage
    check_wanted(sc, tree)


def check_wanted(sc: Scenario, tree: StageTree) -> None:
    """`tree.wanted` is exactly what the tree relies on running tasks for: the requests they
    serve and the points stages start from, each claimed from the task that delivers it."""
    if sc.in_flight is None:
        assert tree.wanted == {}
        return
    listed = [(task, point) for task, points in tree.wanted.items() for point in points]
    assert len({point for _, point in listed}) == len(listed), "a point wanted from two tasks"
    sources = {(s.source_task, s.source_point) for s in tree.stages if s.source == "running"}
    assert sources <= set(listed)
    served = {
        (sc.nodes[i], sc.trials[i][1])
        for i in sc.active
        if sc.paths[i][sc.trials[i][1]] in sc.running.values()
    }
    assert {point for _, point in listed} == {point for _, point in sources} | served
    for task, (node, step) in listed:
        assert (task, node, step) in sc.in_flight.claims
        assert (node, step) in sc.running  # the task does pass that point
        assert sc.in_flight.tasks[task][0] == node


# ----------------------------------------------------------------------------- properties

# (trial, step): any step, or (0) the trial's last step, or (-1) its branch step
events = st.lists(st.tuples(st.integers(0, 9), st.integers(-1, 30) | st.integers(-1, 0)), max_size=6)


@more_examples()
@given(trial_lists())
def test_fresh_plan_tree_trains_exactly_the_unique_steps(trials):
    sc = make_scenario(trials)
    tree = build_stage_tree(sc.plan)
    check_against_brute_force(sc, tree)
    assert tree.total_steps == brute_unique_steps(sc.trials) == dt.unique_steps(trials)
    assert all(s.source in ("scratch", "stage") for s in tree.stages)


@more_examples()
@given(trial_lists(), events, events, st.sets(st.integers(0, 9)))
# found by hypothesis: a checkpoint without metrics at a request's step where another trial
# branches; the branch used to wait for the stage retraining that point for its metrics
@example(
    trials=[({"lr": 0.1}, 5), ({"lr": 0.05}, 1), ({"lr": dt.Exponential(0.05, 0.5)}, 5)],
    checkpoints=[(1, 0)],
    metrics=[],
    cancel=set(),
)
def test_tree_with_checkpoints_metrics_and_cancellations(trials, checkpoints, metrics, cancel):
    n = len(trials)
    sc = make_scenario(
        trials,
        checkpoints=[(i % n, k) for i, k in checkpoints],
        metrics=[(i % n, k) for i, k in metrics],
        cancel=[i % n for i in cancel],
    )
    tree = build_stage_tree(sc.plan)
    check_against_brute_force(sc, tree)
    # cancelled requests are gone; what remains trains the unique steps of the active trials
    # minus what checkpoints already hold
    if not checkpoints and not metrics:
        assert tree.total_steps == brute_unique_steps([sc.trials[i] for i in sc.active])
    # a second build of the same plan is the same tree
    again = build_stage_tree(sc.plan)
    assert [(s.node, s.start, s.end, s.source, s.parent) for s in again.stages] == [
        (s.node, s.start, s.end, s.source, s.parent) for s in tree.stages
    ]


tasks = st.lists(st.tuples(st.integers(0, 9), st.integers(0, 30), st.integers(0, 30)), min_size=1, max_size=3)


@more_examples()
@given(trial_lists(), events, st.sets(st.integers(0, 9)), tasks)
@example(  # found by hypothesis (the same bug, next to a running task)
    trials=[
        ({"bs": 0.01, "lr": 0.05}, 5),
        ({"bs": dt.MultiStep(0.01, [5], 0.5), "lr": 0.05}, 5),
        ({"bs": 0.01, "lr": 0.05}, 10),
    ],
    checkpoints=[(1, 0)],
    cancel=set(),
    running=[(0, 0, 0)],
)
def test_tree_with_running_tasks(trials, checkpoints, cancel, running):
    n = len(trials)
    sc = make_scenario(
        trials,
        checkpoints=[(i % n, k) for i, k in checkpoints],
        cancel=[i % n for i in cancel],
        tasks=[(i % n, p, e) for i, p, e in running],
    )
    tree = build_stage_tree(sc.plan, sc.in_flight)
    check_against_brute_force(sc, tree)


# ----------------------------------------------------------------------------- Hippo's example


def lr_trial(values, milestones, steps=300):
    return {"lr": dt.Steps(values, milestones)}, steps


# Figure 3: four trials; trial 5 arrives in Figure 5
TRIAL1 = lr_trial([0.1, 0.01], [200])
TRIAL2 = lr_trial([0.1, 0.05, 0.02], [100, 200])
TRIAL3 = lr_trial([0.1, 0.05, 0.01], [100, 200])
TRIAL4 = lr_trial([0.1, 0.05, 0.05], [100, 200])  # 0.05 from 100 on: no switch at 200
TRIAL5 = lr_trial([0.1, 0.01], [150])


def add(plan, trial, waiter):
    config, steps = trial
    return plan.add_request(normalize_config(config), steps, waiter)


def shape(tree: StageTree, names: dict[str, str]) -> set[tuple]:
    """The tree as {(node name, start, end, source, parent's (node name, start) or source point)}."""
    out = set()
    for s in tree.stages:
        if s.source == "stage":
            up = tree.stages[s.parent]
            link = (names[up.node], up.start)
        elif s.source_point is not None:
            link = (names[s.source_point[0]], s.source_point[1])
        else:
            link = None
        out.add((names[s.node], s.start, s.end, s.source, link, s.metrics_needed))
    return out


@pytest.fixture
def figure3():
    plan = SearchPlan()
    ids = [add(plan, trial, i) for i, trial in enumerate([TRIAL1, TRIAL2, TRIAL3, TRIAL4], start=1)]
    names = {ids[0]: "T1", ids[1]: "T2", ids[2]: "T3", ids[3]: "T4"}
    return plan, ids, names


def test_figure3_plan(figure3):
    plan, (t1, t2, t3, t4), _ = figure3
    assert len(plan.nodes) == 4
    assert (plan.nodes[t1].parent, plan.nodes[t1].start) == (None, 0)
    assert (plan.nodes[t2].parent, plan.nodes[t2].start) == (t1, 100)
    # trial 3 follows trial 2's node through 0.05 and branches at 200; so does trial 4,
    # whose own value does not switch at 200 but trial 2's does
    assert (plan.nodes[t3].parent, plan.nodes[t3].start) == (t2, 200)
    assert (plan.nodes[t4].parent, plan.nodes[t4].start) == (t2, 200)


def test_figure4_tree(figure3):
    plan, _, names = figure3
    tree = build_stage_tree(plan)
    # A1 shared by all; trial 1's A2 and D are one stage (its switch at 200 is no boundary);
    # B1 shared by trials 2-4
    assert shape(tree, names) == {
        ("T1", 0, 100, "scratch", None, False),  # A1
        ("T1", 100, 300, "stage", ("T1", 0), True),  # A2 + D
        ("T2", 100, 200, "stage", ("T1", 0), False),  # B1
        ("T2", 200, 300, "stage", ("T2", 100), True),  # C (0.02)
        ("T3", 200, 300, "stage", ("T2", 100), True),  # 0.01
        ("T4", 200, 300, "stage", ("T2", 100), True),  # 0.05
    }
    assert tree.total_steps == 700 == dt.unique_steps([TRIAL1, TRIAL2, TRIAL3, TRIAL4])
    assert [s.start for s in tree.roots] == [0]


def test_figure5_tree_after_trial5(figure3):
    plan, ids, names = figure3
    before = {i: (plan.nodes[i].parent, plan.nodes[i].start) for i in ids}
    t5 = add(plan, TRIAL5, 5)
    names[t5] = "T5"
    assert (plan.nodes[t5].parent, plan.nodes[t5].start) == (ids[0], 150)
    assert {i: (plan.nodes[i].parent, plan.nodes[i].start) for i in ids} == before  # append-only
    tree = build_stage_tree(plan)
    # A2 splits into A3 [100, 150) and A4 [150, 300) (A4 and E are one stage); F follows A3
    assert shape(tree, names) == {
        ("T1", 0, 100, "scratch", None, False),  # A1
        ("T1", 100, 150, "stage", ("T1", 0), False),  # A3
        ("T1", 150, 300, "stage", ("T1", 100), True),  # A4 + E
        ("T5", 150, 300, "stage", ("T1", 100), True),  # F
        ("T2", 100, 200, "stage", ("T1", 0), False),  # B1
        ("T2", 200, 300, "stage", ("T2", 100), True),
        ("T3", 200, 300, "stage", ("T2", 100), True),
        ("T4", 200, 300, "stage", ("T2", 100), True),
    }
    assert tree.total_steps == 850


def test_checkpoint_at_the_branch_step_is_used(figure3):
    plan, ids, names = figure3
    t5 = add(plan, TRIAL5, 5)
    names[t5] = "T5"
    plan.record_checkpoint(ids[1], 100, CKPT)  # the state after A1, reached through trial 2's path
    assert plan.nodes[ids[0]].checkpoints == {100: CKPT}  # owned by the root
    tree = build_stage_tree(plan)
    assert shape(tree, names) == {
        # A1 is gone; both children of the branch at 100 resume from the checkpoint
        ("T1", 100, 150, "checkpoint", ("T1", 100), False),
        ("T1", 150, 300, "stage", ("T1", 100), True),
        ("T5", 150, 300, "stage", ("T1", 100), True),
        ("T2", 100, 200, "checkpoint", ("T1", 100), False),
        ("T2", 200, 300, "stage", ("T2", 100), True),
        ("T3", 200, 300, "stage", ("T2", 100), True),
        ("T4", 200, 300, "stage", ("T2", 100), True),
    }
    assert all(s.ready == (s.source == "checkpoint") for s in tree.stages)


def test_checkpoints_inside_segments_and_finished_requests(figure3):
    plan, ids, names = figure3
    plan.record_checkpoint(ids[0], 60, CKPT)
    plan.record_checkpoint(ids[0], 250, CKPT)
    plan.record_checkpoint(ids[1], 200, CKPT)  # end of B1
    plan.record_checkpoint(ids[2], 300, CKPT)  # trial 3 done ...
    plan.record_metrics(ids[2], 300, {"acc": 0.9})  # ... with its metrics
    tree = build_stage_tree(plan)
    # (the checkpoint at 60 serves nothing: the branch at 100 leads only to B1's checkpoint)
    assert shape(tree, names) == {
        ("T1", 250, 300, "checkpoint", ("T1", 250), True),
        ("T2", 200, 300, "checkpoint", ("T2", 200), True),
        ("T4", 200, 300, "checkpoint", ("T2", 200), True),
    }


def test_a_checkpoint_is_preferred_to_a_stage_retraining_the_same_point(figure3):
    # trial 6 wants metrics at step 100 on the root; the checkpoint at 100 has none, so a stage
    # retrains [0, 100) for them, but trial 2's branch must not wait for it
    plan, ids, names = figure3
    plan.record_checkpoint(ids[0], 100, CKPT)
    add(plan, lr_trial([0.1], [], 100), 6)
    tree = build_stage_tree(plan)
    assert shape(tree, names) == {
        ("T1", 0, 100, "scratch", None, True),
        ("T1", 100, 300, "checkpoint", ("T1", 100), True),
        ("T2", 100, 200, "checkpoint", ("T1", 100), False),
        ("T2", 200, 300, "stage", ("T2", 100), True),
        ("T3", 200, 300, "stage", ("T2", 100), True),
        ("T4", 200, 300, "stage", ("T2", 100), True),
    }


def test_root_level_request_is_served(figure3):
    plan, ids, names = figure3
    node = add(plan, lr_trial([0.1], [], 50), 6)  # ends inside the root segment
    assert node == ids[0]
    tree = build_stage_tree(plan)
    assert ("T1", 0, 50, "scratch", None, True) in shape(tree, names)
    assert ("T1", 50, 100, "stage", ("T1", 0), False) in shape(tree, names)
    assert tree.total_steps == 700
    # once its metrics are in, the stage boundary at 50 disappears
    plan.record_metrics(node, 50, {"acc": 0.5})
    assert ("T1", 0, 100, "scratch", None, False) in shape(build_stage_tree(plan), names)


def test_cancelled_trial_vanishes(figure3):
    plan, ids, names = figure3
    t5 = add(plan, TRIAL5, 5)
    plan.remove_request(t5, 300, 5)
    # node ids are content hashes: the same in a plan that never saw trial 5
    assert shape(build_stage_tree(plan), names) == shape(
        build_stage_tree(figure3_plan_without_trial5()), names
    )
    for waiter, node in ((2, ids[1]), (3, ids[2]), (4, ids[3])):
        plan.remove_request(node, 300, waiter)
    assert shape(build_stage_tree(plan), names) == {("T1", 0, 300, "scratch", None, True)}
    plan.remove_request(ids[0], 300, 1)
    assert len(build_stage_tree(plan)) == 0


def figure3_plan_without_trial5():
    plan = SearchPlan()
    for i, trial in enumerate([TRIAL1, TRIAL2, TRIAL3, TRIAL4], start=1):
        add(plan, trial, i)
    return plan


def test_request_shared_by_two_waiters_stays_until_both_leave(figure3):
    plan, ids, names = figure3
    add(plan, ({"lr": dt.Piecewise((0, 0.1), (200, 0.01))}, 300), "twin")  # trial 1 written differently
    assert len(plan.nodes) == 4
    plan.remove_request(ids[0], 300, 1)
    assert ("T1", 100, 300, "stage", ("T1", 0), True) in shape(build_stage_tree(plan), names)
    plan.remove_request(ids[0], 300, "twin")
    assert all(s.node != ids[0] or s.end == 100 for s in build_stage_tree(plan).stages)


# ----------------------------------------------------------------------------- running tasks


def test_branch_in_a_running_stage_is_claimed_from_the_task():
    plan = SearchPlan()
    root = add(plan, TRIAL1, 1)
    running = FakeInFlight({"task-A": (root, 50, 300)})  # trains [0, 300), now at step 50
    t5 = add(plan, TRIAL5, 5)  # branches at 150, which the task has not reached yet
    tree = build_stage_tree(plan, running)
    assert ("task-A", root, 150) in running.claims  # the task will checkpoint at 150
    assert ("task-A", root, 300) in running.claims  # and still serves trial 1
    # the tree exposes both as data: the plan wants the running task to deliver them
    assert tree.wanted == {"task-A": {(root, 150), (root, 300)}}
    assert [(s.node, s.start, s.end, s.source, s.source_task, s.source_point) for s in tree.stages] == [
        (t5, 150, 300, "running", "task-A", (root, 150))
    ]
    assert tree.total_steps == 150  # zero recomputation


def test_branch_behind_a_running_task_recomputes_from_the_latest_checkpoint():
    plan = SearchPlan()
    root = add(plan, TRIAL1, 1)
    running = FakeInFlight({"task-A": (root, 200, 300)})  # already past 150
    t5 = add(plan, TRIAL5, 5)
    tree = build_stage_tree(plan, running)
    assert sorted((s.start, s.node, s.end, s.source) for s in tree.stages) == [
        (0, root, 150, "scratch"),
        (150, t5, 300, "stage"),
    ]
    plan.record_checkpoint(root, 100, CKPT)
    tree = build_stage_tree(plan, running)
    assert sorted((s.start, s.node, s.end, s.source, s.source_point) for s in tree.stages) == [
        (100, root, 150, "checkpoint", (root, 100)),
        (150, t5, 300, "stage", None),
    ]
    assert ("task-A", root, 150) not in running.claims
    assert tree.wanted == {"task-A": {(root, 300)}}  # trial 1 only: the task is past 150


def test_request_beyond_a_running_stage_continues_from_its_end():
    plan = SearchPlan()
    root = add(plan, lr_trial([0.1], [], 100), 1)
    running = FakeInFlight({"task-A": (root, 30, 100)})
    add(plan, lr_trial([0.1], [], 160), 2)  # same node, further
    tree = build_stage_tree(plan, running)
    assert [(s.start, s.end, s.source, s.source_task) for s in tree.stages] == [
        (100, 160, "running", "task-A")
    ]
    assert tree.wanted == {"task-A": {(root, 100)}}  # trial 1's metrics, trial 2's state
    # a checkpoint later than the task's end wins
    plan.record_checkpoint(root, 120, CKPT)
    tree = build_stage_tree(plan, running)
    assert [(s.start, s.end, s.source) for s in tree.stages] == [(120, 160, "checkpoint")]
    assert tree.wanted == {"task-A": {(root, 100)}}  # trial 1's metrics only


def test_ranks_follow_request_order():
    plan = SearchPlan()
    ids = [add(plan, trial, i) for i, trial in enumerate([TRIAL4, TRIAL1, TRIAL5], start=1)]
    tree = build_stage_tree(plan)
    by_end = {(s.node, s.end): s.rank for s in tree.stages}
    assert by_end[(ids[0], 300)] == 0 and by_end[(ids[1], 300)] == 1 and by_end[(ids[2], 300)] == 2
    # a shared stage inherits the earliest rank of the requests it leads to
    assert all(s.rank == 0 for s in tree.stages if s.start == 0)
