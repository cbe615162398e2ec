"""The coordinator's state per trial kept compact (issue 24, memory per trial) and still
what it was: a plan node's empty tables are one shared read-only mapping (pickled as that
one object), equal plain hyper-parameter values share one `Constant`, tables emptied after
a burst of requests are let go, and the latest checkpoints followed for the trials, kept
lean, still equal what the plan answers for each."""

from __future__ import annotations

import pickle
import random
import sys

from dagtune.config import normalize_config
from dagtune.coordinator._ids import IdsByNode
from dagtune.coordinator._kept import HeldPoints, LatestCheckpoints
from dagtune.plan import SearchPlan
from dagtune.records import CheckpointInfo, MetricsPoint
from dagtune.sequences import Constant


def test_empty_node_tables_are_one_shared_mapping_that_pickles_as_itself():
    plan = SearchPlan()
    a = plan.locate(normalize_config({"lr": 0.1}), 4, create=True)
    b = plan.locate(normalize_config({"lr": 0.2}), 4, create=True)
    first, second = plan.nodes[a], plan.nodes[b]
    assert first.children is second.children and first.metrics is second.metrics
    assert len(first.children) == 0 and 2 not in first.metrics and first.checkpoints.get(2) is None
    assert dict(first.requests) == {} and max(first.checkpoints, default=0) == 0
    plan.request_at(a, 4, "waiter")
    assert first.requests == {4: {"waiter"}} and second.requests is not first.requests
    plan.remove_request(a, 4, "waiter")
    assert first.requests is second.requests  # emptied: the shared one again
    plan.record_checkpoint(a, 2, CheckpointInfo(10, "ab"))
    plan.record_metrics(a, 2, {"loss": 1.5})
    assert first.checkpoints == {2: CheckpointInfo(10, "ab")} and first.metrics == {
        2: MetricsPoint.of(2, {"loss": 1.5})
    }
    copy = pickle.loads(pickle.dumps(second))
    assert copy.children is second.children and copy.checkpoints is second.checkpoints
    assert pickle.loads(pickle.dumps(first)).metrics == {2: MetricsPoint.of(2, {"loss": 1.5})}
    plan.drop_checkpoint(a, 2)
    assert first.checkpoints is second.checkpoints
    assert not plan.drop_checkpoint(a, 2)  # dropping what is not there changes nothing
    child = plan.locate(
        normalize_config({"lr": Constant(0.1)}) | {"lr": _switch(0.1, 0.3, 2)}, 4, create=True
    )
    assert plan.nodes[child].parent == a and dict(first.children) and second.children == {}


def test_a_pickled_plan_leaves_its_live_listeners_and_observers_behind():
    plan = SearchPlan()
    events: list[dict] = []
    plan.listeners.append(lambda event: events.append(event))  # a lambda does not pickle
    plan.observers.append(lambda kind, node, step: None)
    node = plan.locate(normalize_config({"lr": 0.1}), 4, create=True)
    copy = pickle.loads(pickle.dumps(plan))
    assert copy.listeners == [] and copy.observers == [] and list(copy.nodes) == [node]
    assert len(plan.listeners) == 1 and len(plan.observers) == 1 and events  # the live plan keeps them


def _switch(before: float, after: float, at: int):
    from dagtune.sequences import Steps

    return Steps([before, after], [at])


def test_equal_plain_values_share_one_constant_and_unequal_types_do_not():
    a = normalize_config({"lr": 0.1, "flag": True, "n": 1, "x": 1.0, "z": -0.0})
    b = normalize_config({"lr": 0.1, "flag": 1, "n": True, "x": 1, "z": 0.0})
    assert a["lr"] is b["lr"]
    assert a["flag"].value is True and b["flag"].value == 1 and type(b["flag"].value) is int
    assert a["n"] is b["flag"] and a["flag"] is b["n"]
    assert type(a["x"].value) is float and type(b["x"].value) is int
    assert a["z"] is b["z"] and str(a["z"].value) == "0.0"
    values = [normalize_config({"lr": i * 1e-3})["lr"] for i in range(10_000)]  # past the bound
    assert [c.value for c in values] == [i * 1e-3 for i in range(10_000)]


def test_tables_emptied_after_a_burst_are_let_go():
    plan = SearchPlan()
    nodes = [plan.add_request(normalize_config({"lr": i * 1e-3}), 2, i) for i in range(2_000)]
    ids, held = IdsByNode(), HeldPoints()
    for i, node in enumerate(nodes):
        ids.add(node, i)
        held.add((node, 2))
    assert sys.getsizeof(plan.active) > sys.getsizeof({}) * 10
    for i, node in enumerate(nodes):
        plan.remove_request(node, 2, i)
        ids.discard(node, i)
        held.remove((node, 2))
    assert sys.getsizeof(plan.active) == sys.getsizeof(plan.request_rank) == sys.getsizeof({})
    assert sys.getsizeof(ids._held) == sys.getsizeof(held._counts) == sys.getsizeof({})
    assert len(ids) == len(held) == 0 and not plan.active


def test_lean_latest_checkpoints_equal_the_plans_answer():
    """Targets added for several reasons and removed, checkpoints recorded and dropped on a
    plan of branching paths: what is held is always each followed target's latest
    checkpoint, counted once per target."""
    rng = random.Random(5)
    plan = SearchPlan()
    points = []
    for i in range(12):
        steps = rng.randint(2, 9)
        values = normalize_config({"lr": _switch(0.1, 0.1 + rng.randint(0, 3) / 10, rng.randint(1, 5))})
        node = (
            plan.locate(values, steps, create=True)
            if i % 3
            else plan.locate(normalize_config({"lr": 0.1}), steps, create=True)
        )
        points.append((node, steps))
    held = HeldPoints()
    latest = LatestCheckpoints(plan, held)
    reasons: dict = {}
    for _ in range(600):
        roll = rng.random()
        if roll < 0.3:
            target = rng.choice(points)
            latest.add(target)
            reasons[target] = reasons.get(target, 0) + 1
        elif roll < 0.5 and reasons:
            target = rng.choice(sorted(reasons))
            latest.remove(target)
            reasons[target] -= 1
            if not reasons[target]:
                del reasons[target]
        else:
            node, steps = rng.choice(points)
            step = rng.randint(1, steps)
            owner = plan.owner(node, step)
            if owner in plan.nodes and step in plan.nodes[owner].checkpoints:
                plan.drop_checkpoint(owner, step)
                latest.checkpoint_changed(owner, step)
            else:
                plan.record_checkpoint(node, step, CheckpointInfo(1, ""))
                latest.checkpoint_changed(owner, step)
        expected: dict = {}
        for target in reasons:
            found = plan.latest_checkpoint(*target)
            if found is not None:
                expected[found] = expected.get(found, 0) + 1
        assert set(held) == set(expected)
        assert {p: held._counts[p] for p in held} == expected
