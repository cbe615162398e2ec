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

Retrying an exclusive create (``pipe_file(..., mode="create")``) whose first attempt reached
the storage but whose answer was lost makes the retry fail with `FileExistsError`; callers of
exclusive creates (the checkpoint commit marker, the study lease) read back what is there and
recognise their own write.
"""

from __future__ import annotations

import errno
import logging
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

__all__ = [
    "DEFAULT_RETRY_SECONDS",
    "RetryingFileSystem",
    "StorageRetry",
    "StorageUnavailableError",
    "check_retry_seconds",
    "is_transient",
]

log = logging.getLogger("dagtune")

T = TypeVar("T")

#: how long storage may stay unreachable before a study gives up (``Study(storage_retry_seconds=)``)
DEFAULT_RETRY_SECONDS = 300.0
FIRST_DELAY, MAX_DELAY = 0.5, 15.0
REPORT_EVERY = 30.0  # seconds between "still unreachable" lines

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


class StorageUnavailableError(OSError):
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
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < float("inf"):
        raise ValueError(f"{field} must be a finite number of seconds >= 0, got {value!r}")
    return float(value)


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


class RetryingFileSystem:
    """An fsspec filesystem whose every public method is retried through outages
    (`StorageRetry`); `guard` (if any) is called before every attempt, e.g. to check that
    this process still holds the right to write (`dagtune.study_lease`).

    File objects `open` returns are not retried while they are read or written; dagtune
    reads and writes whole files (``cat_file``, ``pipe_file``)."""

    def __init__(self, fs: Any, retry: StorageRetry, guard: Callable[[], None] | None = None):
        self.fs = fs
        self.retry = retry
        self.guard = guard

    def with_guard(self, guard: Callable[[], None]) -> RetryingFileSystem:
        """The same filesystem, calling `guard` before every attempt."""
        return RetryingFileSystem(self.fs, self.retry, guard)

    def __getattr__(self, name: str) -> Any:
        if name in ("fs", "retry", "guard"):  # not set yet (an object being copied): no recursion
            raise AttributeError(name)
        attribute = getattr(self.fs, name)
        if name.startswith("_") or name in _LOCAL_ONLY or not callable(attribute):
            return attribute

        def retried(*args: Any, **kwargs: Any) -> Any:
            def attempt() -> Any:
                if self.guard is not None:
                    self.guard()
                return attribute(*args, **kwargs)

            shown = ", ".join(str(a)[:120] for a in args if isinstance(a, str))
            return self.retry.call(attempt, f"{name}({shown})")

        retried.__name__ = name
        return retried

    def __repr__(self) -> str:
        return f"RetryingFileSystem({self.retry.url!r})"
