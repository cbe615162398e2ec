"""The incremental planner against the rebuild it replaces.

After random sequences of what a coordinator does to a plan (submit, extend, stop, metrics,
checkpoints committed and dropped, step costs measured, paths picked and launched, running
tasks advancing, restarting and ending), `IncrementalPlanner` must hold exactly what `build_stage_tree`
with `critical_path_priorities` and the policy's `pick` compute from scratch: the same
stages (numbered as the builder numbers them), sources, ranks, `wanted`, priorities, ready
set, pick order, demand and the schedule a view draws (`IncrementalPlanner.schedule_view`:
queued stages in the builder's order, the critical path). Running tasks are answered for the rebuild by `PathTasks`, an
`InFlight` written here independently of the planner's own table.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st
from strategies import more_examples, trial_lists

import dagtune as dt
from dagtune.config import normalize_config
from dagtune.plan import SearchPlan, build_stage_tree
from dagtune.planner import IncrementalPlanner
from dagtune.records import CheckpointInfo
from dagtune.scheduling import CostModel, critical_path_priorities, held_stages, policy_named, view_of_stages

CKPT = CheckpointInfo(nbytes=1, sha256="0" * 64)


class PathTasks:
    """Running path tasks: key -> (segments ``(node, start, end)``, progress), in launch
    order, answering `InFlight` as the coordinator does."""

    def __init__(self) -> None:
        self.tasks: dict[str, tuple[tuple[tuple[str, int, int], ...], int]] = {}

    def claim(self, node: str, step: int) -> str | None:
        for key, (segments, progress) in self.tasks.items():
            if progress < step and any(n == node and s < step <= e for n, s, e in segments):
                return key
        return None

    def latest_before(self, node: str, step: int) -> tuple[int, str] | None:
        best = None
        for key, (segments, progress) in self.tasks.items():
            for n, _, end in segments:
                if n == node and progress < end < step and (best is None or end > best[0]):
                    best = (end, key)
        return best


class Session:
    """A plan, a cost model, running tasks and the planner following them."""

    def __init__(self, trials, policy: str, tolerance: float):
        self.pool = [(normalize_config(c), s) for c, s in trials]
        self.plan = SearchPlan()
        self.cost = CostModel()
        self.policy = policy_named(policy)
        self.tolerance = tolerance
        self.planner = IncrementalPlanner(self.plan, self.cost, self.policy, tolerance=tolerance)
        self.running = PathTasks()
        self.requests: list[list] = []  # [node, steps, waiter, config, active]
        self.launched = 0
        self.wanted: dict[str, set] = {}  # task -> its `wanted_of` at the last check

    def apply(self, op: str, a: int, b: int) -> None:
        plan, planner = self.plan, self.planner
        if op == "submit" or not self.requests:
            config, steps = self.pool[a % len(self.pool)]
            waiter = len(self.requests)
            self.requests.append([plan.add_request(config, steps, waiter), steps, waiter, config, True])
            return
        request = self.requests[a % len(self.requests)]
        node, steps, waiter, config, active = request
        point = 1 + b % steps
        if op == "extend":
            if active:
                plan.remove_request(node, steps, waiter)
            request[1] = steps + 1 + b % 5
            request[0], request[4] = plan.add_request(config, request[1], waiter), True
        elif op == "stop" and active:
            plan.remove_request(node, steps, waiter)
            request[4] = False
        elif op == "metrics":
            plan.record_metrics(node, point, {"loss": 1.0})
        elif op == "checkpoint":
            plan.record_checkpoint(node, point, CKPT)
        elif op == "drop":
            owner = plan.owner(node, point)
            if point in plan.nodes[owner].checkpoints:
                plan.drop_checkpoint(owner, point)
        elif op == "observe":
            self.cost.observe(plan.owner(node, point), (0.5, 1.0, 2.0, 0.75)[b % 4])
        elif op == "launch":  # a task over part of a trial's path, as a coordinator could run
            segments = [s for s in plan.segments(node, steps) if s[1] < s[2]]
            first = a % len(segments)
            self._launch(segments[first : first + 1 + b % 3], segments[first][1])
        elif op == "pick":  # what the coordinator does with the planner's picks
            for path in planner.pick(1 + b % 3):
                self._launch([(s.node, s.start, s.end) for s in path], path[0].start)
        elif op == "progress" and self.running.tasks:
            key = list(self.running.tasks)[b % len(self.running.tasks)]
            segments, progress = self.running.tasks[key]
            progress = min(progress + 1 + a % 4, segments[-1][2])
            self.running.tasks[key] = (segments, progress)
            planner.task_progressed(key, progress)
        elif op == "restart" and self.running.tasks:  # a task retried from an earlier point
            key = list(self.running.tasks)[b % len(self.running.tasks)]
            segments, progress = self.running.tasks[key]
            progress = max(segments[0][1], progress - 1 - a % 4)
            self.running.tasks[key] = (segments, progress)
            planner.task_progressed(key, progress)
        elif op == "end" and self.running.tasks:
            key = list(self.running.tasks)[b % len(self.running.tasks)]
            del self.running.tasks[key]
            planner.task_ended(key)

    def _launch(self, segments, progress: int) -> None:
        key = f"task-{self.launched}"
        self.launched += 1
        self.running.tasks[key] = (tuple(segments), progress)
        self.planner.task_launched(key, segments, progress)

    def run(self, ops, every: int) -> None:
        """Apply `ops`, checking after every `every` of them (changes also arrive in batches)
        and at the end."""
        for i, (op, a, b) in enumerate(ops):
            self.apply(op, a, b)
            if i % every == every - 1:
                self.check()
        self.check()

    def check(self) -> None:
        """The planner holds what a rebuild computes."""
        plan, planner, policy = self.plan, self.planner, self.policy
        reference = build_stage_tree(plan, self.running)
        costs = self.cost if self.tolerance == 0 else planner.estimates
        priority = critical_path_priorities(reference, costs, plan)
        tree, priorities = planner.tree()
        assert [_fields(s) for s in tree.stages] == [_fields(s) for s in reference.stages]
        assert tree.wanted == reference.wanted
        assert priorities == pytest.approx(priority, rel=1e-12)
        changed = planner.wanted_changed()  # a coordinator redirects only these
        for task in self.running.tasks:
            assert planner.wanted_of(task) == reference.wanted.get(task, set())
            if planner.wanted_of(task) != self.wanted.get(task, set()):
                assert task in changed
            sourced = [s for s in reference.stages if s.source == "running" and s.source_task == task]
            assert sorted(_place(s) for s in planner.sourced_from(task)) == sorted(_place(s) for s in sourced)
        self.wanted = {task: planner.wanted_of(task) for task in self.running.tasks}
        ready = sorted(
            reference.ready(),
            key=lambda s: (*policy.ready_key(s, priority[s.index], plan.nodes[s.node].depth), s.index),
        )
        assert [_place(s) for s in planner.ready()] == [_place(s) for s in ready]
        assert planner.ready_count() == len(ready)
        for slots in (1, 3, len(ready) + 1):
            expected = policy.pick(reference, slots, costs, plan, priority)
            assert [[_place(s) for s in p] for p in planner.pick(slots)] == [
                [_place(s) for s in p] for p in expected
            ]
        for node, seconds in planner.estimates._estimates.items():
            assert abs(seconds - self.cost.step_seconds(node, plan)) <= self.tolerance * seconds
        runs = {key: _Run(segments, progress) for key, (segments, progress) in self.running.tasks.items()}
        held = held_stages(
            reference.stages, lambda s: priority[s.index], lambda s: [reference.stages[c] for c in s.children]
        )
        drawn = view_of_stages(held, runs, self.cost, plan)
        assert planner.schedule_view(runs) == drawn


class _Run:
    """A running task as a schedule view reads it: its segments and progress."""

    def __init__(self, segments, progress: int):
        self.task = SimpleNamespace(
            segments=[SimpleNamespace(node=n, start=a, end=b) for n, a, b in segments]
        )
        self.progress = progress


def _fields(stage) -> tuple:
    return (
        stage.index,
        stage.node,
        stage.start,
        stage.end,
        stage.source,
        stage.source_point,
        stage.source_task,
        stage.parent,
        stage.children,
        stage.metrics_needed,
        stage.rank,
    )


def _place(stage) -> tuple:
    return (stage.node, stage.start, stage.end)


# schedules with few values and several switch points: deep trees with many branch points
_switches = st.lists(st.integers(1, 12), min_size=2, max_size=2, unique=True).map(sorted)
branching = st.builds(
    lambda lr, lr_at, m, m_at, steps: ({"lr": dt.Steps(lr, lr_at), "m": dt.Steps(m, [m_at])}, steps),
    st.lists(st.sampled_from([0.1, 0.05, 0.01]), min_size=3, max_size=3),
    _switches,
    st.lists(st.sampled_from([0.9, 0.5]), min_size=2, max_size=2),
    st.integers(1, 12),
    st.integers(1, 15),
)
# a long trial and siblings branching off it at distinct steps (perf/siblings.py's "distinct
# steps", as schedules switching at many steps make): one node with many branch points, which
# the live tree updates step by step (`LiveStageTree._update`) rather than rebuilding
combs = st.builds(
    lambda length, at: (
        [({"lr": 0.1}, length)]
        + [({"lr": dt.Steps([0.1, 0.01 * (i + 1)], [step])}, step + 1 + i % 3) for i, step in enumerate(at)]
    ),
    st.integers(5, 30),
    st.lists(st.integers(1, 25), min_size=1, max_size=16),
)
pools = st.one_of(st.lists(branching, min_size=1, max_size=10), trial_lists(1, 8), combs)

OPERATIONS = (
    "submit",
    "extend",
    "stop",
    "metrics",
    "checkpoint",
    "drop",
    "observe",
    "launch",
    "pick",
    "progress",
    "restart",
    "end",
)
operations = st.lists(
    st.tuples(st.sampled_from(OPERATIONS), st.integers(0, 2**16), st.integers(0, 2**16)),
    min_size=20,
    max_size=60,
)


@more_examples()
@given(
    pools,
    operations,
    st.sampled_from(["critical_path", "breadth_first", "fifo"]),
    st.sampled_from([0.0, 0.25]),
    st.integers(1, 4),
)
def test_incremental_state_equals_the_rebuilt_one(trials, ops, policy, tolerance, every):
    """Checked after every `every` operations, so changes also arrive in batches."""
    session = Session(trials, policy, tolerance)
    session.run(ops, every)


@more_examples(150)
@given(
    combs,
    st.lists(
        st.tuples(
            st.sampled_from(("submit",) * 4 + ("stop", "extend", "metrics") * 2 + OPERATIONS),
            st.integers(0, 2**16),
            st.integers(0, 2**16),
        ),
        min_size=20,
        max_size=80,
    ),
    st.integers(1, 4),
)
def test_siblings_at_distinct_steps_keep_the_rebuilt_state(trials, ops, every):
    """The comb shape with submissions, stops and metrics weighing more: branch points come and
    go in any order along one node's chain, between checkpoints and running tasks."""
    session = Session(trials, "critical_path", 0.0)
    session.run(ops, every)


@more_examples(150)
@given(
    combs,
    st.lists(
        st.tuples(
            st.sampled_from(
                ("submit",) * 2 + ("checkpoint", "drop", "launch", "pick", "progress", "end") * 2 + OPERATIONS
            ),
            st.integers(0, 2**16),
            st.integers(0, 2**16),
        ),
        min_size=20,
        max_size=80,
    ),
    st.integers(1, 4),
)
def test_checkpoints_and_tasks_on_a_comb_keep_the_rebuilt_state(trials, ops, every):
    """The comb shape with checkpoints and running tasks weighing more: source points come and
    go between a node's branch points (`LiveStageTree._relink` places the chains around them)
    and tasks claim and release runs of its steps."""
    session = Session(trials, "critical_path", 0.0)
    session.run(ops, every)


def test_changes_read_from_another_writers_journal_reach_the_planner():
    """Journals apply other writers' events without telling listeners; the planner hears them."""
    plan = SearchPlan()
    planner = IncrementalPlanner(plan, CostModel(), policy_named("critical_path"))
    node = plan.add_request(normalize_config({"lr": 0.1}), 10, waiter=0)
    assert [(s.start, s.end, s.source) for s in planner.ready()] == [(0, 10, "scratch")]
    plan.apply({"e": "checkpoint", "node": node, "step": 6, "nbytes": 1, "sha256": ""}, emit=False)
    assert [(s.start, s.end, s.source) for s in planner.ready()] == [(6, 10, "checkpoint")]
    plan.apply({"e": "metrics", "node": node, "step": 10, "metrics": {"loss": 0.5}}, emit=False)
    assert planner.ready_count() == 0 and len(planner) == 0


def test_a_change_rebuilds_only_the_nodes_on_its_path():
    """500 trials of schedules sharing prefixes; one more trial, a checkpoint, a task: each
    rebuilds the nodes on one root-to-node path at most, not the plan."""
    plan = SearchPlan()
    planner = IncrementalPlanner(plan, CostModel(), policy_named("critical_path"))
    values = [0.1, 0.05, 0.01, 0.005]
    for i in range(500):
        lr = dt.Steps([values[i % 4], values[i // 4 % 4], values[i // 16 % 4]], [10 + i % 7, 30 + i // 7 % 9])
        plan.add_request(normalize_config({"lr": lr}), 60 + i % 3, waiter=i)
    planner.settle()
    assert len(planner) > 500
    depth = max(n.depth for n in plan.nodes.values()) + 1

    def rebuilds(change) -> int:
        before = planner.live.rebuilds
        change()
        planner.settle()
        return planner.live.rebuilds - before

    lr = dt.Steps([0.1, 0.05, 0.02], [10, 33])  # branches off deep in the tree
    node = plan.locate(normalize_config({"lr": lr}), 70, create=True)
    assert rebuilds(lambda: plan.request_at(node, 70, "late")) <= depth
    assert rebuilds(lambda: plan.record_checkpoint(node, 20, CKPT)) <= depth
    assert rebuilds(lambda: planner.task_launched("task", [(node, 20, 70)], 20)) <= depth
    assert rebuilds(lambda: planner.task_progressed("task", 25)) == 0  # it passed no point the tree needs


def _comb(n: int) -> list[tuple[dict, int]]:
    """A long trial and `n` siblings branching off it one step apart (sibling i at step i)."""
    return [({"lr": 0.1}, 10_000)] + [
        ({"lr": dt.Steps([0.1, 0.01 * i], [i])}, i + 2) for i in range(1, n + 1)
    ]


def _comb_counts(n: int, monkeypatch, running: bool = True) -> tuple[int, int, int]:
    """What the last 11 of `n` siblings cost, submitted one by one and each settled, with the
    long trial's task running (unless not `running`: its stages wait) and a checkpoint
    committed in between: the branch points the live
    tree asked its answer at (`_source_at`), the wanted steps it decided (`walked`) and the
    stages the planner priced (`priced`); then the planner is checked against a rebuild."""
    from dagtune.plan import _live

    session = Session(_comb(n), "critical_path", 0.0)
    live, planner = session.planner.live, session.planner
    asked = walked = priced = 0
    source_at = _live.LiveStageTree._source_at

    def counting(self, parent: str, step: int) -> tuple:
        nonlocal asked
        asked += 1
        return source_at(self, parent, step)

    monkeypatch.setattr(_live.LiveStageTree, "_source_at", counting)
    for i in range(n + 1):
        if i == n - 10:
            if running:  # the long trial's root stage runs: the branch points' answers change
                session.apply("pick", 0, 0)
            root = session.requests[0][0]
            session.plan.record_checkpoint(root, n // 2, CKPT)
            session.planner.settle()
            asked, walked, priced = 0, live.walked, planner.priced
        session.apply("submit", i, 0)
        session.planner.settle()
    counted = (asked, live.walked - walked, planner.priced - priced)
    session.check()
    return counted


def test_a_sibling_at_a_new_branch_step_asks_one_point_not_every_siblings(monkeypatch):
    """Siblings branching off one node at distinct steps: each new one rebuilds that node, which
    asked every one of its branch points again for its link (work per sibling growing with the
    siblings: 35 and 395 points per sibling at 40 and 400). Only the points whose answer may
    have changed are asked now, two per sibling (its head links to its branch point, then
    the parent settles that new point): the same count at 40 siblings as at 400."""
    assert _comb_counts(40, monkeypatch)[0] == _comb_counts(400, monkeypatch)[0] == 2 * 11


def test_a_sibling_at_a_new_branch_step_decides_and_prices_what_it_changes(monkeypatch):
    """A new branch point on the long trial's node decided every wanted step of that node
    again and priced every stage of it (work per sibling growing with the siblings already
    there: main's code walked 396 and 4,356 steps for the last 11 of 40 and 400 siblings, and
    priced 385 and 4,345 stages where the long trial's stages wait). Now it decides the steps
    that changed (the sibling's own, the new branch point) and prices the stages whose priority
    it reaches: the same counts at 40 siblings as at 400."""
    for running in (True, False):
        _, walked, priced = _comb_counts(40, monkeypatch, running)
        assert (walked, priced) == _comb_counts(400, monkeypatch, running)[1:]
        assert walked == 2 * 11


def _view_reads(n: int) -> int:
    """The stages a schedule view reads when nothing changed since the previous one (its
    critical path), with `n` trials sharing a one-step prefix and branching off it at step 1:
    a branch point with `n` children of equal priority (the view takes the latest node's). The
    views are checked against the rebuilt one first."""
    trials = [({"x": dt.Steps([0, i + 1], [1])}, 2) for i in range(n)]
    session = Session(trials, "critical_path", 0.0)
    for i in range(n):
        session.apply("submit", i, 0)
    session.check()
    before = session.planner.view_reads
    session.planner.schedule_view({})
    return session.planner.view_reads - before


def test_a_view_follows_the_critical_path_without_reading_every_child():
    """A view's critical path read every child of each stage on it (main's code: 42 and 402
    stages at 40 and 400 children); the planner keeps the children by priority and the
    builder's order, so a view reads the best one: the same count at 40 children as at 400."""
    assert _view_reads(40) == _view_reads(400) <= 4


def _node_event_counts(n: int) -> list[tuple[str, int, int]]:
    """Checkpoint and task events on the long trial of `_comb(n)` (every sibling submitted and
    settled first), each settled on its own: ``(event, wanted steps decided, stages priced)``.

    First with the long trial's stages waiting (a checkpoint committed and dropped at step 5),
    then as a coordinator runs it: its path launched as one task, which commits a checkpoint
    at each branch point it passes; a checkpoint it committed dropped behind it (the stage up
    to it is needed again) and a short task launched on that stage, advancing, lost, launched
    again. The launch of the long task itself is not counted: it claims every branch point
    ahead of it, each a stage that goes (work proportional to what changed, n here). The
    planner is checked against a rebuild at the end."""
    session = Session(_comb(n), "critical_path", 0.0)
    plan, planner, running = session.plan, session.planner, session.running.tasks
    for i in range(n + 1):
        session.apply("submit", i, 0)
    planner.settle()
    root = session.requests[0][0]
    counts = []

    def count(event: str, change) -> None:
        walked, priced = planner.live.walked, planner.priced
        change()
        planner.settle()
        counts.append((event, planner.live.walked - walked, planner.priced - priced))

    def progress(key: str, step: int) -> None:
        running[key] = (running[key][0], step)
        planner.task_progressed(key, step)

    def end(key: str) -> None:
        del running[key]
        planner.task_ended(key)

    count("checkpoint at 5, stages waiting", lambda: plan.record_checkpoint(root, 5, CKPT))
    count("checkpoint at 5 dropped", lambda: plan.drop_checkpoint(root, 5))
    session.apply("pick", 0, 0)  # the long trial's whole path, one task
    (long,) = running
    assert running[long][0][-1][2] == 10_000
    for step in (1, 2):
        plan.record_checkpoint(root, step, CKPT)
        progress(long, step)
    planner.settle()
    count("checkpoint at 3, task running", lambda: plan.record_checkpoint(root, 3, CKPT))
    count("long task advances to 3, passing nothing relied on", lambda: progress(long, 3))
    count("long task advances to 4 before its checkpoint there", lambda: progress(long, 4))
    count("checkpoint at 4", lambda: plan.record_checkpoint(root, 4, CKPT))
    count("checkpoint at 3 dropped", lambda: plan.drop_checkpoint(root, 3))
    count("short task launched on (2, 3]", lambda: session._launch([(root, 2, 3)], 2))
    short = f"task-{session.launched - 1}"
    count("short task lost", lambda: end(short))
    count("short task launched again", lambda: session._launch([(root, 2, 3)], 2))
    short = f"task-{session.launched - 1}"
    count("short task advances to 3", lambda: progress(short, 3))
    count("its checkpoint at 3", lambda: plan.record_checkpoint(root, 3, CKPT))
    count("short task ends", lambda: end(short))
    session.check()
    return counts


def test_checkpoint_and_task_events_on_a_long_trial_decide_what_they_change():
    """A checkpoint committed or dropped, or a task launched, advancing past a point the tree
    relies on or ending, on a node with many branch points decided all its wanted steps again
    (main's code: 40 and 400 steps per event at 40 and 400 siblings). Now each decides the
    steps whose decision can change (its own step, the steps a task claims or claimed) and
    places the chains around the points it moved: the same counts at 40 siblings as at 400,
    and a handful per event."""
    small, large = _node_event_counts(40), _node_event_counts(400)
    assert small == large
    assert all(decided <= 1 and priced <= 7 for _, decided, priced in small), small


def _estimate_event_counts(n: int, monkeypatch) -> list[tuple[str, int, int, int]]:
    """Measured step times on `_comb(n)` (every sibling submitted and settled first), each
    settled on its own: ``(event, stages priced, stages priced twice, stages whose priority
    changed)``. The planner is checked against a rebuild at the end."""
    session = Session(_comb(n), "critical_path", 0.0)
    planner, cost = session.planner, session.cost
    for i in range(n + 1):
        session.apply("submit", i, 0)
    planner.settle()
    root, sibling = session.requests[0][0], session.requests[n // 2][0]
    priced: list[int] = []
    price = IncrementalPlanner._price

    def counting(self, stage) -> None:
        priced.append(stage.index)
        price(self, stage)

    monkeypatch.setattr(IncrementalPlanner, "_price", counting)
    counts = []
    for event, node, seconds in (
        ("the long trial measured (its subtree: 1.0 s to 2.0 s)", root, 2.0),
        ("a sibling measured at its inherited 2.0 s", sibling, 2.0),
        ("the long trial again (2.0 s to 2.6 s)", root, 4.0),
        ("the sibling again (2.0 s to 1.7 s)", sibling, 1.0),
    ):
        before = {index: stage.priority for index, stage in planner._stages.items()}
        priced.clear()
        cost.observe(node, seconds)
        planner.settle()
        changed = sum(planner._stages[i].priority != p for i, p in before.items())
        counts.append((event, len(priced), len(priced) - len(set(priced)), changed))
    session.check()
    counts.append(("stages", len(planner), 0, 0))
    return counts


def test_a_re_priced_estimate_prices_the_stages_whose_priority_changes(monkeypatch):
    """A node's estimate moving re-prices every stage of the nodes priced with it: every one
    of those priorities changes (each path below such a stage crosses its own steps, whose
    seconds all moved the same way), so that work is what changed. Each stage is priced once
    per event, and besides the changed ones only where a change stops (the stage a changed
    sibling's head continues from, when the long chain still dominates it): at most one more.
    A node whose estimate came from another source at the same value (a sibling measured at
    the value it inherited) re-priced all its stages for nothing on main's code (its one
    stage priced, no priority changed); now none are."""
    for n in (40, 400):
        *counts, (_, stages, _, _) = _estimate_event_counts(n, monkeypatch)
        for event, priced, twice, changed in counts:
            assert twice == 0, event
            assert changed <= priced <= changed + 1, (event, priced, changed)
        assert counts[0][1] == counts[0][3] == stages  # every stage: the long chain's and the siblings'
        assert counts[1][1:] == (0, 0, 0)
        assert counts[3][3] > 0
