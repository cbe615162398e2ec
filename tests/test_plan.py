"""The search plan: prefix matching, points, requests, events, and unique-step accounting."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st
from strategies import brute_unique_steps, more_examples, prefixes, step_values, trial_lists

import dagtune as dt
from dagtune.config import normalize_config
from dagtune.plan import SearchPlan, build_stage_tree, merge_rate, trial_steps, unique_steps
from dagtune.records import CheckpointInfo

CKPT = CheckpointInfo(nbytes=10, sha256="ab" * 32)


def cfg(**hps):
    return normalize_config(hps)


def plan_of(trials):
    plan = SearchPlan()
    nodes = [plan.add_request(normalize_config(c), s, waiter=i) for i, (c, s) in enumerate(trials)]
    return plan, nodes


# ----------------------------------------------------------------------------- properties


@more_examples()
@given(trial_lists())
def test_points_are_equal_exactly_when_prefixes_are(trials):
    plan, nodes = plan_of(trials)
    paths = [prefixes(c, s) for c, s in trials]
    for i, (config, steps) in enumerate(trials):
        # the path's segments carry the trial's values at every step
        segments = plan.segments(nodes[i], steps)
        assert segments[0][1] == 0 and segments[-1][2] == steps
        assert all(a[2] == b[1] for a, b in itertools.pairwise(segments))
        for node, start, end in segments:
            node_config = plan.nodes[node].config
            assert all(step_values(node_config, t) == step_values(config, t) for t in range(start, end))
        for j in range(i):
            for k in range(1, min(steps, trials[j][1]) + 1):
                same_point = plan.owner(nodes[i], k) == plan.owner(nodes[j], k)
                assert same_point == (paths[i][k] == paths[j][k]), (i, j, k)


@more_examples()
@given(trial_lists(), st.data())
def test_unique_steps_is_brute_force_in_any_order(trials, data):
    expected = brute_unique_steps(trials)
    assert unique_steps(trials) == expected
    shuffled = data.draw(st.permutations(trials))
    assert unique_steps(shuffled) == expected
    assert merge_rate(shuffled) == pytest.approx(trial_steps(trials) / expected)
    # (3) through the stage tree too: the plan built in either order trains the unique steps
    for order in (trials, shuffled):
        assert build_stage_tree(plan_of(order)[0]).total_steps == expected


@more_examples()
@given(trial_lists(min_size=2), st.data())
def test_plan_is_append_only(trials, data):
    split = data.draw(st.integers(1, len(trials) - 1))
    plan, first = plan_of(trials[:split])
    before = {i: (n.parent, n.start, n.config, n.order) for i, n in plan.nodes.items()}
    later = [
        plan.add_request(normalize_config(c), s, waiter=("late", i))
        for i, (c, s) in enumerate(trials[split:])
    ]
    assert {i: (n.parent, n.start, n.config, n.order) for i, n in plan.nodes.items() if i in before} == before
    assert list(plan.order[: len(before)]) == list(before)
    # the early trials are still found where they were
    for (config, steps), node in zip(trials[:split], first):
        assert plan.locate(normalize_config(config), steps) == node
    assert len(plan.nodes) <= len(trials)
    assert set(later) <= set(plan.nodes)


# ----------------------------------------------------------------------------- matching


def test_trials_equal_by_value_share_a_node_and_types_matter():
    plan = SearchPlan()
    a = plan.add_request(cfg(lr=dt.Exponential(0.1, 1.0), bs=128), 50, "a")
    b = plan.add_request(cfg(lr=0.1, bs=dt.Steps([128, 128], [10])), 50, "b")
    c = plan.add_request(cfg(lr=0.1, bs=128.0), 50, "c")
    assert a == b != c
    assert plan.nodes[c].parent is None  # 128.0 differs from 128 at step 0: a new root
    assert plan.nodes[a].requests == {50: {"a", "b"}}


def test_locate_without_create_and_branching():
    plan = SearchPlan()
    root = plan.add_request(cfg(lr=0.1), 100, "a")
    decay = cfg(lr=dt.MultiStep(0.1, [60], 0.1))
    assert plan.locate(decay, 60) == root  # agrees with the root for 60 steps
    assert plan.locate(decay, 61) is None  # would branch at 60
    assert len(plan.nodes) == 1
    child = plan.add_request(decay, 80, "b")
    assert (plan.nodes[child].parent, plan.nodes[child].start) == (root, 60)
    assert plan.locate(decay, 61) == child
    # a longer request on the root does not disturb the child
    assert plan.add_request(cfg(lr=0.1), 200, "c") == root
    assert plan.path(child) == [root, child]
    assert plan.segments(child, 80) == [(root, 0, 60), (child, 60, 80)]


def test_trial_longer_than_a_node_with_children_continues_down_the_right_child():
    plan = SearchPlan()
    root = plan.add_request(cfg(lr=dt.Steps([0.1, 0.05], [10])), 20, "a")
    b = plan.add_request(cfg(lr=dt.Steps([0.1, 0.01], [10])), 20, "b")
    c = plan.add_request(cfg(lr=dt.Steps([0.1, 0.01, 0.001], [10, 15])), 20, "c")
    assert plan.nodes[b].parent == root and plan.nodes[c].parent == b and plan.nodes[c].start == 15


def test_node_ids_are_content_hashes():
    trials = [({"lr": 0.1}, 50), ({"lr": dt.Steps([0.1, 0.01], [20])}, 50)]
    assert plan_of(trials)[1] == plan_of(trials)[1]


def test_salted_roots_are_private():
    plan = SearchPlan()
    journal = []
    plan.listeners.append(journal.append)
    private = plan.add_request(cfg(lr=0.1), 50, "a", salt="trial-1")
    assert plan.add_request(cfg(lr=0.1), 80, "a", salt="trial-1") == private  # the same trial, extended
    # an unsalted trial with the same values must not train on (or share) the private root
    assert plan.locate(cfg(lr=0.1), 50) is None
    shared = plan.add_request(cfg(lr=0.1), 50, "b")
    other = plan.add_request(cfg(lr=0.1), 50, "c", salt="trial-2")
    assert len({private, shared, other}) == 3
    assert plan.locate(cfg(lr=0.1), 50, salt="x") is None
    # and a replayed journal keeps them private
    copy = SearchPlan()
    for event in journal:
        copy.apply(event, emit=False)
    assert copy.locate(cfg(lr=0.1), 50) == shared


# ----------------------------------------------------------------------------- points


@pytest.fixture
def branched():
    plan = SearchPlan()
    root = plan.add_request(cfg(lr=0.1), 100, "a")
    child = plan.add_request(cfg(lr=dt.Steps([0.1, 0.01], [40])), 100, "b")
    return plan, root, child


def test_point_at_the_branch_step_belongs_to_the_parent(branched):
    plan, root, child = branched
    assert plan.owner(child, 40) == root
    assert plan.owner(child, 41) == child
    assert plan.owner(child, 0) is None
    assert plan.record_checkpoint(child, 40, CKPT)
    assert plan.nodes[root].checkpoints == {40: CKPT}
    assert plan.checkpoint_at(child, 40) == plan.checkpoint_at(root, 40) == CKPT
    assert plan.latest_checkpoint(child, 100) == (root, 40)
    assert plan.latest_checkpoint(root, 39) is None
    with pytest.raises(ValueError, match="checkpoint needs at least one trained step"):
        plan.record_checkpoint(child, 0, CKPT)
    with pytest.raises(ValueError, match="metrics need at least one trained step"):
        plan.record_metrics(child, 0, {})


def test_latest_checkpoint_walks_up_the_path(branched):
    plan, root, child = branched
    for node, step in ((root, 10), (root, 70), (child, 60), (child, 90)):
        plan.record_checkpoint(node, step, CKPT)
    assert plan.latest_checkpoint(child, 100) == (child, 90)
    assert plan.latest_checkpoint(child, 89) == (child, 60)
    assert plan.latest_checkpoint(child, 59) == (root, 10)  # root's 70 is not on the child's path
    assert plan.latest_checkpoint(root, 100) == (root, 70)
    assert plan.drop_checkpoint(child, 90) and not plan.drop_checkpoint(child, 90)
    assert plan.latest_checkpoint(child, 100) == (child, 60)


def test_metrics_and_curves(branched):
    plan, root, child = branched
    for step in range(1, 101):
        plan.record_metrics(child, step, {"loss": float(step)})
    assert plan.metrics_at(child, 40) == plan.metrics_at(root, 40) == {"loss": 40.0}
    assert plan.metrics_at(root, 41) is None  # the child's step 41 is not the root's
    curve = plan.curve(child, 100)
    assert curve == [(s, {"loss": float(s)}) for s in range(1, 101)]
    assert plan.curve(root, 42) == [(s, {"loss": float(s)}) for s in range(1, 41)]  # 41, 42: none


def test_a_curve_costs_the_points_recorded_not_the_steps_requested(branched):
    plan, _, child = branched
    plan.record_metrics(child, 70, {"loss": 0.5})
    plan.record_metrics(child, 3, {"loss": 0.9})
    assert plan.curve(child, 10**12) == [(3, {"loss": 0.9}), (70, {"loss": 0.5})]


def test_requests_are_counted_per_waiter(branched):
    plan, root, child = branched
    plan.add_request(cfg(lr=0.1), 100, "a2")
    assert plan.active[(root, 100)] == {"a", "a2"}
    plan.remove_request(root, 100, "a")
    plan.remove_request(root, 100, "nobody")  # unknown waiters are ignored
    plan.remove_request(root, 7, "a")
    assert plan.active[(root, 100)] == {"a2"} and plan.nodes[root].requests == {100: {"a2"}}
    plan.remove_request(root, 100, "a2")
    assert (root, 100) not in plan.active and (root, 100) not in plan.request_rank
    assert plan.nodes[root].requests == {}
    assert set(plan.active) == {(child, 100)}


@pytest.mark.parametrize("steps", [0, -1, 1.5, True, None])
def test_add_request_rejects_bad_steps(steps):
    with pytest.raises(ValueError, match="steps must be a positive int"):
        SearchPlan().add_request(cfg(lr=0.1), steps, "a")


# ----------------------------------------------------------------------------- events


def test_events_replay_into_an_equal_plan(branched):
    plan, _, child = branched
    journal = []
    plan.listeners.append(journal.append)
    grandchild = plan.add_request(cfg(lr=dt.Steps([0.1, 0.01, 0.001], [40, 70])), 100, "c")
    plan.record_checkpoint(grandchild, 70, CKPT)
    plan.record_metrics(grandchild, 80, {"acc": 0.5})
    assert not plan.record_metrics(grandchild, 80, {"acc": 0.5})  # duplicate: no event
    plan.drop_checkpoint(child, 70)
    assert [e["e"] for e in journal] == ["node", "checkpoint", "metrics", "drop_checkpoint"]

    copy = SearchPlan()
    for node in plan.order[:2]:  # the nodes from before the listener, as a journal would hold them
        n = plan.nodes[node]
        copy.apply({"e": "node", "id": n.id, "parent": n.parent, "start": n.start, "config": config_json(n)})
    for event in journal:
        assert copy.apply(event, emit=False)
        assert not copy.apply(event, emit=False) or event["e"] == "drop_checkpoint"
    for node in plan.nodes:
        a, b = plan.nodes[node], copy.nodes[node]
        assert (a.parent, a.start, a.config, a.checkpoints, a.metrics) == (
            b.parent,
            b.start,
            b.config,
            b.checkpoints,
            b.metrics,
        )
    assert copy.locate(cfg(lr=dt.Steps([0.1, 0.01, 0.001], [40, 70])), 100) == grandchild


def config_json(node):
    from dagtune.config import config_to_json

    return config_to_json(node.config)


def test_unknown_events_and_parents_are_rejected():
    plan = SearchPlan()
    with pytest.raises(ValueError, match="unknown search plan event 'bogus'"):
        plan.apply({"e": "bogus"})
    with pytest.raises(ValueError, match="unknown parent"):
        plan.apply({"e": "node", "id": "x", "parent": "nope", "start": 3, "config": {}})
