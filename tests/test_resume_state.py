"""A study's resume state (`dagtune.resume_state`, issue 24): the state and the journals'
tail fold exactly as the journals read whole; a resumed study restores the same trials and
plan with it as without it, and parses only the tail; a damaged, stale, foreign or unsafe
state, or a tail older than the state, is never used (the journals are read instead)."""

from __future__ import annotations

import logging
import os
import pickle
from collections import deque

import pytest
from durable_helpers import count_lines

import dagtune as dt
from dagtune.algos import GridSearch, SuccessiveHalving
from dagtune.checkpoints import CheckpointStore
from dagtune.config import config_to_json
from dagtune.durable import read_records, records_header
from dagtune.plan import Journal, PlanJournal, SearchPlan, plan_header
from dagtune.plan import _journal as journal_module
from dagtune.plan._plan import Node
from dagtune.records import node_id
from dagtune.resume_state import Restored, read_state, state_bytes, state_path
from dagtune.sim import SimulatedExecutor, SyntheticTrainer

SPACE = dt.Grid(
    {"lr": [0.01, dt.Steps([0.01, 0.02], [3]), dt.Steps([0.01, 0.05], [3])], "momentum": [0.0, 0.9]}
)


def open_study(path: str, name: str = "s") -> dt.Study:
    return dt.Study(SyntheticTrainer, name=name, executor=SimulatedExecutor(4, store=CheckpointStore(path)))


def run_study(path: str, algorithm, name: str = "s") -> None:
    with open_study(path, name) as study:
        study.run(algorithm, progress=False)


def grid(steps: int, configs: list | None = None) -> GridSearch:
    return GridSearch(configs or list(SPACE), metric="val_loss", mode="min", steps=steps)


@pytest.fixture
def stored(tmp_path) -> tuple[str, str]:
    """A study of three sessions (the second and third with a state to resume from), and
    another study of its model writing the shared plan in between: (storage, identity)."""
    path = str(tmp_path / "runs")
    run_study(path, grid(4, list(SPACE)[:3]))
    run_study(
        path, SuccessiveHalving(list(SPACE), metric="val_loss", mode="min", min_steps=2, max_steps=6), "h"
    )
    run_study(path, grid(4))  # resumed: writes its state (the first session's journals) at open
    run_study(path, grid(6))  # resumed from that state: every trial extended
    with open_study(path) as study:
        identity = study.identity
    return path, identity


def journals(path: str, identity: str) -> tuple[CheckpointStore, Journal, Journal]:
    store = CheckpointStore(path)
    records = Journal(store.fs, f"{store.root}/studies/s/journal", header=records_header("s"))
    plan = Journal(store.fs, f"{store.root}/{identity}/plan", header=plan_header(identity))
    return store, records, plan


def whole(path: str, identity: str):
    """The journals read whole: the records, the plan journal."""
    _, records, plan = journals(path, identity)
    folded = read_records(records)
    plan_journal = PlanJournal(SearchPlan(), plan)
    plan_journal.load()
    return folded, plan_journal


def nodes(plan: SearchPlan) -> list[dict]:
    return [{slot: getattr(node, slot) for slot in Node.__slots__} for node in plan.nodes.values()]


def assert_same(resumed, folded, plan_journal) -> None:
    assert resumed.earlier == folded
    assert nodes(resumed.plan_journal.plan) == nodes(plan_journal.plan)
    assert resumed.plan_journal.plan.order == plan_journal.plan.order
    assert resumed.plan_journal.waiting == plan_journal.waiting
    for mine, theirs in ((resumed.plan_journal.journal, plan_journal.journal),):
        assert mine.covered() == theirs.covered() and sorted(mine.incidents) == sorted(theirs.incidents)


def test_the_state_and_the_tail_fold_as_the_journals_read_whole(stored):
    path, identity = stored
    store, records, plan = journals(path, identity)
    assert store.fs.exists(state_path(store.root, "s"))
    resumed = read_state(store, "s", identity, records, plan)
    assert resumed is not None and resumed.tail > 0  # the fourth session's lines, at least
    folded, plan_journal = whole(path, identity)
    assert_same(resumed, folded, plan_journal)
    fresh = journals(path, identity)[1]
    read_records(fresh)
    assert records.covered() == fresh.covered() and sorted(records.incidents) == sorted(fresh.incidents)


def restored_picture(study: dt.Study) -> dict:
    """What a resumed study restored: its trials, field by field, where they sit in the plan,
    the checkpoints its completed trials keep, the index of trials handed back to
    algorithms, its plan, and its best trial."""
    trials = {
        i: (t.config, t.steps, t.status, t.metrics, t.curve, t.node, t.segments, t.reported, t.error, t.cause)
        for i, t in study.coordinator.trials.items()
    }
    completed = study.coordinator.ledger.kept.completed
    best = min(
        (t for t in study.coordinator.trials.values() if t.status == "completed"),
        key=lambda t: (t.metrics["val_loss"], t.id),
    )
    return {
        "trials": trials,
        "kept": sorted(completed),
        "kept version": completed.version,
        "index": sorted(
            (steps, text, [t.id for t in (held if isinstance(held, deque) else [held])])
            for steps, by_text in study._restored._by_steps.items()
            for text, held in by_text.items()
        ),
        "nodes": nodes(study.plan),
        "order": list(study.plan.order),
        "best": best.id,
    }


def counted_locates(monkeypatch) -> list[int]:
    """How many times `SearchPlan.locate` walks the plan from now on (one element, growing)."""
    located = [0]
    locate = SearchPlan.locate

    def counted(self, *args, **kwargs):
        located[0] += 1
        return locate(self, *args, **kwargs)

    monkeypatch.setattr(SearchPlan, "locate", counted)
    return located


def test_a_resumed_study_restores_the_same_trials_with_its_state_as_without(stored, monkeypatch):
    path, _ = stored
    store = CheckpointStore(path)
    decoded = count_lines(monkeypatch)
    located = counted_locates(monkeypatch)
    with_state = open_study(path)
    try:
        restored, work = restored_picture(with_state), (located[0], with_state._restored.dumps)
    finally:
        with_state.close()
    lines = decoded[0]
    os.remove(state_path(store.root, "s"))
    decoded[0] = located[0] = 0
    without = open_study(path)
    try:
        assert restored_picture(without) == restored
        finished = sum(t.status != "pending" for t in without.coordinator.trials.values())
        assert located[0] == finished  # the texts: made once, for the state it writes
    finally:
        without.close()
    assert lines < decoded[0] / 2  # the state's tail only; the journals whole (and their state) after
    assert work == (0, 0)  # every trial placed and its config's text given by the state


def test_trials_are_located_again_where_the_plan_gained_an_equal_valued_sibling(stored, caplog):
    """Another writer's node beside one where restored trials sit (same parent, start and
    values there, another schedule after): the state's places are not used; the study
    restores what reading the journals whole gives."""
    path, identity = stored
    store, records, plan = journals(path, identity)
    _, plan_journal = whole(path, identity)
    node = next(n for n in plan_journal.plan.nodes.values() if n.parent is not None)
    lr = node.config["lr"]
    sibling = {**node.config, "lr": dt.Steps([lr(node.start), 0.123], [node.start + 1])}
    event = {
        "e": "node",
        "id": node_id(node.parent, node.start, sibling),
        "parent": node.parent,
        "start": node.start,
        "config": config_to_json(sibling),
        "t": 4e9,  # later than everything read: the state stays usable
    }
    other = f"{plan.directory}/{'0' * 32}.jsonl"
    write(other, journal_module.encode_line({"h": plan_header(identity)}) + journal_module.encode_line(event))
    with caplog.at_level(logging.INFO, logger="dagtune"):
        resumed = read_state(store, "s", identity, records, plan)
    assert resumed is not None and resumed.restored.placed == {} and resumed.restored.texts
    assert "located again" in caplog.text
    with_state = open_study(path)
    try:
        restored = restored_picture(with_state)
    finally:
        with_state.close()
    os.remove(state_path(store.root, "s"))
    without = open_study(path)
    try:
        assert restored_picture(without) == restored
    finally:
        without.close()


def test_places_naming_a_node_the_plan_lacks_are_not_used(stored):
    path, identity = stored
    store, records, plan = journals(path, identity)
    where = state_path(store.root, "s")
    with open(where, "rb") as file:
        outer = pickle.loads(file.read())
    restored = Restored(**pickle.loads(outer["restored"]))
    first = min(restored.placed)
    restored.placed[first] = (*restored.placed[first][:2], "f" * 16)  # a node no journal has
    write(where, state_bytes(outer["fold"], restored))
    resumed = read_state(store, "s", identity, records, plan)
    assert resumed is not None and resumed.restored.placed == {}


def write(path: str, data: bytes) -> None:
    with open(path, "wb") as file:
        file.write(data)


@pytest.mark.parametrize(
    "damage", ["cut", "garbage", "line changed", "another study", "unsafe", "checksum", "old format"]
)
def test_a_damaged_stale_foreign_or_unsafe_state_is_not_used(stored, damage, caplog):
    path, identity = stored
    store, records, plan = journals(path, identity)
    where = state_path(store.root, "s")
    with open(where, "rb") as file:
        data = file.read()
    if damage == "cut":
        write(where, data[: len(data) // 2])
    elif damage == "garbage":
        write(where, b"\x80\x05not a pickle at all")
    elif damage == "line changed":  # a covered byte of the records journal, length kept
        for name in sorted(os.listdir(records.directory)):
            target = f"{records.directory}/{name}"
            with open(target, "rb") as file:
                text = file.read()
            if b'"submit"' in text:
                write(target, text.replace(b'"submit"', b'"submiT"', 1))
                break
    elif damage == "another study":  # a whole state (its checksum right) of another study
        outer = pickle.loads(data)
        fold = pickle.dumps({**pickle.loads(outer["fold"]), "study": "h"})
        write(where, state_bytes(fold, Restored(**pickle.loads(outer["restored"]))))
    elif damage == "unsafe":  # its checksum right: the unpickler refuses what it would build
        write(where, state_bytes(pickle.dumps({"earlier": os.system}), Restored()))
    elif damage == "checksum":  # a byte of a metric changed inside the state, the pickle still whole
        outer = pickle.loads(data)
        fold = outer["fold"].replace(b"val_loss", b"val_lost", 1)
        write(where, pickle.dumps({**outer, "fold": fold}))
    else:  # a state an earlier dagtune wrote: its format
        write(where, pickle.dumps({**pickle.loads(pickle.loads(data)["fold"]), "format": "dagtune-resume/1"}))
    with caplog.at_level(logging.INFO, logger="dagtune"):
        assert read_state(store, "s", identity, records, plan) is None
    assert "resume state" in caplog.text
    assert records.read_state() == journals(path, identity)[1].read_state()  # nothing read
    folded, _ = whole(path, identity)
    with open_study(path) as study:  # what the journals say, whatever their state said
        assert {i: t.status for i, t in study.coordinator.trials.items()} == {
            i: t.status for i, t in folded.trials.items()
        }


def test_a_tail_older_than_the_state_makes_the_journals_read(stored, caplog):
    path, identity = stored
    store, records, plan = journals(path, identity)
    late = f"{records.directory}/{'0' * 32}.jsonl"  # a writer whose clock was behind
    header = journal_module.encode_line({"h": records_header("s")})
    work = {"r": "work", "session": "0" * 32, "executed_steps": 1, "gpu_seconds": 0.0, "t": 1.0}
    write(late, header + journal_module.encode_line(work))
    with caplog.at_level(logging.INFO, logger="dagtune"):
        assert read_state(store, "s", identity, records, plan) is None
    assert "before the resume state's latest" in caplog.text
    folded, _ = whole(path, identity)
    assert read_records(records) == folded  # read whole from the start: nothing was skipped
