"""Helpers for the durability tests: trainers that are slow or count their steps, a
loopback S3 endpoint (moto's server on 127.0.0.1) and storage locations on both backends."""

from __future__ import annotations

import contextlib
import logging
import os
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field

from dagtune.plan import _journal as journal_module
from dagtune.sim import SyntheticTrainer

SECRET = "not-a-real-secret-6f1c2b"  # must never show up in anything dagtune writes


class SlowTrainer(SyntheticTrainer):
    """`SyntheticTrainer` (same curves) that takes `delay` seconds per step and, with `log`,
    appends one line per trained step to that file (to count executed steps across
    processes)."""

    def __init__(self, delay: float = 0.0, log: str = "", **kwargs):
        super().__init__(**kwargs)
        self.delay, self.log = delay, log

    def train(self) -> dict:
        if self.delay:
            time.sleep(self.delay)
        if self.log:
            with open(self.log, "a") as file:
                file.write(f"{os.getpid()}\n")
        return super().train()


class CrashingTrainer(SyntheticTrainer):
    """`SyntheticTrainer` that takes its whole worker process down (as running out of memory
    or a crash in native code would) on the third step of a learning rate of 1 or more."""

    def train(self) -> dict:
        if float(self.hp["lr"]) >= 1.0 and self.step == 2:
            os._exit(3)
        return super().train()


@dataclass
class Storage:
    """A place to keep studies: `url` and the `options` s3fs needs (empty locally)."""

    kind: str
    url: str
    options: dict = field(default_factory=dict)

    def fs(self):
        import fsspec

        return fsspec.core.url_to_fs(self.url, **self.options)


@contextlib.contextmanager
def loopback_s3() -> Iterator[dict]:
    """moto's S3 server on 127.0.0.1 (a free port); yields s3fs storage options."""
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        yield {"endpoint_url": f"http://{host}:{port}", "key": "testing-key", "secret": SECRET}
    finally:
        server.stop()


def new_bucket(options: dict) -> str:
    import s3fs

    bucket = f"dagtune-{uuid.uuid4().hex[:12]}"
    s3fs.S3FileSystem(**options).mkdir(bucket)
    return bucket


def set_attempt_seconds(seconds: float) -> float:
    """Set `dagtune.storage_retry.ATTEMPT_SECONDS` in this process (a Dask worker, through
    ``client.run``) for the filesystems opened from now on; returns the value it had."""
    from dagtune import storage_retry

    previous, storage_retry.ATTEMPT_SECONDS = storage_retry.ATTEMPT_SECONDS, seconds
    return previous


def count_lines(monkeypatch) -> list[int]:
    """How many journal lines are decoded from now on (one element, growing)."""
    decoded = [0]
    decode = journal_module.decode_line

    def counted(line: bytes) -> dict:
        decoded[0] += 1
        return decode(line)

    monkeypatch.setattr(journal_module, "decode_line", counted)
    return decoded


def count_counting_plans(monkeypatch) -> list[int]:
    """How many trial configs are put through a counting plan (`dagtune.plan.unique_steps`, as
    the report's figures call it) from now on (one element, growing)."""
    import dagtune.coordinator._report as report

    counted = [0]
    unique_steps = report.unique_steps

    def counting(trials):
        trials = list(trials)
        counted[0] += len(trials)
        return unique_steps(trials)

    monkeypatch.setattr(report, "unique_steps", counting)
    return counted
