"""The retry policy of every storage call: a transient fault (connection refused or reset, a timeout, a 5xx or
SlowDown answer) is retried with exponential backoff for up to TANDEM_STORAGE_RETRY_S seconds in all (default 60),
so an endpoint that restarts mid-run costs a pause, not the run. s3fs and botocore retry a few times on their own
(about 8 s against a stopped endpoint); this budget bounds the whole. After it, the operation fails with one line
naming the URL, the error and where the endpoint comes from.
"""

from __future__ import annotations

import errno
import logging
import os
import time
from collections.abc import Callable
from typing import TypeVar

from core.errors import RetryableError, UserError
from storage.location import Location, is_local

log = logging.getLogger(__name__)
T = TypeVar("T")

RETRY_ENV = "TANDEM_STORAGE_RETRY_S"
DEFAULT_RETRY_S = 60.0
FIRST_DELAY_S = 0.5
MAX_DELAY_S = 8.0
# Exception class names (matched by name: config/ does not import botocore or aiohttp) that mean the
# request never got an answer: the endpoint is down, restarting or overloaded.
_TRANSIENT_NAMES = {
    "EndpointConnectionError",
    "ConnectionClosedError",
    "ConnectTimeoutError",
    "ReadTimeoutError",
    "HTTPClientError",
    "ClientConnectorError",
    "ServerDisconnectedError",
    "ClientOSError",
    "ClientPayloadError",
    "ServerTimeoutError",
    "IncompleteReadError",
    "ResponseStreamingError",
}
_TRANSIENT_ERRNOS = {
    errno.ECONNREFUSED,
    errno.ECONNRESET,
    errno.ECONNABORTED,
    errno.ETIMEDOUT,
    errno.EPIPE,
    errno.EHOSTUNREACH,
    errno.ENETUNREACH,
    errno.EAGAIN,
}
# S3 answers that say "try again": throttling and server-side failures.
_TRANSIENT_CODES = {
    "SlowDown",
    "ServiceUnavailable",
    "InternalError",
    "RequestTimeout",
    "Throttling",
    "ThrottlingException",
    "500",
    "502",
    "503",
    "504",
}


class StorageUnavailable(RetryableError):
    """Storage stayed unreachable for the whole retry budget (a later attempt may succeed)."""


def retry_budget() -> float:
    """Seconds one operation may spend retrying transient faults (TANDEM_STORAGE_RETRY_S, default 60)."""
    raw = os.environ.get(RETRY_ENV, "").strip()
    if not raw:
        return DEFAULT_RETRY_S
    try:
        value = float(raw)
    except ValueError:
        raise UserError(f"{RETRY_ENV}={raw!r}: expected a number of seconds, e.g. {RETRY_ENV}=60") from None
    if value < 0:
        raise UserError(f"{RETRY_ENV}={raw!r}: must be >= 0 (0 turns retries off)")
    return value


def is_transient(exc: BaseException) -> bool:
    """Whether a failed storage call may succeed when repeated (the endpoint was down, slow or overloaded)."""
    for err in (exc, exc.__cause__, exc.__context__):
        if err is None:
            continue
        if any(cls.__name__ in _TRANSIENT_NAMES for cls in type(err).__mro__):
            return True
        if isinstance(err, ConnectionError | TimeoutError):
            return True
        if isinstance(err, OSError) and err.errno in _TRANSIENT_ERRNOS:
            return True
        if _error_code(err) in _TRANSIENT_CODES:
            return True
    return False


def _error_code(err: BaseException) -> str | None:
    response = getattr(err, "response", None)
    if not isinstance(response, dict):
        return None
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return response.get("Error", {}).get("Code") or (str(status) if status else None)


def s3_error_code(exc: BaseException) -> str | None:
    """The S3 error code behind an s3fs exception (s3fs keeps botocore's ClientError as the cause)."""
    response = getattr(exc.__cause__, "response", None)
    return response.get("Error", {}).get("Code") if isinstance(response, dict) else None


def endpoint_hint(where: Location) -> str:
    """Where the endpoint of a location comes from, for the error after the retry budget."""
    if is_local(where):
        return "is the filesystem mounted and reachable on this machine?"
    options = where.options
    endpoint = (
        options.get("endpoint_url")
        or options.get("client_kwargs", {}).get("endpoint_url")
        or os.environ.get("AWS_ENDPOINT_URL_S3")
        or os.environ.get("AWS_ENDPOINT_URL")
    )
    if endpoint:
        return (
            f"is the endpoint at {endpoint} up? check AWS_ENDPOINT_URL (or run.storage_options.endpoint_url) "
            "and the network"
        )
    return "is the object store reachable from this machine? check AWS_ENDPOINT_URL and the network"


def with_retries(what: str, url: Location, call: Callable[[], T]) -> T:
    """call() once, and again with exponential backoff while it fails transiently, within the retry budget.

    Every retry is logged once; after the budget a StorageUnavailable names the URL, the error and the fix.
    Anything else (not found, access denied, a precondition) is raised at once: a retry cannot change it.
    """
    budget = retry_budget()
    deadline = time.monotonic() + budget
    delay = FIRST_DELAY_S
    attempt = 0
    while True:
        try:
            return call()
        except Exception as exc:
            if not is_transient(exc):
                raise
            attempt += 1
            left = deadline - time.monotonic()
            error = _describe(exc)
            if left <= 0:
                raise StorageUnavailable(
                    f"{url}: storage unreachable ({what}: {error}); gave up after {attempt} attempt(s) in "
                    f"{budget:.0f} s ({RETRY_ENV}); {endpoint_hint(url)}"
                ) from exc
            pause = min(delay, left)
            log.warning(
                "storage: %s %s failed (%s); retry %d in %.1f s (%.0f s of %s left)",
                what,
                url,
                error,
                attempt,
                pause,
                left,
                RETRY_ENV,
            )
            time.sleep(pause)
            delay = min(delay * 2, MAX_DELAY_S)


def _describe(exc: BaseException) -> str:
    """One line: the exception's type and first line of its message."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__
