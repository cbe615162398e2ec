"""A study's read index (`dagtune.study_index`, issue 24): reads through it are the reads
through the journals; a stale, corrupt, cut-short or foreign index, or none, is never used
(the journals are read instead); a read through a current index parses no journal line; a
study's writer leaves a current index when it closes, and only then."""

from __future__ import annotations

import json
import logging
import shutil
import zlib

import pytest
from click.testing import CliRunner
from durable_helpers import count_lines

import dagtune as dt
from dagtune.algos import GridSearch, SuccessiveHalving
from dagtune.catalog import load_study, open_storage
from dagtune.checkpoints import CheckpointStore
from dagtune.cli import main
from dagtune.durable import index_path, put_whole, records_header
from dagtune.plan import Journal, plan_header
from dagtune.sim import SimulatedExecutor, SyntheticTrainer
from dagtune.study_index import TOP_KEPT, digest, read_index, rebuild_index, status_figures, study_view
from perf.stored_study import IDENTITY, generate

NAME = "big"


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> str:
    return generate(300, tmp_path_factory.mktemp("stores"))  # with its index (`rebuild_index`)


@pytest.fixture
def runs(made, tmp_path) -> str:
    """A copy of the 300-trial store (with its index) this test may change."""
    shutil.copytree(made, tmp_path / "store")
    return str(tmp_path / "store" / "runs")


def invoke(*args: str) -> str:
    out = CliRunner().invoke(main, list(args), catch_exceptions=False)
    assert out.exit_code == 0, out.output
    return out.output


def outputs(runs: str, studies: tuple[str, ...] = (NAME,)) -> dict[str, str]:
    return {
        "status": invoke("status", runs),
        "tree": invoke("tree", runs),
        "whole tree": invoke("tree", runs, "--depth", "0", "--width", "0"),
        **{f"status --study {name}": invoke("status", runs, "--study", name) for name in studies},
    }


def plain(snapshot: dict) -> dict:
    """A snapshot as JSON gives it back (lists for tuples), without its time stamp."""
    return {k: v for k, v in json.loads(json.dumps(snapshot)).items() if k != "time"}


def without_index(runs: str) -> None:
    store = open_storage(runs)
    store.fs.rm_file(index_path(store.root, NAME))


def test_reads_through_the_index_are_the_reads_through_the_journals(runs, monkeypatch):
    store = open_storage(runs)
    decoded = count_lines(monkeypatch)
    indexed = outputs(runs)
    view = study_view(store, NAME)
    assert view.stored is None and decoded[0] == 0  # all of it from the index: no line parsed
    without_index(runs)
    assert read_index(store, NAME) is None
    assert outputs(runs) == indexed
    assert decoded[0] > 0
    stored = load_study(store, NAME)
    assert plain(study_view(store, NAME).page_snapshot()) == plain(view.page_snapshot())
    assert json.loads(json.dumps(status_figures(stored))) == view.status
    assert view.trials == len(stored.trials) == 300


def test_a_read_through_the_index_parses_no_line_however_many_trials_it_covers(tmp_path, monkeypatch):
    decoded = count_lines(monkeypatch)
    counts = {}
    for n in (100, 400):
        store = open_storage(f"{generate(n, tmp_path)}/runs")
        decoded[0] = 0
        study_view(store, NAME)
        invoke("status", store.url)
        counts[n] = decoded[0]
    assert counts == {100: 0, 400: 0}


def test_a_journal_tail_makes_the_index_stale_and_the_journals_are_read(runs):
    store = open_storage(runs)
    before = invoke("status", runs)
    assert read_index(store, NAME) is not None
    records = Journal(store.fs, f"{store.root}/studies/{NAME}/journal", header=records_header(NAME))
    records.append(
        {"r": "end", "trial": 297, "status": "stopped", "steps": 1, "metrics": None, "error": None}
    )
    records.flush()  # a new writer's file: pending trial 297 stopped
    assert read_index(store, NAME) is None
    after = invoke("status", runs)
    assert after != before
    row = next(line for line in after.splitlines() if line.startswith("│ big"))
    assert [cell.strip() for cell in row.split("│")[2:6]] == ["300", "291", "2", "4"]
    rebuild_index(store, NAME)
    assert read_index(store, NAME) is not None and invoke("status", runs) == after


def test_a_line_added_to_a_journal_file_or_the_shared_plan_makes_it_stale(runs):
    store = open_storage(runs)
    (name,) = Journal(store.fs, f"{store.root}/studies/{NAME}/journal").sizes()
    with open(f"{store.root}/studies/{NAME}/journal/{name}", "ab") as file:
        file.write(b"dj1 00000000 {")  # a cut-short line: the file grew
    assert read_index(store, NAME) is None
    rebuild_index(store, NAME)  # covers the cut-short line: the same bytes while the size is
    assert read_index(store, NAME) is not None
    indexed = invoke("status", runs, "--study", NAME)  # its incident from the index
    assert "incident:" in indexed
    without_index(runs)
    assert invoke("status", runs, "--study", NAME) == indexed
    rebuild_index(store, NAME)
    plan = Journal(store.fs, f"{store.root}/{IDENTITY}/plan", header=plan_header(IDENTITY))
    plan.append({"e": "node", "id": "0" * 16, "parent": None, "start": 0, "config": {}})
    plan.flush()  # another study of the model writes the shared plan
    assert read_index(store, NAME) is None


@pytest.mark.parametrize(
    "damage",
    [
        lambda data: data[: len(data) // 2],  # cut short
        lambda data: b"garbage",
        lambda data: zlib.compress(b"[1, 2]"),
        lambda data: zlib.compress(json.dumps({**json.loads(zlib.decompress(data)), "study": "x"}).encode()),
        lambda data: zlib.compress(
            json.dumps({**json.loads(zlib.decompress(data)), "format": "v0"}).encode()
        ),
        lambda data: zlib.compress(json.dumps({**json.loads(zlib.decompress(data)), "status": 3}).encode()),
        lambda data: zlib.compress(json.dumps({**json.loads(zlib.decompress(data)), "covers": {}}).encode()),
        lambda data: zlib.compress(
            json.dumps({k: v for k, v in json.loads(zlib.decompress(data)).items() if k != "covers"}).encode()
        ),
        lambda data: zlib.compress(
            json.dumps({**json.loads(zlib.decompress(data)), "covers": {"../x": {}}}).encode()
        ),
    ],
)
def test_a_damaged_or_foreign_index_is_not_used(runs, damage, caplog):
    store = open_storage(runs)
    expected = invoke("status", runs)
    path = index_path(store.root, NAME)
    store.fs.pipe_file(path, damage(store.fs.cat_file(path)))
    with caplog.at_level(logging.WARNING, logger="dagtune"):
        assert read_index(store, NAME) is None
    assert invoke("status", runs) == expected


def test_a_writer_killed_while_writing_its_index_leaves_the_old_one_or_none(runs, monkeypatch):
    store = open_storage(runs)
    path = index_path(store.root, NAME)
    old = store.fs.cat_file(path)

    def killed(source, target):
        raise KeyboardInterrupt  # the process dies between writing the new index and renaming it

    monkeypatch.setattr("dagtune.durable.os.replace", killed)
    with pytest.raises(KeyboardInterrupt):
        put_whole(store.fs, path, b"new")
    assert store.fs.cat_file(path) == old
    assert [p for p in store.fs.ls(f"{store.root}/studies/{NAME}", detail=False) if ".tmp" in p] == []


# --------------------------------------------------------------------------- the writer


def run_study(path: str, algorithm, name: str = "s", **options) -> None:
    store = CheckpointStore(path)
    with dt.Study(
        SyntheticTrainer, name=name, executor=SimulatedExecutor(4, store=store), **options
    ) as study:
        study.run(algorithm)


SPACE = dt.Grid(
    {"lr": [0.01, dt.Steps([0.01, 0.02], [3]), dt.Steps([0.01, 0.05], [3])], "momentum": [0.0, 0.9]}
)


def test_a_study_leaves_a_current_index_that_reads_as_its_journals(tmp_path, monkeypatch):
    path = str(tmp_path / "runs")
    run_study(path, GridSearch(list(SPACE), metric="val_loss", mode="min", steps=6), checkpoint_every=2)
    halving = SuccessiveHalving(list(SPACE), metric="val_loss", mode="min", min_steps=2, max_steps=8)
    run_study(path, halving, name="h")  # another study of the model: the shared plan changed
    store = open_storage(path)
    assert read_index(store, "s") is None  # "h" wrote the plan after "s" closed: stale
    assert read_index(store, "h") is not None
    run_study(path, GridSearch(list(SPACE), metric="val_loss", mode="min", steps=6), checkpoint_every=2)
    assert read_index(store, "s") is not None  # "s" again: resumed, nothing new, read back
    decoded = count_lines(monkeypatch)
    indexed = {name: study_view(store, name) for name in ("s", "h")}
    details = {name: read_index(store, name)["detail"] for name in ("s", "h")}  # the closing writers'
    text = outputs(path, ("s", "h"))
    assert decoded[0] == 0
    for name in ("s", "h"):
        without_index_of(store, name)
    assert outputs(path, ("s", "h")) == text
    for name, view in indexed.items():
        assert view.stored is None
        assert details[name] == json.loads(json.dumps(digest(load_study(store, name), {})["detail"]))
        read = study_view(store, name)
        assert plain(read.page_snapshot()) == plain(view.page_snapshot())
        assert json.loads(json.dumps(read.status)) == view.status and read.ends == view.ends


def without_index_of(store: CheckpointStore, name: str) -> None:
    store.fs.rm_file(index_path(store.root, name))


def test_a_writer_that_lost_its_lease_writes_no_index(tmp_path):
    path = str(tmp_path / "runs")
    store = CheckpointStore(path)
    study = dt.Study(SyntheticTrainer, name="s", executor=SimulatedExecutor(2, store=store))
    study.submit({"lr": 0.01}, 3).result()
    records = Journal(
        store.fs, f"{store.root}/studies/s/journal", header=records_header("s")
    )  # another writer's line: a reader's order may differ from the writer's
    records.append({"r": "work", "session": records.writer, "executed_steps": 0, "gpu_seconds": 0.0})
    records.flush()
    study.close()
    assert not store.fs.exists(index_path(store.root, "s"))
    assert invoke("status", path).count("│ s ") == 1


def test_status_of_a_study_reads_the_journals_when_its_index_lacks_what_it_lists(runs, monkeypatch):
    """An index written before it kept the best trials, or asked for more than it keeps
    (of more trials), or another metric: `status --study` reads the journals, as before."""
    store = open_storage(runs)
    indexed = invoke("status", runs, "--study", NAME)
    more = ("status", runs, "--study", NAME, "--top", str(TOP_KEPT + 1))
    decoded = count_lines(monkeypatch)
    beyond = invoke(*more)
    assert decoded[0] > 0  # beyond what the index keeps: the journals
    index = read_index(store, NAME)
    del index["detail"]  # as an index of the format's first writers
    put_whole(store.fs, index_path(store.root, NAME), zlib.compress(json.dumps(index).encode()))
    decoded[0] = 0
    assert invoke("status", runs, "--study", NAME) == indexed and decoded[0] > 0
    without_index(runs)
    assert invoke(*more) == beyond


def test_a_writer_that_saw_an_incident_leaves_the_best_trials_to_the_journals(tmp_path, monkeypatch):
    """The closing writer's index keeps `status --study`'s detail only when the incidents a
    reader would list are known exactly (none seen): else that command reads the journals."""
    path = str(tmp_path / "runs")
    grid = GridSearch(list(SPACE)[:2], metric="val_loss", mode="min", steps=4)
    run_study(path, grid)
    store = open_storage(path)
    (name,) = Journal(store.fs, f"{store.root}/studies/s/journal").sizes()
    with open(f"{store.root}/studies/s/journal/{name}", "ab") as file:
        file.write(b"dj1 00000000 {\n")  # a damaged line the resumed writer skips
    run_study(path, grid)
    index = read_index(store, "s")
    assert index is not None and "detail" not in index
    decoded = count_lines(monkeypatch)
    text = invoke("status", path, "--study", "s")
    assert "incident:" in text and decoded[0] > 0


def test_closing_keeps_what_the_importance_is_scored_from_and_the_page_scores_it(tmp_path, monkeypatch):
    from dagtune.dashboard import snapshot as snapshot_module

    score = snapshot_module.score_columns

    def refused(*args, **kwargs):
        raise AssertionError("a closing writer scored the importance (fANOVA: seconds to a minute)")

    monkeypatch.setattr(snapshot_module, "score_columns", refused)
    path = str(tmp_path / "runs")
    run_study(path, GridSearch(list(SPACE), metric="val_loss", mode="min", steps=4))
    store = open_storage(path)
    index = read_index(store, "s")
    assert index["snapshot"]["importance"] is None
    assert (
        index["importance_inputs"]["total"] == len(SPACE)
        and index["importance_inputs"]["mode"] == index["snapshot"]["mode"]
    )
    monkeypatch.setattr(snapshot_module, "score_columns", score)
    page = study_view(store, "s").page_snapshot()
    assert page["importance"]["method"] == "fANOVA (optuna)"
    assert sorted(page["importance"]["names"]) == ["lr", "momentum"]
    without_index_of(store, "s")
    assert plain(study_view(store, "s").page_snapshot()) == plain(page)  # as read from the journals
