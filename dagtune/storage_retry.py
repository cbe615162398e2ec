"""Storage operations that ride out an outage: transient errors are retried with backoff.

An object store on the other side of a network is sometimes unreachable for seconds (a
restarting endpoint, a dropped route, throttling). Every storage operation of a study (the
coordinator's plan and trial journals, its results, its leases, the workers' checkpoint
saves and loads) goes through `StorageRetry.call` (or a filesystem wrapped in
`RetryingFileSystem`), which retries an error that `is_transient` says will pass with
exponential backoff (0.5 s doubling to 15 s) and reports the outage as it goes, on the
``dagtune`` logger::

    dagtune: storage s3://bucket/runs unreachable since 12:03:07 (EndpointConnectionError ...
    while listing ...); retrying for up to 300 s

then every 30 s while it lasts, and once it is reachable again. An outage is tracked per
storage URL and process, so every operation waiting on it reports and gives up together: once
storage has been unreachable for `StorageRetry.seconds` (``Study(storage_retry_seconds=...)``,
default 300 s) the operation raises `StorageUnavailableError`, which names the storage, since when,
the last error and the setting. A worker's finished checkpoint stays in its memory meanwhile
(its save is retried), so an outage shorter than the bound loses no training.

Errors that will not pass by waiting (permission denied, no such bucket or file, a disk that
is full, an invalid request) are raised at once.

An outage does not always raise: a connection whose other end vanished without a reset (a
dropped route, a middlebox that lost its state) leaves a request waiting for an answer that
never comes, and an upload into it blocks for good once the socket's buffers are full. s3fs
and botocore retry a read that timed out several times over (minutes, with no error seen
here), and nothing times out a stalled upload. So every attempt of an asynchronous fsspec
filesystem (s3fs, gcsfs, adlfs, ...) through `RetryingFileSystem` has a deadline
(`attempt_deadline`: `ATTEMPT_SECONDS`, plus a second per MiB it sends or, given
``expected_bytes``, reads; at most the time left to the bound during an outage). Past it the
attempt is cancelled (its connection is dropped) and counts as a transient failure: the
outage is reported, and the operation is retried on a new connection. The filesystems dagtune
opens for S3 have botocore's own retries off (`single_attempt_options`), so that a failure
reaches `StorageRetry` at once. The results group (``results.zarr``) is written through zarr's
own filesystem: its writes are retried whole, but have no attempt deadline.

Retrying an exclusive create (``pipe_file(..., mode="create")``) whose first attempt reached
the storage but whose answer was lost makes the retry fail with `FileExistsError`; callers of
exclusive creates (the checkpoint commit marker, the study lease) read back what is there and
recognise their own write.
"""

from __future__ import annotations

import errno
import inspect
import logging
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from fsspec.exceptions import FSTimeoutError

from dagtune.errors import DagtuneError
from dagtune.validation import check_number

__all__ = [
    "ATTEMPT_SECONDS",
    "DEFAULT_RETRY_SECONDS",
    "RetryingFileSystem",
    "StorageRetry",
    "StorageUnavailableError",
    "check_retry_seconds",
    "is_transient",
    "single_attempt_options",
]

log = logging.getLogger("dagtune")

T = TypeVar("T")

#: how long storage may stay unreachable before a study gives up (``Study(storage_retry_seconds=)``)
DEFAULT_RETRY_SECONDS = 300.0
FIRST_DELAY, MAX_DELAY = 0.5, 15.0
REPORT_EVERY = 30.0  # seconds between "still unreachable" lines
#: seconds an attempt may take (plus `SECONDS_PER_BYTE` per byte it moves) before it counts as
#: stalled: cancelled and retried
ATTEMPT_SECONDS = 60.0
SECONDS_PER_BYTE = 1.0 / (1 << 20)  # a transfer slower than 1 MiB/s is taken for a stall

# errno values of failures that pass: the network, a busy or failing server (s3fs maps 5xx and
# SlowDown to EBUSY / EREMOTEIO)
_TRANSIENT_ERRNOS = frozenset(
    getattr(errno, name)
    for name in (
        "ECONNREFUSED",
        "ECONNRESET",
        "ECONNABORTED",
        "ETIMEDOUT",
        "EHOSTUNREACH",
        "EHOSTDOWN",
        "ENETUNREACH",
        "ENETDOWN",
        "ENETRESET",
        "EPIPE",
        "EAGAIN",
        "EBUSY",
        "EREMOTEIO",
    )
    if hasattr(errno, name)
)
# errors that say what is wrong with the request or the storage itself: never retried
_PERMANENT = (
    PermissionError,
    FileNotFoundError,
    FileExistsError,
    IsADirectoryError,
    NotADirectoryError,
    ValueError,
    TypeError,
)
# S3 error codes (and HTTP statuses) of a throttled or failing service
_TRANSIENT_CODES = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestLimitExceeded",
        "TooManyRequests",
        "TooManyRequestsException",
        "BandwidthLimitExceeded",
        "RequestTimeout",
        "RequestTimeoutException",
        "InternalError",
        "ServiceUnavailable",
        "PriorRequestNotComplete",
    }
)
# exception types of the libraries s3fs runs on, by module: looked up only if the module is
# loaded (an error can't be of a type whose module was never imported)
_TRANSIENT_TYPES = {
    "botocore.exceptions": ("HTTPClientError", "ConnectionError", "ResponseStreamingError"),
    "aiohttp.client_exceptions": ("ClientConnectionError", "ClientPayloadError", "ServerTimeoutError"),
    "fsspec.exceptions": ("FSTimeoutError",),
}


class StorageUnavailableError(OSError, DagtuneError):
    """Storage stayed unreachable longer than the retry bound (the message says which
    storage, since when, the last error and how to wait longer)."""


def _chain(error: BaseException) -> Iterator[BaseException]:
    """`error` and the errors it was raised from or while handling (at most 16)."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen and len(seen) < 16:
        seen.add(id(error))
        yield error
        error = error.__cause__ or error.__context__


def _transient_type(error: BaseException) -> bool:
    for module, names in _TRANSIENT_TYPES.items():
        loaded = sys.modules.get(module)
        kinds = tuple(k for k in (getattr(loaded, n, None) for n in names) if isinstance(k, type))
        if kinds and isinstance(error, kinds):
            return True
    return False


def _transient_response(error: BaseException) -> bool:
    """A botocore ClientError of a throttled or failing service (HTTP 429, 5xx)."""
    response = getattr(error, "response", None)
    if not isinstance(response, dict):
        return False
    code = str((response.get("Error") or {}).get("Code", ""))
    status = (response.get("ResponseMetadata") or {}).get("HTTPStatusCode")
    return code in _TRANSIENT_CODES or (isinstance(status, int) and (status == 429 or status >= 500))


def is_transient(error: BaseException) -> bool:
    """Whether `error` is one that waiting may cure: the storage unreachable (connection
    refused, reset, timed out), throttling or a server error (HTTP 429 or 5xx, S3 SlowDown),
    as Python, botocore, aiohttp and fsspec raise them. Permission denied, a missing bucket
    or file, a full disk and other errors about the request are not."""
    if isinstance(error, StorageUnavailableError):
        return False  # an inner retry gave up already
    if isinstance(error, _PERMANENT):
        return False
    for cause in _chain(error):
        if isinstance(cause, StorageUnavailableError):
            return False
        if isinstance(cause, (ConnectionError, TimeoutError)):
            return True
        if isinstance(cause, OSError) and cause.errno in _TRANSIENT_ERRNOS:
            return True
        if _transient_type(cause) or _transient_response(cause):
            return True
    return False


def check_retry_seconds(value: Any, field: str = "storage_retry_seconds") -> float:
    """`value` as a number of seconds >= 0, else a ValueError naming `field`."""
    return float(check_number(field, value, minimum=0, expected="a finite number of seconds >= 0"))


def single_attempt_options(url: str, storage_options: dict[str, Any]) -> dict[str, Any]:
    """`storage_options` for a filesystem dagtune retries itself: on S3, botocore's own
    retries are off (unless the options set them), so that every failure reaches
    `StorageRetry` at once, to be reported, backed off and bounded, instead of being retried
    unseen for 10-20 s (and a stalled request for minutes)."""
    options = dict(storage_options)
    if url.split("://", 1)[0] in ("s3", "s3a"):
        config = dict(options.get("config_kwargs") or {})
        config.setdefault("retries", {"total_max_attempts": 1})
        options["config_kwargs"] = config
    return options


class _Outage:
    """One storage's current outage in this process: when it began, when it was last
    reported. Shared by every operation on that storage (`_outage_of`)."""

    def __init__(self, url: str):
        self.url = url
        self.lock = threading.Lock()
        self.began: float | None = None  # monotonic
        self.began_at = 0.0  # wall clock, for messages
        self.reported = -float("inf")

    def failed(self, error: BaseException, what: str, seconds: float, started: float) -> float:
        """Note a transient failure of an operation begun at `started` (monotonic): an
        outage begins when the first failing operation began. Returns that time."""
        now = time.monotonic()
        with self.lock:
            first = self.began is None
            if first:
                self.began, self.began_at = started, time.time() - (now - started)
            began = self.began
            due = first or now - self.reported >= REPORT_EVERY
            if due:
                self.reported = now
        if due:
            left = max(0.0, began + seconds - now)
            log.warning(
                "dagtune: storage %s unreachable since %s (%s while %s); retrying for up to %.0f s more",
                self.url,
                _clock(self.began_at),
                _short(error),
                what,
                left,
            )
        return began

    def ended(self) -> None:
        if self.began is None:  # the common case, without the lock
            return
        with self.lock:
            if self.began is None:
                return
            lasted, self.began = time.monotonic() - self.began, None
            self.reported = -float("inf")
        log.warning("dagtune: storage %s reachable again after %.0f s", self.url, lasted)


_outages: dict[str, _Outage] = {}
_outages_lock = threading.Lock()


def _outage_of(url: str) -> _Outage:
    with _outages_lock:
        return _outages.setdefault(url, _Outage(url))


def _clock(stamp: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(stamp))


def _short(error: BaseException) -> str:
    text = str(error).splitlines()[0] if str(error) else ""
    return f"{type(error).__name__}: {text[:200]}" if text else type(error).__name__


class StorageRetry:
    """Retry storage operations on `url` through outages of up to `seconds` (0: never retry).

    `sleep` is injectable for tests. Every retrying instance for one URL in a process shares
    the outage's start, so the bound is on how long the storage has been unreachable, not on
    how long one operation waited."""

    def __init__(
        self, url: str, seconds: float = DEFAULT_RETRY_SECONDS, *, sleep: Callable[[float], Any] = time.sleep
    ):
        self.url = url
        self.seconds = check_retry_seconds(seconds)
        self.sleep = sleep

    def time_left(self) -> float | None:
        """Seconds until the current outage of this storage reaches the bound (never below
        1 s); None while the storage is reachable."""
        began = _outage_of(self.url).began
        return None if began is None else max(1.0, began + self.seconds - time.monotonic())

    def call(self, function: Callable[[], T], what: str) -> T:
        """`function()`, retried while it fails with a transient error (`is_transient`) and
        the storage has been unreachable for less than `seconds`; `StorageUnavailableError` after
        that. `what` says what it does, for the reports (``"listing studies/x/journal"``)."""
        outage = _outage_of(self.url)
        started = time.monotonic()
        delay = FIRST_DELAY
        while True:
            try:
                result = function()
            except Exception as error:
                if not is_transient(error):
                    raise
                began = min(started, outage.failed(error, what, self.seconds, started))
                left = began + self.seconds - time.monotonic()
                if left <= 0:
                    raise StorageUnavailableError(
                        f"storage {self.url} unreachable for {time.monotonic() - began:.0f} s (since "
                        f"{_clock(time.time() - (time.monotonic() - began))}); last error while {what}: "
                        f"{_short(error)}. Gave up after storage_retry_seconds={self.seconds:g}; what "
                        "was committed before is kept, and running the study again resumes it"
                    ) from error
                self.sleep(min(delay, left))
                delay = min(delay * 2, MAX_DELAY)
            else:
                outage.ended()
                return result


# fsspec methods that touch no storage: passed through as they are
_LOCAL_ONLY = frozenset(
    {"invalidate_cache", "unstrip_protocol", "sign", "start_transaction", "end_transaction", "transaction"}
)


# fsspec methods answered from the listings cache unless told `refresh`: dagtune always asks
# the storage. The filesystem object, and so its cache, is shared by the process: another
# thread's listing, taken just before a file was written, can be cached after the writer
# invalidated it, and s3fs would then say that file does not exist.
_ASKED_FRESH = frozenset({"ls", "info"})


class RetryingFileSystem:
    """An fsspec filesystem whose every public method is retried through outages
    (`StorageRetry`); `guard` (if any) is called before every attempt, e.g. to check that
    this process still holds the right to write (`dagtune.study_lease`).

    On an asynchronous filesystem every attempt has a deadline (`attempt_deadline`), after
    which it is cancelled and retried: a stalled connection never holds an operation beyond
    the bound. A method call may pass ``expected_bytes`` (what a read will fetch, if known) to
    lengthen the deadline of a large read; it is not passed on.

    File objects `open` returns are not retried while they are read or written; dagtune
    reads and writes whole files (``cat_file``, ``pipe_file``).

    Listings and file details (``ls``, ``info``) are asked of the storage, never of the
    listings cache (see `_ASKED_FRESH`)."""

    def __init__(
        self,
        fs: Any,
        retry: StorageRetry,
        guard: Callable[[], None] | None = None,
        *,
        attempt_seconds: float | None = None,
    ):
        self.fs = fs
        self.retry = retry
        self.guard = guard
        self.attempt_seconds = ATTEMPT_SECONDS if attempt_seconds is None else attempt_seconds

    def with_guard(self, guard: Callable[[], None]) -> RetryingFileSystem:
        """The same filesystem, calling `guard` before every attempt."""
        return RetryingFileSystem(self.fs, self.retry, guard, attempt_seconds=self.attempt_seconds)

    def attempt_deadline(self, moved_bytes: int) -> float:
        """Seconds one attempt moving `moved_bytes` may take: `attempt_seconds` plus a second
        per MiB, at most the time left to the bound while storage is unreachable."""
        deadline = self.attempt_seconds + moved_bytes * SECONDS_PER_BYTE
        left = self.retry.time_left()
        return deadline if left is None else min(deadline, left)

    def __getattr__(self, name: str) -> Any:
        if name in ("fs", "retry", "guard", "attempt_seconds"):  # not set yet (being copied)
            raise AttributeError(name)
        attribute = getattr(self.fs, name)
        if name.startswith("_") or name in _LOCAL_ONLY or not callable(attribute):
            return attribute
        # fsspec's blocking wrapper of a coroutine method takes a `timeout`, which cancels it
        timed = inspect.iscoroutinefunction(getattr(attribute, "__wrapped__", None))
        fresh = name in _ASKED_FRESH

        def retried(*args: Any, expected_bytes: int = 0, **kwargs: Any) -> Any:
            if fresh:
                kwargs.setdefault("refresh", True)
            sent = sum(len(a) for a in (*args, *kwargs.values()) if isinstance(a, (bytes, bytearray)))

            def attempt() -> Any:
                if self.guard is not None:
                    self.guard()
                if not timed:
                    return attribute(*args, **kwargs)
                deadline = self.attempt_deadline(sent + expected_bytes)
                try:
                    return attribute(*args, timeout=deadline, **kwargs)
                except FSTimeoutError as error:
                    raise TimeoutError(
                        f"no answer within {deadline:.0f} s (a stalled connection?)"
                    ) from error

            shown = ", ".join(str(a)[:120] for a in args if isinstance(a, str))
            return self.retry.call(attempt, f"{name}({shown})")

        retried.__name__ = name
        return retried

    def __repr__(self) -> str:
        return f"RetryingFileSystem({self.retry.url!r})"
