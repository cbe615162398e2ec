"""Journals commit in groups (issue 24): fsyncs follow the commit bound, not the events.

Counted, never timed: the fsyncs of journal files made by a durable study of 20 trials and
of 200 are the same when no commit falls due during the run; a record appended and left
alone reaches the disk by itself (within the bound: waited for generously here); a group
writes its journals in their order; a failed commit loses nothing and says so."""

from __future__ import annotations

import contextlib
import os
import threading
import time

import pytest

import dagtune as dt
from dagtune.algos import GridSearch
from dagtune.checkpoints import CheckpointStore
from dagtune.plan import GroupCommit, Journal, commit_seconds
from dagtune.sim import SimulatedExecutor, SyntheticTrainer


@pytest.fixture
def journal_fsyncs(monkeypatch):
    """The journal files (``.jsonl``) fsynced, in order, one entry per fsync."""
    synced: list[str] = []
    original = os.fsync

    def counting(fd):
        path = os.readlink(f"/proc/self/fd/{fd}")
        if path.endswith(".jsonl"):
            synced.append(path)
        return original(fd)

    monkeypatch.setattr(os, "fsync", counting)
    return synced


def _grid_study(tmp_path, n: int) -> None:
    configs = [{"lr": 0.001 * (i + 1)} for i in range(n)]
    storage = str(tmp_path / f"runs{n}")
    executor = SimulatedExecutor(4, store=CheckpointStore(storage))
    with dt.Study(SyntheticTrainer, name="grid", storage=storage, executor=executor) as study:
        study.run(GridSearch(configs, metric="val_loss", mode="min", steps=2), progress=False)


def _count_groups(monkeypatch) -> list[int]:
    """A list that gains an item for each group a `GroupCommit` commits from now on."""
    groups: list[int] = []
    commit = GroupCommit.commit

    def counted(group: GroupCommit) -> None:
        groups.append(1)
        commit(group)

    monkeypatch.setattr(GroupCommit, "commit", counted)
    return groups


def test_a_studys_journal_fsyncs_do_not_grow_with_its_trials(tmp_path, monkeypatch, journal_fsyncs):
    """With a bound longer than the runs, the journals are committed when the study opens
    (its open record), by the run's end and when it closes: as often for 200 trials (800
    plan events, 400 trial records) as for 20."""
    monkeypatch.setenv("DAGTUNE_COMMIT_SECONDS", "3600")
    _grid_study(tmp_path, 20)
    small = len(journal_fsyncs)
    journal_fsyncs.clear()
    _grid_study(tmp_path, 200)
    assert len(journal_fsyncs) == small <= 6, journal_fsyncs
    records = dt.open_results(str(tmp_path / "runs200"), "grid").trials
    assert len(records) == 200 and set(records["status"]) == {"completed"}


def test_a_studys_groups_share_one_committer_thread(tmp_path, monkeypatch):
    """A durable study whose groups fall due all through its run (a 1 ms bound) commits
    them from one committer thread, not from a thread per group: the committers started do
    not grow with the groups (a loaded machine may idle one out now and then)."""
    monkeypatch.setenv("DAGTUNE_COMMIT_SECONDS", "0.001")
    started: list[threading.Thread] = []
    start = threading.Thread.start

    def counting(thread: threading.Thread) -> None:
        started.append(thread)
        start(thread)

    monkeypatch.setattr(threading.Thread, "start", counting)
    groups = _count_groups(monkeypatch)
    _grid_study(tmp_path, 200)
    committers = [thread for thread in started if thread.name == "dagtune-journal-commit"]
    assert len(groups) > 20 and 1 <= len(committers) <= 5, (len(groups), len(committers))
    assert not any(thread.is_alive() for thread in committers)  # ended when the study closed


def test_a_record_left_alone_is_committed_by_itself(tmp_path, journal_fsyncs):
    journal = Journal(
        dt.CheckpointStore(str(tmp_path)).fs, str(tmp_path / "journal"), commit=GroupCommit(0.05)
    )
    for i in range(100):
        journal.append({"r": "x", "i": i})
    path = tmp_path / "journal" / f"{journal.writer}.jsonl"
    deadline = time.monotonic() + 60  # generous: the bound is 50 ms, the machine may be loaded
    while not (path.exists() and path.read_bytes().count(b"\n") == 100) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert path.read_bytes().count(b"\n") == 100
    assert len(journal_fsyncs) == 1  # one group for the 100 records
    _wait_for_committers()  # gone when idle


def _wait_for_committers() -> None:
    deadline = time.monotonic() + 60
    while (
        any(t.name == "dagtune-journal-commit" for t in threading.enumerate()) and time.monotonic() < deadline
    ):
        time.sleep(0.01)
    assert not any(t.name == "dagtune-journal-commit" for t in threading.enumerate())


def test_a_group_writes_its_journals_in_their_order(tmp_path, journal_fsyncs):
    fs = dt.CheckpointStore(str(tmp_path)).fs
    group = GroupCommit(3600)
    plan, records = (
        Journal(fs, str(tmp_path / "plan"), commit=group),
        Journal(fs, str(tmp_path / "rec"), commit=group),
    )
    records.append({"r": "end"})  # appended first, written second: the plan goes first
    plan.append({"e": "metrics"})
    assert journal_fsyncs == []
    records.flush()
    assert [p.rsplit("/", 2)[-2] for p in journal_fsyncs] == ["plan", "rec"]
    assert group.commits == 1
    records.append({"r": "open"}, sync=True)  # committed before append returns
    assert [p.rsplit("/", 2)[-2] for p in journal_fsyncs] == ["plan", "rec", "rec"]


def _committers() -> set[int]:
    return {t.ident for t in threading.enumerate() if t.name == "dagtune-journal-commit"}


def test_one_committer_thread_commits_every_group_until_closed(tmp_path, journal_fsyncs):
    """Not a thread per group: the committer that wrote the first group writes the next ones
    (while groups keep coming), and `close` ends it at once."""
    journal = Journal(dt.CheckpointStore(str(tmp_path)).fs, str(tmp_path / "j"), commit=GroupCommit(0.01))
    group = journal.commit
    group.IDLE_SECONDS = 60  # a loaded machine never idles it out between these groups
    others, seen = _committers(), set()  # others: earlier tests' committers, ending when idle
    for i in range(5):
        journal.append({"r": "x", "i": i})
        seen |= _committers() - others
        deadline = time.monotonic() + 60
        while group.commits <= i and time.monotonic() < deadline:
            time.sleep(0.005)
        assert group.commits == i + 1
    assert len(seen) == 1 and seen <= _committers() and len(journal_fsyncs) == 5
    group.close()
    assert not seen & _committers()
    journal.append({"r": "x", "i": 5}, sync=True)  # usable after: a synced append needs no committer
    assert not _committers() - others


def test_closing_commits_a_group_still_due(tmp_path, journal_fsyncs):
    journal = Journal(dt.CheckpointStore(str(tmp_path)).fs, str(tmp_path / "j"), commit=GroupCommit(3600))
    others = _committers()
    journal.append({"r": "x"})
    mine = _committers() - others
    assert journal_fsyncs == [] and len(mine) == 1
    journal.commit.close()  # at once, not after the hour
    assert len(journal_fsyncs) == 1 and not mine & _committers()


def _failing_journal(tmp_path) -> tuple:
    """A journal whose directory can't be made (a file stands at its parent's place) and
    whose first record, "a", waits in a group commit of 10 ms; and that file."""
    fs = dt.CheckpointStore(str(tmp_path)).fs
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the journal's directory should be")
    journal = Journal(fs, str(blocked / "journal"), commit=GroupCommit(0.01))
    journal.append({"r": "a"})
    return blocked, journal


def _wait_for_failure(journal: Journal) -> None:
    """Until the background committer's try failed (it keeps its error)."""
    deadline = time.monotonic() + 60
    while journal.commit.failures == 0 and time.monotonic() < deadline:
        time.sleep(0.005)
    assert journal.commit.failures == 1


def _written(blocked, journal: Journal, directory: str = "journal") -> list[bytes]:
    """The first letter of each record's "r" that `journal` wrote (its header skipped)."""
    lines = (blocked / directory / f"{journal.writer}.jsonl").read_bytes().splitlines()
    return [line.split(b'"r":"')[1][:1] for line in lines if b'"r":"' in line]


def test_a_failed_commit_keeps_its_records_and_raises_to_the_next_caller(tmp_path):
    blocked, journal = _failing_journal(tmp_path)
    _wait_for_failure(journal)  # the background commit failed, and kept its error
    with pytest.raises(OSError):
        journal.append({"r": "b"})
    blocked.unlink()
    journal.flush()
    assert _written(blocked, journal) == [b"a", b"b"]


def test_a_commit_after_storage_came_back_writes_the_kept_records_instead_of_raising(tmp_path):
    """Closing a study after an outage: the background commit failed during it, storage is
    back, and the flush at close writes everything rather than raising the old failure."""
    blocked, journal = _failing_journal(tmp_path)
    _wait_for_failure(journal)  # the background commit failed, and kept its error
    blocked.unlink()
    journal.flush()  # storage is back: written, nothing raised
    journal.append({"r": "b"}, sync=True)  # the failure is over: appending raises nothing either
    assert _written(blocked, journal) == [b"a", b"b"]


def test_a_commit_while_storage_is_still_failing_raises_its_own_error_and_keeps_the_records(tmp_path):
    blocked, journal = _failing_journal(tmp_path)
    _wait_for_failure(journal)
    for _ in range(2):  # every try raises while it fails
        with pytest.raises(OSError):
            journal.flush()
    blocked.unlink()
    journal.flush()
    assert _written(blocked, journal) == [b"a"]


@pytest.mark.parametrize("value", ["soon", "-1", "inf"])
def test_a_bad_commit_bound_is_refused_by_name(monkeypatch, value):
    monkeypatch.setenv("DAGTUNE_COMMIT_SECONDS", value)
    with pytest.raises(ValueError, match="DAGTUNE_COMMIT_SECONDS must be a finite number"):
        commit_seconds()
    with pytest.raises(ValueError, match="commit_seconds must be"):
        commit_seconds(-0.5)


@pytest.fixture
def journal_opens(monkeypatch):
    """The journal files (``.jsonl``) opened for writing by `os.open`, one entry per open."""
    opened: list[str] = []
    original = os.open

    def counting(path, flags, *args, **kwargs):
        if str(path).endswith(".jsonl") and flags & (os.O_WRONLY | os.O_RDWR):
            opened.append(str(path))
        return original(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", counting)
    return opened


def _held(path) -> list[str]:
    """This process's open descriptors on `path` (a removed one reads ``... (deleted)``)."""
    links = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            links.append(os.readlink(f"/proc/self/fd/{fd}"))
    return [link for link in links if link.startswith(str(path))]


def test_a_journal_file_is_opened_once_for_all_its_groups_and_closed_with_them(
    tmp_path, journal_opens, journal_fsyncs
):
    """Counted: 50 groups open the file once (each is still written and fsynced); closing
    the group commit closes it, and a later group opens it again."""
    journal = Journal(dt.CheckpointStore(str(tmp_path)).fs, str(tmp_path / "j"), commit=GroupCommit(3600))
    for i in range(50):
        journal.append({"r": "x", "i": i}, sync=True)
    path = tmp_path / "j" / f"{journal.writer}.jsonl"
    assert journal_opens == [str(path)] and len(journal_fsyncs) == 50
    assert _held(path) == [str(path)]
    journal.commit.close()
    assert _held(path) == []
    journal.append({"r": "x", "i": 50}, sync=True)
    assert len(journal_opens) == 2 and path.read_bytes().count(b"\n") == 51
    journal.commit.close()


def test_a_studys_journal_files_are_opened_once_whatever_its_groups(tmp_path, monkeypatch, journal_opens):
    """A durable study whose groups fall due all through its run (a 1 ms bound) opens its
    two journal files (the plan's, its records') once each, not once per group."""
    monkeypatch.setenv("DAGTUNE_COMMIT_SECONDS", "0.001")
    groups = _count_groups(monkeypatch)
    _grid_study(tmp_path, 200)
    assert len(groups) > 20 and len(journal_opens) == 2, (len(groups), journal_opens)
    assert sorted(p.rsplit("/", 2)[-2] for p in journal_opens) == ["journal", "plan"]
    assert not any(_held(tmp_path / "runs200"))  # closed with the study


def test_a_journal_file_removed_or_replaced_underneath_is_written_by_its_name_again(tmp_path):
    """The file held open is compared with the one at its name before every write: a file
    removed underneath is not written unseen (its descriptor closed, the records go to the
    name, as when every commit opened it), nor is one replaced by another file."""
    journal = Journal(dt.CheckpointStore(str(tmp_path)).fs, str(tmp_path / "j"), commit=GroupCommit(3600))
    path = tmp_path / "j" / f"{journal.writer}.jsonl"
    journal.append({"r": "a"}, sync=True)
    path.unlink()
    journal.append({"r": "b"}, sync=True)
    assert _written(tmp_path, journal, "j") == [b"b"] and _held(path) == [str(path)]  # not "(deleted)"
    other = tmp_path / "other.jsonl"
    other.write_bytes(b"")
    os.replace(other, path)
    journal.append({"r": "c"}, sync=True)
    assert _written(tmp_path, journal, "j") == [b"c"] and _held(path) == [str(path)]
    journal.commit.close()
    assert _held(path) == []


def test_a_line_is_encoded_as_the_reference_encoder_encodes_it():
    """`encode_line` uses one C encoder made once: its lines are byte for byte those of
    ``json.dumps(record, sort_keys=True, separators=(",", ":"))`` (keys sorted, ASCII
    escapes, NaN as dagtune has always written it), and they read back."""
    import json
    import zlib

    from dagtune.plan._journal import decode_line, encode_line

    records = [
        {
            "e": "metrics",
            "metrics": {"val_loss": 0.25, "loss": float("nan")},
            "node": "ab",
            "step": 1,
            "t": 1.5,
        },
        {
            "r": "submit",
            "config": {"lr": {"value": 1e-3, "type": "Constant"}},
            "tag": None,
            "t": 2.0,
            "é": "\u2028",
        },
        {"z": [1, 2.5, True, False, None, "x"], "a": {"c": {"b": []}}, "t": 3},
    ]
    for record in records:
        body = json.dumps(record, sort_keys=True, separators=(",", ":")).encode()
        assert encode_line(record) == b"dj1 %08x %s\n" % (zlib.crc32(body), body)
        assert json.dumps(decode_line(encode_line(record)[:-1]), sort_keys=True) == json.dumps(
            record, sort_keys=True
        )
    with pytest.raises(TypeError):
        encode_line({"t": 1.0, "x": object()})


@pytest.mark.parametrize("where", ["local", "segments"])
def test_a_journals_header_line_is_encoded_once_however_many_groups_it_commits(tmp_path, monkeypatch, where):
    """Counted (issue 24): a commit encodes no line of its own, only the records appended
    (the header line is encoded when the journal is made): 50 groups, 51 lines encoded. Every
    file still starts with the header (a local file once; on an object store, each segment),
    and reads back."""
    import fsspec

    import dagtune.plan._journal as journal_module

    encoded: list[dict] = []
    encode = journal_module.encode_line

    def counted(record: dict) -> bytes:
        encoded.append(record)
        return encode(record)

    monkeypatch.setattr(journal_module, "encode_line", counted)
    if where == "local":
        fs, directory = dt.CheckpointStore(str(tmp_path)).fs, str(tmp_path / "j")
    else:
        fs, directory = fsspec.filesystem("memory"), f"/i24-header-{os.getpid()}/j"
    header = {"journal": "study", "name": "s"}
    journal = Journal(fs, directory, header=header, commit=GroupCommit(3600))
    for i in range(50):
        journal.append({"r": "x", "i": i}, sync=True)
    journal.commit.close()
    assert len(encoded) == 51 and sum("h" in record for record in encoded) == 1
    files = sorted(fs.ls(directory, detail=False))
    assert len(files) == (1 if where == "local" else 50)
    for path in files:
        assert fs.cat_file(path).startswith(encode({"h": header}))
    reader = Journal(fs, directory, header=header)
    assert [entry.record["i"] for entry in reader.read_new()] == list(range(50))
    assert reader.incidents == []
    if where == "segments":
        fs.rm(directory.rsplit("/", 1)[0], recursive=True)
