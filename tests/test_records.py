"""Journal lines with valid checksums and values dagtune never writes (`dagtune.records`).

Every reader of storage (a resumed study, ``dagtune status``, ``dagtune tree``, the page
served from storage) must skip such a line, report it as ``file:line`` and give back the
intact trials, whatever JSON the line holds.
"""

from __future__ import annotations

import contextlib
import math
import re
import time
import uuid

import fsspec
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

import dagtune as dt
from dagtune.catalog import load_study
from dagtune.checkpoints import CheckpointStore
from dagtune.cli import main
from dagtune.config import config_to_json, normalize_config
from dagtune.dashboard.server import StoredSnapshots
from dagtune.dashboard.snapshot import stored_snapshot
from dagtune.durable import plan_header, records_header
from dagtune.plan import SearchPlan
from dagtune.plan._journal import decode_line, encode_line
from dagtune.records import (
    MAX_STEPS,
    MAX_TRIAL_ID,
    RecordError,
    check_steps,
    node_id,
    parse_plan_event,
    parse_trial_record,
    read_study_records,
)
from dagtune.results import open_results
from dagtune.sim import SimulatedExecutor, SyntheticTrainer

NAME = "base"
CONFIGS = [
    {"lr": dt.Steps([0.1, 0.05], [3])},
    {"lr": dt.Steps([0.1, 0.02], [3])},
    {"lr": dt.Constant(0.05)},
]
WILD = {"lr": dt.Steps([0.1, 80.0], [2])}  # diverges after a few steps
LATE = {"lr": dt.Constant(0.02)}  # submitted, never trained: pending


def open_study(url: str) -> dt.Study:
    store = CheckpointStore(url)
    return dt.Study(SyntheticTrainer, name=NAME, executor=SimulatedExecutor(2, store=store))


@pytest.fixture(scope="module")
def base() -> str:
    """Storage (in this process's memory) with one study: three completed trials, a diverged
    one and a pending one."""
    url = f"memory://records-{uuid.uuid4().hex}"
    with open_study(url) as study:
        for config in CONFIGS:
            study.submit(config, 6).result()
        study.submit(WILD, 30).result()
        study.submit(LATE, 6)
    yield url
    study.store.fs.rm(study.store.root, recursive=True)


@contextlib.contextmanager
def copy_of(base: str):
    """A copy of the storage at `base`, for one test to tamper with."""
    fs = fsspec.filesystem("memory")
    source = CheckpointStore(base).root
    url = f"memory://records-{uuid.uuid4().hex}"
    target = CheckpointStore(url).root
    for path in fs.find(source):
        fs.pipe_file(target + path[len(source) :], fs.cat_file(path))
    try:
        yield url
    finally:
        fs.rm(target, recursive=True)


def seen(path: str) -> dict[int, tuple]:
    """Each trial as `dagtune status` reads it: status, steps, reached, final metrics, curve."""
    study = load_study(CheckpointStore(path), NAME)
    return {t.id: (t.status, t.steps, t.reported, _plain(t.metrics), _plain(t.curve)) for t in study.trials}


def _plain(value):
    """`value` with NaN replaced by a marker, so that equal results compare equal."""
    if isinstance(value, float) and math.isnan(value):
        return "nan"
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def forge(path: str, journal: str, records: list[dict]) -> str:
    """Add a journal file of a writer of its own holding `records` as lines with valid
    checksums (the header is line 1, the records lines 2, 3, ...); `journal` is "records" or
    "plan". Returns the file's path."""
    store = CheckpointStore(path)
    if journal == "records":
        directory, header = f"{store.root}/studies/{NAME}/journal", records_header(NAME)
    else:
        identity = load_study(store, NAME).identity
        directory, header = f"{store.root}/{identity}/plan", plan_header(identity)
    file = f"{directory}/{uuid.uuid4().hex}.jsonl"
    lines = [encode_line({"h": header}), *(encode_line({"t": time.time(), **r}) for r in records)]
    store.fs.pipe_file(file, b"".join(lines))
    store.fs.invalidate_cache(directory)
    return file


def invoke(*args: str):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


# --------------------------------------------------------------------------- what the writer writes


def test_everything_dagtune_writes_reads_back(base):
    """Every line of a real study's journals parses: NaN and infinite metrics of a diverged
    trial, a pending trial, nodes, checkpoints, metrics."""
    store = CheckpointStore(base)
    identity = load_study(store, NAME).identity
    kinds = set()
    for directory, parse in (
        (f"{store.root}/studies/{NAME}/journal", parse_trial_record),
        (f"{store.root}/{identity}/plan", parse_plan_event),
    ):
        for file in store.fs.ls(directory, detail=False):
            for line in store.fs.cat_file(file).splitlines()[1:]:
                record = decode_line(line)
                kinds.add(record.get("r") or record.get("e"))
                parse(record)
    assert kinds == {"open", "submit", "end", "work", "node", "metrics", "checkpoint"}
    records = [
        decode_line(line)
        for f in store.fs.ls(f"{store.root}/studies/{NAME}/journal", detail=False)
        for line in store.fs.cat_file(f).splitlines()[1:]
    ]
    folded = read_study_records((r, f"x:{i}") for i, r in enumerate(records))
    assert folded.skipped == []
    assert [s.status for s in folded.trials.values()] == ["completed"] * 3 + ["diverged", "pending"]
    diverged = folded.trials[3].metrics
    assert any(math.isnan(v) for v in diverged.values()) and math.inf in diverged.values()


@pytest.mark.parametrize(
    ("record", "message"),
    [
        ({"r": "submit", "trial": 1, "steps": 2.7}, "submit record field 'steps' must be a step from 1 to"),
        ({"r": "submit", "trial": 1, "steps": True}, "field 'steps' must be a step from 1"),
        ({"r": "submit", "trial": 1, "steps": -5}, "got -5"),
        ({"r": "submit", "trial": 1, "steps": 0}, "got 0"),
        ({"r": "submit", "trial": 1, "steps": MAX_STEPS + 1}, f"got {MAX_STEPS + 1}"),
        ({"r": "submit", "trial": -1, "steps": 3}, "field 'trial' must be a trial id from 0 to"),
        ({"r": "submit", "trial": MAX_TRIAL_ID + 1, "steps": 3}, "field 'trial'"),
        ({"r": "submit", "trial": 1, "steps": 3, "config": {}}, "field 'config' must be a non-empty dict"),
        ({"r": "submit", "trial": 1, "steps": 3, "config": {"lr": 0.1}}, "not a serialized config"),
        (
            {"r": "submit", "trial": 1, "steps": 3, "config": {"bad name": {"type": "Constant", "value": 1}}},
            "hyper-parameter names must be identifiers",
        ),
        (
            {
                "r": "submit",
                "trial": 1,
                "steps": 400,
                "config": config_to_json({"lr": dt.Exponential(1.0, 10.0)}),
            },
            "not finite over its 400 steps",
        ),
        (
            {"r": "end", "trial": 1, "status": "<script>x</script>", "steps": 3},
            "end record field 'status' must be one of completed, stopped, failed, diverged, got '<script>x</script>'",
        ),
        ({"r": "end", "trial": 1, "status": "pending", "steps": 3}, "field 'status' must be one of"),
        (
            {"r": "end", "trial": 1, "status": "completed", "steps": 3, "metrics": None},
            "field 'metrics' must be a dict",
        ),
        (
            {"r": "end", "trial": 1, "status": "completed", "steps": 3, "metrics": "notadict"},
            "field 'metrics' must be a dict of metric name -> number, got 'notadict'",
        ),
        (
            {"r": "end", "trial": 1, "status": "completed", "steps": 3, "metrics": {"acc": "0.9"}},
            "field 'metrics'['acc'] must be a number, got '0.9'",
        ),
        (
            {"r": "end", "trial": 1, "status": "completed", "steps": 3, "metrics": {"acc": math.nan}},
            "must be finite unless the trial diverged",
        ),
        (
            {"r": "end", "trial": 1, "status": "completed", "steps": 3, "metrics": {"acc": 10**400}},
            "out of range",
        ),
        (
            {"r": "end", "trial": 1, "status": "failed", "steps": 3, "error": 5},
            "field 'error' must be a string",
        ),
        ({"r": "open", "identity": "../../etc"}, "field 'identity' must be a string matching"),
        ({"r": "work", "session": "0" * 32, "executed_steps": 3, "gpu_seconds": -1.0}, "field 'gpu_seconds'"),
        (
            {"r": "work", "session": "0" * 32, "executed_steps": 3, "gpu_seconds": math.inf},
            "field 'gpu_seconds'",
        ),
        ({"r": "surprise"}, "unknown trial record kind 'r' = 'surprise'"),
        ({"trial": 1}, "unknown trial record kind 'r' = None"),
    ],
)
def test_a_bad_trial_record_names_its_field_and_value(record, message):
    record = {"config": config_to_json(normalize_config({"lr": 0.1})), **record}
    with pytest.raises(RecordError) as refused:
        parse_trial_record(record)
    assert message in str(refused.value)


def test_records_that_contradict_earlier_ones_are_skipped_with_their_place():
    config = config_to_json(normalize_config({"lr": 0.1}))
    lines = [
        {"r": "submit", "trial": 0, "config": config, "steps": 4},
        {"r": "submit", "trial": 0, "config": config, "steps": 5},  # 2: submitted twice
        {"r": "submit", "trial": 1, "config": {"wd": {"type": "Constant", "value": 0.1}}, "steps": 4},  # 3
        {"r": "extend", "trial": 9, "steps": 8},  # 4: never submitted
        {"r": "extend", "trial": 0, "steps": 3},  # 5: fewer steps
        {"r": "end", "trial": 0, "status": "completed", "steps": 3, "metrics": {}},  # 6: not its steps
        {"r": "end", "trial": 0, "status": "stopped", "steps": 9, "metrics": None},  # 7: beyond its steps
        {"r": "end", "trial": 0, "status": "completed", "steps": 4, "metrics": {"loss": 0.5}},
        {"r": "end", "trial": 0, "status": "stopped", "steps": 2, "metrics": None},  # 9: ended already
        {"r": "extend", "trial": 0, "steps": 2**60},  # 10: beyond MAX_STEPS
        {"r": "extend", "trial": 0, "steps": 8},
    ]
    folded = read_study_records((record, f"f:{i}") for i, record in enumerate(lines, start=1))
    assert [where for where, _ in folded.skipped] == [f"f:{i}" for i in (2, 3, 4, 5, 6, 7, 9, 10)]
    reasons = dict(folded.skipped)
    assert "trial 0 was submitted before, at f:1" in reasons["f:2"]
    assert "config names ['wd']" in reasons["f:3"]
    assert "trial 9 was never submitted" in reasons["f:4"]
    assert "ended already" in reasons["f:9"]
    (trial,) = folded.trials.values()
    assert (trial.steps, trial.status, trial.reached, trial.metrics) == (8, "pending", 4, {"loss": 0.5})


def test_plan_events_are_checked_field_by_field():
    config = normalize_config({"lr": 0.1})
    root = node_id(None, 0, config)
    good = {"e": "node", "id": root, "parent": None, "start": 0, "config": config_to_json(config)}
    assert parse_plan_event(good).event == good
    bad = [
        ({**good, "start": 2}, "field 'start' must be 0 (a root starts at step 0)"),
        ({**good, "parent": 7}, "field 'parent' must be a node id or null, got 7"),
        ({**good, "id": "f" * 16}, "does not match its content"),
        ({**good, "private": True}, "a private node event must be a root with a non-empty 'salt'"),
        ({**good, "salt": "x"}, "'salt' belongs to private nodes only"),
        ({"e": "metrics", "node": root, "step": 3, "metrics": [1.0]}, "field 'metrics' must be a dict"),
        ({"e": "metrics", "node": "../x", "step": 3, "metrics": {}}, "field 'node' must be a node id"),
        ({"e": "checkpoint", "node": root, "step": 3, "nbytes": -1, "sha256": "a" * 64}, "field 'nbytes'"),
        ({"e": "checkpoint", "node": root, "step": 3, "nbytes": 1, "sha256": "ab"}, "field 'sha256'"),
        ({"e": "drop_checkpoint", "node": root, "step": 0}, "field 'step' must be a step from 1"),
        ({"e": "rename"}, "unknown search plan event 'e' = 'rename'"),
    ]
    for event, message in bad:
        with pytest.raises(RecordError) as refused:
            parse_plan_event(event)
        assert message in str(refused.value), event


def test_the_plan_refuses_points_and_branches_that_do_not_fit_it():
    plan = SearchPlan()
    config = normalize_config({"lr": dt.Steps([0.1, 0.05], [3])})
    root = plan.locate(normalize_config({"lr": 0.1}), 6, create=True)
    child = plan.locate(config, 6, create=True)
    with pytest.raises(ValueError, match="a point belongs to the node that trained it"):
        plan.apply({"e": "metrics", "node": child, "step": 3, "metrics": {}})
    twig = {"e": "node", "id": "0" * 16, "parent": child, "start": 3, "config": config_to_json(config)}
    with pytest.raises(ValueError, match="not after its parent"):
        plan.apply(twig)
    assert "0" * 16 not in plan.nodes and plan.nodes[child].metrics == {} and plan.nodes[root].children


def test_a_node_whose_config_is_not_finite_somewhere_parts_from_trials_there():
    """A node event can carry a config that overflows later (a hand-made line with a valid
    id): a trial passing there branches off instead of failing to be placed."""
    plan = SearchPlan()
    wild = normalize_config({"lr": dt.Exponential(0.1, 1e100)})  # overflows at step 4
    plan.apply(
        {
            "e": "node",
            "id": node_id(None, 0, wild),
            "parent": None,
            "start": 0,
            "config": config_to_json(wild),
        }
    )
    calm = normalize_config({"lr": dt.Steps([0.1, 0.2], [1])})
    node = plan.locate(calm, 8, create=True)  # a ValueError before: the node's config overflows
    assert plan.nodes[node].config == calm and plan.nodes[node].start == 1  # they share step 0


def test_steps_are_checked_when_written_as_when_read():
    assert check_steps(MAX_STEPS) == MAX_STEPS
    for bad in (0, -1, 2.0, True, MAX_STEPS + 1, "3"):
        with pytest.raises(ValueError, match="steps must be a positive int, at most"):
            check_steps(bad)
    with dt.Study(SyntheticTrainer, executor=SimulatedExecutor(1)) as study:
        with pytest.raises(ValueError, match="steps must be a positive int"):
            study.submit({"lr": 0.1}, MAX_STEPS + 1)
        trial = study.submit({"lr": 0.1}, 2).trial
        with pytest.raises(ValueError, match="steps must be a positive int"):
            study.coordinator.extend(trial.id, 2.5)


def test_a_trial_without_finite_values_is_refused_before_anything_is_recorded(base):
    with copy_of(base) as path:
        with open_study(path) as study:
            with pytest.raises(
                ValueError, match=r"config\['lr'\]: Exponential\(1.0, 10.0\) has no finite value"
            ):
                study.submit({"lr": dt.Exponential(1.0, 10.0)}, 400)
            trial = study.submit({"lr": dt.Exponential(1.0, 10.0)}, 300).trial  # finite that far
            with pytest.raises(ValueError, match="has no finite value at step 309"):
                study.coordinator.extend(trial.id, 400)
        stored = load_study(CheckpointStore(path), NAME)
        assert stored.incidents == [] and [(t.id, t.steps) for t in stored.trials][-1] == (5, 300)


# --------------------------------------------------------------------------- tampered journals


ISSUE_CASES = {  # issue 13: lines with valid checksums that took readers down
    "status and metrics": {
        "r": "end",
        "trial": 4,
        "status": "<script>x</script>",
        "steps": 6,
        "metrics": "notadict",
    },
    "steps 2.7": {
        "r": "submit",
        "trial": 20,
        "config": config_to_json(normalize_config({"lr": 0.3})),
        "steps": 2.7,
    },
    "steps -5": {
        "r": "submit",
        "trial": 21,
        "config": config_to_json(normalize_config({"lr": 0.3})),
        "steps": -5,
    },
    "steps 0": {"r": "extend", "trial": 4, "steps": 0},
    "time stamp": {"r": "extend", "trial": 4, "steps": 9, "t": "yesterday"},
}


def test_tampered_records_are_reported_and_every_reader_gives_back_the_intact_trials(base):
    with copy_of(base) as path:
        tampered_records_are_reported(path)


def tampered_records_are_reported(path: str) -> None:
    before = seen(path)
    forged = forge(path, "records", list(ISSUE_CASES.values()))
    expected = {f"{forged}:{line}" for line in range(2, 2 + len(ISSUE_CASES))}

    def places(incidents):
        return {i.split(": ", 1)[0] for i in incidents}

    stored = load_study(CheckpointStore(path), NAME)
    assert places(stored.incidents) == expected
    assert seen(path) == before
    status = invoke("status", path, "--study", NAME)
    assert status.exit_code == 0 and status.output.count("incident:") == len(ISSUE_CASES)
    tree = invoke("tree", path)
    assert tree.exit_code == 0 and tree.output.count("→ #") == 5
    page = StoredSnapshots(CheckpointStore(path))()[NAME]
    assert page["counters"]["trials"] == 5 and page["counters"]["diverged"] == 1
    with open_study(path) as resumed:
        assert places(resumed.incidents) == expected
        assert {t.id: t.status for t in resumed.trials} == {i: s[0] for i, s in before.items()}
    assert seen(path) == before  # resuming wrote nothing that changed them


def test_tampered_plan_events_are_reported_and_the_plan_keeps_what_is_intact(base):
    with copy_of(base) as path:
        tampered_plan_events_are_reported(path)


def tampered_plan_events_are_reported(path: str) -> None:
    before = seen(path)
    plan = load_study(CheckpointStore(path), NAME).plan
    node = next(iter(plan.nodes))
    forged = forge(
        path,
        "plan",
        [
            {"e": "metrics", "node": node, "step": 2.7, "metrics": {"val_loss": 1.0}},
            {"e": "metrics", "node": node, "step": 3, "metrics": "notadict"},
            {"e": "checkpoint", "node": node, "step": -5, "nbytes": 1, "sha256": "a" * 64},
            {"e": "node", "id": "../../etc", "parent": None, "start": 0, "config": {}},
            {"e": "drop_checkpoint", "node": node, "step": 2**60},
        ],
    )
    stored = load_study(CheckpointStore(path), NAME)
    assert sorted(i.split(": ", 1)[0] for i in stored.incidents) == sorted(
        f"{forged}:{n}" for n in range(2, 7)
    )
    assert seen(path) == before
    assert invoke("status", path, "--study", NAME).exit_code == 0
    assert invoke("tree", path, "--study", NAME).exit_code == 0
    assert StoredSnapshots(CheckpointStore(path))()[NAME]["counters"]["trials"] == 5
    with open_study(path) as resumed:
        assert len(resumed.incidents) == 5
        assert resumed.evaluate(CONFIGS[0], 6) == before[0][3]  # known: nothing trained
        assert resumed.report["executed_steps"] == 0


def test_a_huge_trial_id_costs_nothing(base):
    """Ids up to `MAX_TRIAL_ID` are valid; nothing allocates per id up to the largest one."""
    with copy_of(base) as path:
        a_huge_trial_id_costs_nothing(path)


def a_huge_trial_id_costs_nothing(path: str) -> None:
    config = config_to_json(normalize_config({"lr": 0.3}))
    forge(path, "records", [{"r": "submit", "trial": 10**9, "config": config, "steps": 2, "tag": None}])
    assert len(seen(path)) == 6
    with open_study(path) as resumed:
        assert resumed.trials[-1].id == 10**9
        assert resumed.submit({"lr": 0.4}, 2).id == 10**9 + 1
    assert invoke("status", path, "--study", NAME).exit_code == 0
    frame = open_results(path, NAME).trials
    assert list(frame.index[-2:]) == [10**9, 10**9 + 1] and len(frame) == 7  # a row per trial


# --------------------------------------------------------------------------- anything a line can hold

JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats()
    | st.text(max_size=12)
    | st.sampled_from(
        [
            0,
            -5,
            2.7,
            1,
            6,
            10**9,
            MAX_STEPS + 1,
            "<script>x</script>",
            "completed",
            "diverged",
            "pending",
            "[bold]x[/]",
            "",
            "f" * 16,
            "0" * 32,
            "a" * 64,
            {"lr": {"type": "Constant", "value": 0.3}},
            {"val_loss": math.nan, "": 1.0, "..": 2.0, "trial_id": 3.0},
            {"type": "Exponential", "init": 0.1},
        ]
    ),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3)
    ),
    max_leaves=8,
)
CONFIG = config_to_json(normalize_config({"lr": 0.3}))
RECORDS = [
    {"r": "submit", "trial": 7, "config": CONFIG, "steps": 6, "tag": None, "salt": "x"},
    {"r": "extend", "trial": 7, "steps": 9},
    {"r": "end", "trial": 7, "status": "completed", "steps": 6, "metrics": {"val_loss": 0.5}, "error": None},
    {"r": "open", "identity": "0123456789abcdef", "trainer": "x.Y", "seed": 0, "version": ""},
    {"r": "work", "session": "0" * 32, "executed_steps": 3, "gpu_seconds": 1.5},
]
_ROOT = normalize_config({"lr": 0.3})
EVENTS = [
    {"e": "node", "id": node_id(None, 0, _ROOT), "parent": None, "start": 0, "config": config_to_json(_ROOT)},
    {"e": "metrics", "node": "e" * 16, "step": 3, "metrics": {"val_loss": 0.5}},
    {"e": "checkpoint", "node": "e" * 16, "step": 3, "nbytes": 10, "sha256": "a" * 64},
    {"e": "drop_checkpoint", "node": "e" * 16, "step": 3},
]
FIELDS = sorted({k for r in RECORDS + EVENTS for k in r} | {"t", "private"})


@st.composite
def tampered(draw, templates):
    """Valid records (a trial's submit, extend and end, ...) in order, with some fields of
    one or two of them replaced by any JSON value or removed."""
    keep = draw(st.lists(st.booleans(), min_size=len(templates), max_size=len(templates)))
    records = [dict(template) for template, kept in zip(templates, keep) if kept]
    for record in draw(st.lists(st.sampled_from(records), max_size=2)) if records else ():
        for name in draw(st.lists(st.sampled_from(FIELDS), min_size=1, max_size=3, unique=True)):
            if draw(st.booleans()):
                record[name] = draw(JSON)
            else:
                record.pop(name, None)
    return records


@settings(max_examples=max(10, settings.default.max_examples // 3))  # a few studies read per example
@given(records=tampered(RECORDS), events=tampered(EVENTS))
def test_no_journal_line_takes_a_reader_down(base, records, events):
    with copy_of(base) as path:
        before = seen(path)
        files = [forge(path, "records", records), forge(path, "plan", events)]
        named = [r.get("trial") for r in records]  # trials a forged record may validly change
        identity = load_study(CheckpointStore(path), NAME).identity
        foreign = any(  # a well-formed open record of another model, which may sort first
            r.get("r") == "open"
            and isinstance(r.get("identity"), str)
            and re.fullmatch("[0-9a-f]{16}", r["identity"])
            and r["identity"] != identity
            for r in records
        )
        stored = load_study(CheckpointStore(path), NAME)
        stored_snapshot(stored)
        if not foreign:
            after = seen(path)
            for trial, state in before.items():  # intact trials come back as they were
                if trial not in named:
                    assert after[trial] == state
        if not foreign and not any("t" in r for r in records + events):  # in their written order
            assert all(i.split(":", 1)[0] in files for i in stored.incidents)  # only forged lines
        assert invoke("status", path, "--study", NAME).exit_code == 0
        assert invoke("tree", path).exit_code == 0
        assert StoredSnapshots(CheckpointStore(path))()[NAME]["study"] == NAME
        try:
            study = open_study(path)
        except ValueError as refused:  # a well-formed open record of another model
            assert foreign and "belongs to another model" in str(refused)
            return
        with study:
            assert {t for t in before if t not in named} <= {t.id for t in study.trials}
        open_results(path, NAME).trials  # noqa: B018 - the results read back


def test_a_line_nested_too_deeply_or_stamped_with_no_time_is_a_bad_line():
    import zlib

    body = b'{"r": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    with pytest.raises(ValueError, match="nested too deeply"):
        decode_line(b"dj1 %08x " % zlib.crc32(body) + body)
    for stamp in ('"yesterday"', "NaN", "Infinity", "true", "[]"):
        body = b'{"r": "open", "t": %s}' % stamp.encode()
        with pytest.raises(ValueError, match="time stamp 't' must be a finite number"):
            decode_line(b"dj1 %08x " % zlib.crc32(body) + body)


def test_records_of_two_sessions_numbering_trials_alike_are_never_crossed(base):
    """Should two sessions ever write one study at once (the writer lease prevents it), each
    numbers its trials from the same id; a record about one session's trial is never attached
    to the other's trial of that number."""
    first, second = "a" * 32, "b" * 32
    tenth, hundredth = normalize_config({"lr": 0.1}), normalize_config({"lr": 0.01})
    opened = {"r": "open", "identity": "0123456789abcdef"}

    def submit(config, session):
        return {
            "r": "submit",
            "trial": 0,
            "config": config_to_json(config),
            "steps": 4,
            "submitted_by": session,
        }

    def end(loss, session):
        metrics = {"val_loss": loss}
        return {
            "r": "end",
            "trial": 0,
            "status": "completed",
            "steps": 4,
            "metrics": metrics,
            "submitted_by": session,
        }

    folded = read_study_records(
        [
            (opened, "first:1"),
            (submit(tenth, first), "first:2"),
            (opened, "second:1"),
            (submit(hundredth, second), "second:2"),
            (end(2.0, second), "second:3"),  # the metrics of lr=0.01
            (end(1.0, first), "first:3"),
        ]
    )
    (trial,) = folded.trials.values()
    assert trial.config == tenth and trial.metrics == {"val_loss": 1.0} and trial.submitted_by == first
    skipped = dict(folded.skipped)
    assert set(skipped) == {"second:2", "second:3"}
    assert "two sessions wrote the study at once" in skipped["second:3"]

    # a study writes who submitted each trial into its records, in every session
    with copy_of(base) as url:
        with open_study(url) as study:
            study.submit({"lr": dt.Constant(0.07)}, 6).result()
            session = study._persistence.records.writer
        store = CheckpointStore(url)
        directory = f"{store.root}/studies/{NAME}/journal"
        lines = [
            line
            for path in store.fs.ls(directory, detail=False)
            if path.rsplit("/", 1)[-1].startswith(session)
            for line in store.fs.cat_file(path).splitlines()
        ]
    mine = [r for r in map(decode_line, lines) if r.get("r") in ("submit", "end")]
    (submitted,) = [r for r in mine if r["r"] == "submit"]
    assert submitted["submitted_by"] == session
    ends = {r["trial"]: r["submitted_by"] for r in mine if r["r"] == "end"}
    assert ends[submitted["trial"]] == session
    resumed = [trial for trial in ends if trial != submitted["trial"]]  # LATE, pending in the base
    assert resumed and all(ends[trial] not in (None, session) for trial in resumed)  # its submitter's
