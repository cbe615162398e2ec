"""Checkpoint I/O: a 100 MB state (1 MB in smoke mode) through `CheckpointStore` against raw fsspec writes.

Both sides serialize and deserialize the same state on the same filesystem: the raw
baseline is ``torch.save`` into memory and one fsspec write, one fsspec read and
``torch.load(weights_only=True)``; the store adds a SHA-256 of the bytes (hashed as
torch.save writes them, and on a second thread while torch.load reads them), a
content-addressed data file, a commit marker (and fsync of both on local disk) and its
checks on load (size, hash: a state is returned only if it matches). Measured side by side,
alternating, on local disk and on an S3 endpoint on loopback (moto's server), median of 7
repetitions (11 with --full). The load
average of the machine at the start is given: the ratios are wall times, and on a machine
busy with other work both sides slow down unevenly.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import socket
import statistics
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import torch

from dagtune.checkpoints import CheckpointStore

IDENTITY, NODE = "0123456789abcdef", "fedcba9876543210"


@contextlib.contextmanager
def loopback_s3() -> Iterator[dict]:
    """A moto S3 server on 127.0.0.1 with one bucket; yields storage options for s3fs."""
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no access log per request
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        options = {"endpoint_url": f"http://127.0.0.1:{port}", "key": "testing", "secret": "testing"}
        import s3fs

        s3fs.S3FileSystem(**options).mkdir("dagtune-perf")
        yield options
    finally:
        server.stop()


def _serialize(state: dict) -> bytes:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getvalue()


def _measure(store: CheckpointStore, raw_fs, raw_path: str, state: dict, repeats: int) -> dict[str, float]:
    data = _serialize(state)
    timings: dict[str, list[float]] = {"store_save": [], "store_load": [], "raw_write": [], "raw_read": []}
    cpu: dict[str, list[float]] = {name: [] for name in timings}  # CPU seconds of this process

    def timed(name: str, operation: Any) -> None:
        cpu_began, began = time.process_time(), time.perf_counter()
        operation()
        timings[name].append(time.perf_counter() - began)
        cpu[name].append(time.process_time() - cpu_began)

    raw_fs.makedirs(raw_path, exist_ok=True)

    def store_side(step: int) -> None:
        timed("store_save", lambda: store.save(IDENTITY, NODE, step, state))
        timed("store_load", lambda: store.load(IDENTITY, NODE, step))
        store.delete(IDENTITY, NODE, step)  # (untimed) S3's memory holds one copy at a time

    def raw_side(step: int) -> None:
        path = f"{raw_path}/{step}.pt"
        timed("raw_write", lambda: raw_fs.pipe_file(path, _serialize(state)))
        timed("raw_read", lambda: torch.load(io.BytesIO(raw_fs.cat_file(path)), weights_only=True))
        raw_fs.rm_file(path)

    for step in range(1, repeats + 1):  # alternating which side goes first
        for side in (store_side, raw_side) if step % 2 else (raw_side, store_side):
            side(step)
    megabytes = len(data) / 1e6
    median = {name: statistics.median(values) for name, values in timings.items()}
    ratios = {  # each repetition's store time over its raw time, side by side
        kind: [s / r for s, r in zip(timings[f"store_{a}"], timings[f"raw_{b}"], strict=True)]
        for kind, a, b in (("save", "save", "write"), ("load", "load", "read"))
    }
    return {
        "megabytes": megabytes,
        **{f"{name}_mb_per_s": megabytes / seconds for name, seconds in median.items()},
        "save_ratio": statistics.median(ratios["save"]),
        "load_ratio": statistics.median(ratios["load"]),
        "save_cpu_ratio": statistics.median(cpu["store_save"]) / statistics.median(cpu["raw_write"]),
        "load_cpu_ratio": statistics.median(cpu["store_load"]) / statistics.median(cpu["raw_read"]),
        "save_ratios": ", ".join(f"{r:.2f}" for r in ratios["save"]),
        "load_ratios": ", ".join(f"{r:.2f}" for r in ratios["load"]),
    }


def benchmark(mode: str = "quick") -> dict[str, Any]:
    load = os.getloadavg()[0]
    megabytes = 1 if mode == "smoke" else 100
    repeats = {"smoke": 3, "quick": 7, "full": 11}[mode]
    state = {"weights": torch.arange(megabytes * 250_000, dtype=torch.float32)}  # 4 bytes each
    rows = []
    with tempfile.TemporaryDirectory() as directory:
        store = CheckpointStore(f"{directory}/store")
        rows.append(
            {"storage": "local disk", **_measure(store, store.fs, f"{directory}/raw", state, repeats)}
        )
    with loopback_s3() as options:
        store = CheckpointStore("s3://dagtune-perf/store", options)
        rows.append(
            {
                "storage": "S3 (moto, loopback)",
                **_measure(store, store.fs, "dagtune-perf/raw", state, repeats),
            }
        )
    return {
        "rows": rows,
        "repeats": repeats,
        "commit": _commit(),
        "load_average": load,
        "load_average_after": os.getloadavg()[0],
    }


def _commit() -> str:
    import subprocess
    from pathlib import Path

    completed = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=Path(__file__).parent
    )
    return completed.stdout.strip()


if __name__ == "__main__":
    import json

    print(json.dumps(benchmark(), indent=2))


def markdown(result: dict[str, Any]) -> str:
    from perf.table import table

    return (
        table(
            result["rows"],
            [
                ("storage", "storage"),
                ("megabytes", "MB"),
                ("store_save_mb_per_s", "store save MB/s"),
                ("raw_write_mb_per_s", "raw write MB/s"),
                ("save_ratio", "save time ratio"),
                ("store_load_mb_per_s", "store load MB/s"),
                ("raw_read_mb_per_s", "raw read MB/s"),
                ("load_ratio", "load time ratio"),
                ("save_cpu_ratio", "save CPU ratio"),
                ("load_cpu_ratio", "load CPU ratio"),
                ("save_ratios", "save ratio of each repetition"),
                ("load_ratios", "load ratio of each repetition"),
            ],
        )
        + f"\n\nMedian of {result['repeats']} repetitions, store and raw alternating which goes first; "
        "the ratios are the medians of each repetition's store time over its raw time (all of "
        "them in the last two columns, save then load); the CPU ratios are the median CPU time "
        "of this process (the hash thread's included) of the store over that of raw, which the "
        "machine's load and the disk's fsync time do not change. Store save: torch.save streamed into a "
        "temporary file through a writer that hashes each chunk (SHA-256; a large chunk on a "
        "second thread while it is written, and what was written so far synced to disk "
        "meanwhile), the commit marker written to a temporary file, both fsynced at once, the "
        "data file renamed to its content-addressed name, then the marker linked into place; on S3 torch.save into memory, hashed as it is written, one "
        "object. Store load (local disk): torch.load(weights_only=True) reads the open file "
        "while a second thread hashes the same file mapped into memory; the state is returned "
        "only if size and hash match the marker (S3: one read, then the same). Raw write: "
        "torch.save into memory and one fsspec write (no fsync); raw read: one fsspec read and "
        "torch.load(weights_only=True). So both sides serialize, and the ratios are what the "
        "store's guarantees cost. "
        f"Measured at commit {result.get('commit', '?')}; load average "
        f"{result.get('load_average', float('nan')):.1f} (1 min, {os.cpu_count()} cores shared with other "
        f"work) when it began, {result.get('load_average_after', float('nan')):.1f} when it ended."
    )
