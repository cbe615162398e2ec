"""The checkpoint store, on a local directory and on fsspec's memory filesystem (the write-once
race also on the loopback S3 endpoint)."""

from __future__ import annotations

import hashlib
import io
import json
import os
import pickle
import threading
import uuid
from collections import OrderedDict

import fsspec
import pytest
import torch

from dagtune.checkpoints import CheckpointError, CheckpointStore
from dagtune.records import CheckpointInfo
from dagtune.trainer import capture_rng

IDENTITY = "0123abcd0123abcd"
NODE = "fedcba9876543210"
OTHER_NODE = "00000000aaaaaaaa"


@pytest.fixture(params=["local", "memory"])
def store(request, tmp_path):
    if request.param == "local":
        yield CheckpointStore(str(tmp_path / "runs"))
    else:
        url = f"memory://dagtune-test-{uuid.uuid4().hex}"
        yield CheckpointStore(url)
        fs, root = fsspec.core.url_to_fs(url)
        if fs.exists(root):
            fs.rm(root, recursive=True)


def a_state(value: float = 1.0) -> dict:
    return {
        "model": OrderedDict(weight=torch.full((3, 2), value), bias=torch.zeros(2, dtype=torch.float64)),
        "optimizer": {"state": {0: {"momentum_buffer": torch.ones(4)}}, "param_groups": [{"lr": 0.1}]},
        "batches": {"epoch": 2, "position": 0, "shuffle": True, "name": "order", "none": None},
        "pair": (1, 2.5),
        "rng": capture_rng(),
    }


def assert_same(a, b) -> None:
    assert type(a) is type(b) or (isinstance(a, dict) and isinstance(b, dict))
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and torch.equal(a, b)
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for key in a:
            assert_same(a[key], b[key])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_same(x, y)
    else:
        assert a == b


def data_files(store: CheckpointStore, step: int = 3, node: str = NODE) -> list[str]:
    directory = store.directory(IDENTITY, node, step)
    return sorted(path.rsplit("/", 1)[-1] for path in store.fs.find(directory))


def data_path_for(store: CheckpointStore, step: int) -> str:
    directory = store.directory(IDENTITY, NODE, step)
    marker = json.loads(store.fs.cat_file(f"{directory}/COMMIT"))
    return f"{directory}/{marker['file']}"


def data_path(store: CheckpointStore, step: int = 3) -> str:
    directory = store.directory(IDENTITY, NODE, step)
    (name,) = [f for f in data_files(store, step) if f.startswith("state-")]
    return f"{directory}/{name}"


def test_round_trip(store):
    state = a_state()
    info = store.save(IDENTITY, NODE, 3, state)
    raw = store.fs.cat_file(data_path(store))
    assert info == CheckpointInfo(len(raw), hashlib.sha256(raw).hexdigest())
    assert store.info(IDENTITY, NODE, 3) == info
    assert_same(store.load(IDENTITY, NODE, 3), state)
    assert data_files(store) == ["COMMIT", f"state-{info.sha256[:16]}.pt"]
    marker = json.loads(store.fs.cat_file(f"{store.directory(IDENTITY, NODE, 3)}/COMMIT"))
    assert marker == {
        "format": 1,
        "file": f"state-{info.sha256[:16]}.pt",
        "nbytes": info.nbytes,
        "sha256": info.sha256,
    }


def test_a_small_state_is_hashed_without_a_context_per_chunk(store, monkeypatch):
    """torch.save writes a small state in dozens of tiny chunks (34 for a no-op trainer's
    ``{"step": n}``): each is hashed at once, with no `_Sha256.meanwhile` context (which
    cost as much as the rest of the save), and the marker still holds the bytes' hash."""
    from dagtune import checkpoints

    entered = []
    meanwhile = checkpoints._Sha256.meanwhile
    monkeypatch.setattr(
        checkpoints._Sha256, "meanwhile", lambda self, data: entered.append(1) or meanwhile(self, data)
    )
    info = store.save(IDENTITY, NODE, 3, {"step": 3})
    raw = store.fs.cat_file(data_path(store))
    assert entered == []
    assert info == CheckpointInfo(len(raw), hashlib.sha256(raw).hexdigest())
    assert store.load(IDENTITY, NODE, 3) == {"step": 3}


@pytest.mark.parametrize("where", ["local", "memory", "s3"])
def test_a_large_state_is_hashed_while_written_and_read(where, tmp_path, request):
    """A state of several MiB takes the overlapped path (hashed on the hash thread while
    torch.save writes it and while torch.load reads it): the marker holds the hash of the
    bytes stored, it loads back equal, and one flipped byte in it is caught."""
    if where == "local":
        store = CheckpointStore(str(tmp_path / "runs"))
    elif where == "memory":
        store = CheckpointStore(f"memory://dagtune-test-{uuid.uuid4().hex}")
    else:
        from durable_helpers import new_bucket

        options = request.getfixturevalue("s3_options")
        store = CheckpointStore(f"s3://{new_bucket(options)}/runs", options)
    state = {"weights": torch.arange(1_000_000, dtype=torch.float32), "small": torch.ones(3), "step": 7}
    info = store.save(IDENTITY, NODE, 3, state)
    raw = store.fs.cat_file(data_path(store))
    assert info == CheckpointInfo(len(raw), hashlib.sha256(raw).hexdigest()) and len(raw) > 4_000_000
    assert_same(store.load(IDENTITY, NODE, 3), state)
    data = bytearray(raw)
    data[len(data) // 2] ^= 0x01
    store.fs.pipe_file(data_path(store), bytes(data))
    with pytest.raises(CheckpointError, match=r"sha256 .*corrupted"):
        store.load(IDENTITY, NODE, 3)
    store.fs.rm(store.root, recursive=True)


class _LocalOps:
    """Counts what a local store's save does on disk: mkdir, marker reads, fsync (each made to
    wait, up to 10 s, for a second one to be running at the same time), fdatasync."""

    def __init__(self, store: CheckpointStore, monkeypatch):
        self.mkdir, self.marker_reads, self.fsync, self.fdatasync = 0, 0, 0, 0
        self.together = threading.Barrier(2, timeout=10)
        real_mkdir, real_fsync, real_fdatasync = os.mkdir, os.fsync, os.fdatasync
        real_read = store._read_marker

        def mkdir(*args, **kwargs):
            self.mkdir += 1
            return real_mkdir(*args, **kwargs)

        def fsync(fd):
            self.fsync += 1
            self.together.wait()  # raises BrokenBarrierError if the other fsync never comes
            return real_fsync(fd)

        def fdatasync(fd):
            self.fdatasync += 1
            return real_fdatasync(fd)

        def read(directory):
            self.marker_reads += 1
            return real_read(directory)

        monkeypatch.setattr(os, "mkdir", mkdir)
        monkeypatch.setattr(os, "fsync", fsync)
        monkeypatch.setattr(os, "fdatasync", fdatasync)
        monkeypatch.setattr(store, "_read_marker", read)

    def counts(self) -> tuple[int, int, int, int]:
        counted = (self.mkdir, self.marker_reads, self.fsync, self.fdatasync)
        self.mkdir, self.marker_reads, self.fsync, self.fdatasync = 0, 0, 0, 0
        return counted


def test_a_local_save_makes_its_directory_at_once_and_syncs_data_and_marker_together(tmp_path, monkeypatch):
    """A no-op stage's save on a local disk: one mkdir where its node exists (three where the
    node is new: the first fails), no read of a marker in a directory made just now, and the
    data file's and the marker's fsyncs (both kept: the store's durability) running at once,
    not one after the other. A committed point is read, not written again."""
    store = CheckpointStore(str(tmp_path / "runs"))
    store.save(IDENTITY, OTHER_NODE, 1, {"step": 1})  # the identity's directories exist
    ops = _LocalOps(store, monkeypatch)
    info = store.save(IDENTITY, NODE, 1, {"step": 1})
    assert ops.counts() == (3, 0, 2, 0)  # (mkdir, marker reads, fsync, fdatasync)
    store.save(IDENTITY, NODE, 2, {"step": 2})
    assert ops.counts() == (1, 0, 2, 0)
    assert store.save(IDENTITY, NODE, 1, {"step": 5}) == info  # committed already: kept
    assert ops.counts() == (1, 1, 0, 0)
    assert store.load(IDENTITY, NODE, 1) == {"step": 1} and store.load(IDENTITY, NODE, 2) == {"step": 2}
    assert data_files(store, step=1) == ["COMMIT", f"state-{info.sha256[:16]}.pt"]  # no temporary left


def test_a_large_local_state_is_synced_while_it_is_hashed(tmp_path, monkeypatch):
    """A chunk of 8 MiB or more (a large tensor) is hashed on the hash thread; meanwhile the
    writer syncs what it wrote (one fdatasync), so the final fsync waits only for the rest.
    The two fsyncs are still made, and the state loads back whole."""
    store = CheckpointStore(str(tmp_path / "runs"))
    store.save(IDENTITY, NODE, 1, {"step": 1})  # the node's directory exists
    ops = _LocalOps(store, monkeypatch)
    state = {"weights": torch.arange(3_000_000, dtype=torch.float32), "step": 7}  # 12 MB
    info = store.save(IDENTITY, NODE, 2, state)
    assert ops.counts() == (1, 0, 2, 1)  # (mkdir, marker reads, fsync, fdatasync)
    assert_same(store.load(IDENTITY, NODE, 2), state)
    assert info.nbytes > 12_000_000


def test_absent_checkpoint(store):
    assert store.info(IDENTITY, NODE, 3) is None
    assert list(store.points(IDENTITY)) == []
    with pytest.raises(CheckpointError, match="COMMIT marker is missing"):
        store.load(IDENTITY, NODE, 3)


def test_write_once_keeps_the_first(store):
    first = store.save(IDENTITY, NODE, 3, a_state(1.0))
    second = store.save(IDENTITY, NODE, 3, a_state(2.0))
    assert second == first
    assert torch.equal(store.load(IDENTITY, NODE, 3)["model"]["weight"], torch.full((3, 2), 1.0))
    assert len(data_files(store)) == 2  # COMMIT and the first writer's data


def test_a_writer_that_loses_the_race_yields_and_cleans_up(store, monkeypatch):
    first = store.save(IDENTITY, NODE, 3, a_state(1.0))
    late = pickle.loads(pickle.dumps(store))  # another worker, which checked before `first` committed
    real = late._read_marker
    calls = []

    def stale_then_real(directory):
        calls.append(directory)
        return None if len(calls) == 1 else real(directory)

    monkeypatch.setattr(late, "_read_marker", stale_then_real)
    assert late.save(IDENTITY, NODE, 3, a_state(2.0)) == first
    assert len(calls) == 2
    assert data_files(store) == ["COMMIT", f"state-{first.sha256[:16]}.pt"]
    assert torch.equal(store.load(IDENTITY, NODE, 3)["model"]["weight"], torch.full((3, 2), 1.0))


def test_concurrent_writers_agree_on_one_committed_checkpoint(storage):
    """Eight workers (each with its own store, as Dask workers have) race to write one
    checkpoint, on a local disk and on the loopback S3 endpoint."""
    stores = [CheckpointStore(storage.url, storage.options) for _ in range(8)]
    for one in stores:
        one.fs.invalidate_cache()
    results: list[CheckpointInfo] = []
    barrier = threading.Barrier(len(stores))

    def write(i):
        barrier.wait()
        results.append(
            stores[i].save(IDENTITY, NODE, 5, {"who": torch.tensor([i]), "pad": torch.zeros(50_000)})
        )

    threads = [threading.Thread(target=write, args=(i,)) for i in range(len(stores))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    committed = stores[0].info(IDENTITY, NODE, 5)
    assert results == [committed] * len(stores)
    winner = stores[0].load(IDENTITY, NODE, 5)["who"].item()
    assert 0 <= winner < len(stores)
    # the losers removed their data files and no temporary file is left
    assert data_files(stores[0], 5) == ["COMMIT", f"state-{committed.sha256[:16]}.pt"]


def test_missing_marker_means_not_there(store):
    store.save(IDENTITY, NODE, 3, a_state())
    directory = store.directory(IDENTITY, NODE, 3)
    store.fs.rm_file(f"{directory}/COMMIT")  # as if the writer died before committing
    assert store.info(IDENTITY, NODE, 3) is None
    assert list(store.points(IDENTITY)) == []
    with pytest.raises(CheckpointError, match=f"{directory}.*COMMIT marker is missing"):
        store.load(IDENTITY, NODE, 3)
    info = store.save(IDENTITY, NODE, 3, a_state(5.0))  # a later writer commits over the orphan
    assert store.info(IDENTITY, NODE, 3) == info


def test_corrupted_byte_is_detected(store):
    store.save(IDENTITY, NODE, 3, a_state())
    path = data_path(store)
    data = bytearray(store.fs.cat_file(path))
    data[len(data) // 2] ^= 0x01
    store.fs.pipe_file(path, bytes(data))
    with pytest.raises(CheckpointError, match=rf"{path}: sha256 .*corrupted"):
        store.load(IDENTITY, NODE, 3)


def test_truncated_file_is_detected(store):
    info = store.save(IDENTITY, NODE, 3, a_state())
    path = data_path(store)
    store.fs.pipe_file(path, store.fs.cat_file(path)[:-10])
    with pytest.raises(CheckpointError, match=rf"{path}: has {info.nbytes - 10} bytes.*says {info.nbytes}"):
        store.load(IDENTITY, NODE, 3)


def test_missing_data_file_is_detected(store):
    store.save(IDENTITY, NODE, 3, a_state())
    path = data_path(store)
    store.fs.rm_file(path)
    with pytest.raises(CheckpointError, match=rf"{path}: data file missing"):
        store.load(IDENTITY, NODE, 3)


def test_malformed_marker_is_detected(store):
    store.save(IDENTITY, NODE, 3, a_state())
    directory = store.directory(IDENTITY, NODE, 3)
    for bad in (b"{not json", b'{"format": 1, "file": "../../etc/passwd", "nbytes": 1, "sha256": "00"}'):
        store.fs.pipe_file(f"{directory}/COMMIT", bad)
        with pytest.raises(CheckpointError, match=f"{directory}/COMMIT"):
            store.load(IDENTITY, NODE, 3)
        with pytest.raises(CheckpointError):
            store.info(IDENTITY, NODE, 3)


class Arbitrary:
    def __init__(self):
        self.payload = [1, 2, 3]


def test_arbitrary_objects_are_refused_at_save(store):
    with pytest.raises(TypeError, match=r"state\['extra'\]\['thing'\] is of type Arbitrary.*weights_only"):
        store.save(IDENTITY, NODE, 3, {"model": torch.ones(2), "extra": {"thing": Arbitrary()}})
    with pytest.raises(TypeError, match="must be a dict"):
        store.save(IDENTITY, NODE, 3, [torch.ones(2)])
    assert store.info(IDENTITY, NODE, 3) is None


def test_arbitrary_objects_are_refused_at_load(store):
    # a checkpoint written by someone else, with a valid marker, holding a pickled object
    buffer = io.BytesIO()
    torch.save({"thing": Arbitrary()}, buffer)
    data = buffer.getvalue()
    sha = hashlib.sha256(data).hexdigest()
    directory = store.directory(IDENTITY, NODE, 3)
    store.fs.makedirs(directory, exist_ok=True)
    store.fs.pipe_file(f"{directory}/state-{sha[:16]}.pt", data)
    marker = {"format": 1, "file": f"state-{sha[:16]}.pt", "nbytes": len(data), "sha256": sha}
    store.fs.pipe_file(f"{directory}/COMMIT", json.dumps(marker).encode())
    assert store.info(IDENTITY, NODE, 3) == CheckpointInfo(len(data), sha)
    with pytest.raises(
        CheckpointError, match=r"weights_only=True: refused global test_checkpoints\.Arbitrary"
    ):
        store.load(IDENTITY, NODE, 3)


class Shell:
    def __reduce__(self):
        return (os.system, ("echo this must never run",))


def test_a_checkpoint_that_would_run_code_is_refused_naming_what_it_calls(store):
    buffer = io.BytesIO()
    torch.save({"thing": Shell()}, buffer)
    data = buffer.getvalue()
    sha = hashlib.sha256(data).hexdigest()
    directory = store.directory(IDENTITY, NODE, 3)
    store.fs.makedirs(directory, exist_ok=True)
    store.fs.pipe_file(f"{directory}/state-{sha[:16]}.pt", data)
    marker = {"format": 1, "file": f"state-{sha[:16]}.pt", "nbytes": len(data), "sha256": sha}
    store.fs.pipe_file(f"{directory}/COMMIT", json.dumps(marker).encode())
    with pytest.raises(CheckpointError) as refused:
        store.load(IDENTITY, NODE, 3)
    # torch's reason is kept, not only its boilerplate: the global and why it was refused
    assert "refused global posix.system" in str(refused.value) and "blocked" in str(refused.value)


@pytest.mark.parametrize(
    ("identity", "node", "step", "message"),
    [
        ("0123ABCD", NODE, 1, "identity"),
        ("../../etc", NODE, 1, "identity"),
        ("abc", NODE, 1, "identity"),
        ("0" * 65, NODE, 1, "identity"),
        (IDENTITY, "my-node", 1, "node"),
        (IDENTITY, f"{NODE}/x", 1, "node"),
        (IDENTITY, NODE, 0, "step"),
        (IDENTITY, NODE, -3, "step"),
        (IDENTITY, NODE, True, "step"),
        (IDENTITY, NODE, 2.0, "step"),
    ],
)
def test_bad_addresses_are_rejected(store, identity, node, step, message):
    for call in (
        lambda: store.save(identity, node, step, {"x": 1}),
        lambda: store.load(identity, node, step),
        lambda: store.info(identity, node, step),
        lambda: store.delete(identity, node, step),
    ):
        with pytest.raises(ValueError, match=message):
            call()


def test_points_lists_committed_checkpoints_of_one_identity(store):
    other_identity = "99999999"
    store.save(IDENTITY, NODE, 10, {"a": 1})
    store.save(IDENTITY, NODE, 2, {"a": 2})
    store.save(IDENTITY, OTHER_NODE, 1_000_000_000, {"a": 3})  # more than nine digits
    store.save(other_identity, NODE, 1, {"a": 4})
    store.fs.rm_file(f"{store.directory(IDENTITY, NODE, 2)}/COMMIT")
    points = list(store.points(IDENTITY))
    assert [(node, step) for node, step, _ in points] == [(OTHER_NODE, 1_000_000_000), (NODE, 10)]
    assert points[1][2] == store.info(IDENTITY, NODE, 10)
    assert store.load(IDENTITY, OTHER_NODE, 1_000_000_000) == {"a": 3}
    assert [(n, s) for n, s, _ in store.points(other_identity)] == [(NODE, 1)]
    with pytest.raises(ValueError, match="identity"):
        store.points("nope")


def test_delete(store):
    store.save(IDENTITY, NODE, 3, a_state())
    store.save(IDENTITY, NODE, 4, a_state())
    store.delete(IDENTITY, NODE, 3)
    assert store.info(IDENTITY, NODE, 3) is None
    assert [(n, s) for n, s, _ in store.points(IDENTITY)] == [(NODE, 4)]
    assert not store.fs.exists(store.directory(IDENTITY, NODE, 3))
    with pytest.raises(CheckpointError):
        store.load(IDENTITY, NODE, 3)
    store.delete(IDENTITY, NODE, 3)  # deleting what is not there is fine
    store.save(IDENTITY, NODE, 3, {"again": 1})  # and the point can be saved anew
    assert store.load(IDENTITY, NODE, 3) == {"again": 1}


def test_picklable(store):
    info = store.save(IDENTITY, NODE, 3, a_state())
    store.fs  # noqa: B018 - opened: the filesystem object must not travel
    copy = pickle.loads(pickle.dumps(store))
    assert copy._fs is None
    assert copy.url == store.url and copy.storage_options == store.storage_options
    assert copy.info(IDENTITY, NODE, 3) == info
    assert_same(copy.load(IDENTITY, NODE, 3), store.load(IDENTITY, NODE, 3))


def test_a_memory_store_opens_only_in_the_process_that_made_it():
    store = CheckpointStore(f"memory://dagtune-test-{uuid.uuid4().hex}")
    assert store.process_local and not CheckpointStore("/tmp/x").process_local
    here = pickle.loads(pickle.dumps(store))
    assert here.info(IDENTITY, NODE, 3) is None  # in this process: the same memory
    elsewhere = CheckpointStore.__new__(CheckpointStore)
    elsewhere.__setstate__({**store.__getstate__(), "process": "another process"})  # as unpickled there
    with pytest.raises(ValueError, match="is the memory of the process that made this store"):
        elsewhere.info(IDENTITY, NODE, 3)


def test_local_paths_are_made_absolute_and_options_hidden(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    store = CheckpointStore("runs")
    assert store.url == f"{tmp_path.as_posix()}/runs"
    assert CheckpointStore(f"file://{tmp_path}/runs").url == store.url
    secret = CheckpointStore("memory://x", storage_options={"key": "secret-value"})
    assert "secret-value" not in repr(secret)
