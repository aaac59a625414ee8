"""fsspec I/O with the one rule that matters for readers: nothing half-written under a final name (exclusive
creates and compare-and-swap are in storage/conditional.py).

Local/NFS paths write to a temporary name in the same directory and rename (atomic on POSIX).
Object stores have no rename; there a single PUT is atomic per object, and directories are
committed by the marker (COMPLETE, manifest.json) written last.

Every operation here goes through `with_retries`: a transient fault (connection refused or reset, a
timeout, a 5xx or SlowDown answer) is retried with exponential backoff for up to TANDEM_STORAGE_RETRY_S
seconds in all (default 60), so an endpoint that restarts mid-run costs a pause, not the run. s3fs and
botocore retry a few times on their own (about 8 s against a stopped endpoint); this budget bounds the whole.
After it, the operation fails with one line naming the URL, the error and where the endpoint comes from.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import time
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

import fsspec
from fsspec.core import url_to_fs

from config.errors import RetryableError, UserError

log = logging.getLogger(__name__)
T = TypeVar("T")

# The fsspec options (endpoint, credentials) of each storage prefix this process was given: by the flow at its
# boundary (run.storage_options, data.storage_options), or, in a process a launcher started (a torchrun rank),
# from the environment the launcher handed down (use_environment_options), so that a rank can read spec.json
# from an object store before it knows the config. Nothing is read at import.
OPTIONS_ENV = "TANDEM_STORAGE_OPTIONS"
_OPTIONS: dict[str, dict[str, Any]] = {}


def use_environment_options() -> None:
    """Take the options a launcher handed down in the environment (see options_environment)."""
    for prefix, options in json.loads(os.environ.get(OPTIONS_ENV) or "{}").items():
        set_storage_options(prefix, options)


def set_storage_options(prefix: str, options: dict[str, Any]) -> None:
    """Remember fsspec options (endpoint, credentials) for every URL under `prefix`."""
    if options:
        _OPTIONS[prefix.rstrip("/")] = dict(options)


def options_environment() -> dict[str, str]:
    """The environment entry that hands the registered options to child processes."""
    return {OPTIONS_ENV: json.dumps(_OPTIONS)} if _OPTIONS else {}


def _options_for(url: str) -> dict[str, Any]:
    matches = [prefix for prefix in _OPTIONS if url == prefix or url.startswith(prefix + "/")]
    # The most specific prefix wins: data.source may live under run.storage with other credentials.
    return _OPTIONS[max(matches, key=len)] if matches else {}


# botocore retries a refused connection 4 times over about 8 s by itself; left at that, every attempt of
# with_retries would take 8 s and the budget would overrun by as much. One quick retry of its own keeps blips
# cheap; with_retries does the rest. A user's own config_kwargs (in the storage options) win.
S3_CLIENT_RETRIES = {"retries": {"max_attempts": 2, "mode": "standard"}}


def filesystem(url: str) -> tuple[fsspec.AbstractFileSystem, str]:
    """The filesystem and in-filesystem path of a URL, with options registered for its prefix."""
    options = _options_for(url)
    if url.startswith(("s3://", "s3a://")) and "config_kwargs" not in options:
        options = {**options, "config_kwargs": S3_CLIENT_RETRIES}
    return url_to_fs(url, **options)


RETRY_ENV = "TANDEM_STORAGE_RETRY_S"
DEFAULT_RETRY_S = 60.0
FIRST_DELAY_S = 0.5
MAX_DELAY_S = 8.0
# Exception class names (matched by name: config/ does not import botocore or aiohttp) that mean the
# request never got an answer: the endpoint is down, restarting or overloaded.
_TRANSIENT_NAMES = {"EndpointConnectionError", "ConnectionClosedError", "ConnectTimeoutError", "ReadTimeoutError",
                    "HTTPClientError", "ClientConnectorError", "ServerDisconnectedError", "ClientOSError",
                    "ClientPayloadError", "ServerTimeoutError", "IncompleteReadError", "ResponseStreamingError"}
_TRANSIENT_ERRNOS = {errno.ECONNREFUSED, errno.ECONNRESET, errno.ECONNABORTED, errno.ETIMEDOUT, errno.EPIPE,
                     errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EAGAIN}
# S3 answers that say "try again": throttling and server-side failures.
_TRANSIENT_CODES = {"SlowDown", "ServiceUnavailable", "InternalError", "RequestTimeout",
                    "Throttling", "ThrottlingException", "500", "502", "503", "504"}


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


def endpoint_hint(url: str) -> str:
    """Where the endpoint of a URL comes from, for the error after the retry budget."""
    if is_local(url):
        return "is the filesystem mounted and reachable on this machine?"
    options = _options_for(url)
    endpoint = (options.get("endpoint_url") or options.get("client_kwargs", {}).get("endpoint_url")
                or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL"))
    if endpoint:
        return (f"is the endpoint at {endpoint} up? check AWS_ENDPOINT_URL (or run.storage_options.endpoint_url) "
                "and the network")
    return "is the object store reachable from this machine? check AWS_ENDPOINT_URL and the network"


def with_retries(what: str, url: str, call: Callable[[], T]) -> T:
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
                    f"{budget:.0f} s ({RETRY_ENV}); {endpoint_hint(url)}") from exc
            pause = min(delay, left)
            log.warning("storage: %s %s failed (%s); retry %d in %.1f s (%.0f s of %s left)", what, url, error,
                        attempt, pause, left, RETRY_ENV)
            time.sleep(pause)
            delay = min(delay * 2, MAX_DELAY_S)


def _describe(exc: BaseException) -> str:
    """One line: the exception's type and first line of its message."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def s3_error_code(exc: BaseException) -> str | None:
    """The S3 error code behind an s3fs exception (s3fs keeps botocore's ClientError as the cause)."""
    response = getattr(exc.__cause__, "response", None)
    return response.get("Error", {}).get("Code") if isinstance(response, dict) else None


def is_local(url: str) -> bool:
    """True for plain paths and file:// URLs (local disk or an NFS mount)."""
    return "://" not in url or url.startswith("file://")


def join(base: str, *parts: str) -> str:
    """Join URL/path parts with '/' (fsspec URLs always use '/')."""
    out = base.rstrip("/")
    for part in parts:
        out = f"{out}/{part.strip('/')}"
    return out


def exists(url: str) -> bool:
    """Whether a file or directory exists at the URL."""
    fs, path = filesystem(url)
    return with_retries("exists", url, lambda: fs.exists(path))


def read_bytes(url: str) -> bytes:
    """The whole object."""
    fs, path = filesystem(url)
    return with_retries("read", url, lambda: fs.cat_file(path))


def read_range(url: str, start: int, end: int) -> bytes:
    """Bytes [start, end) of an object (fewer at its end): streaming readers retry block by block."""
    fs, path = filesystem(url)
    if is_local(url):
        with open(path, "rb") as handle:
            handle.seek(start)
            return handle.read(end - start)

    def read() -> bytes:
        try:
            return fs.cat_file(path, start=start, end=end)
        except OSError as exc:
            if s3_error_code(exc) == "InvalidRange":  # S3's answer for a range that starts at the end
                return b""
            raise

    return with_retries("read", url, read)


def size(url: str) -> int:
    """Size in bytes of a file."""
    fs, path = filesystem(url)
    return with_retries("size", url, lambda: fs.size(path))


def read_json(url: str) -> Any:
    """A JSON document."""
    return json.loads(read_bytes(url))


def write_bytes_atomic(url: str, data: bytes) -> None:
    """Write `data` so that readers see the old object or the whole new one, never a part."""
    fs, path = filesystem(url)
    if is_local(url):
        directory = os.path.dirname(path)
        os.makedirs(directory, exist_ok=True)
        tmp = os.path.join(directory, f".tmp-{uuid.uuid4().hex}-{os.path.basename(path)}")
        with open(tmp, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    else:
        # One PUT is atomic per object; repeating it after a lost answer writes the same bytes again.
        with_retries("write", url, lambda: fs.pipe_file(path, data))


def write_json_atomic(url: str, doc: Any) -> bytes:
    """Write a JSON document atomically; returns the exact bytes written (for digests)."""
    data = (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode("utf-8")
    write_bytes_atomic(url, data)
    return data


def put_file(local: str, url: str) -> None:
    """Upload a finished local file to `url` (one PUT per object, or a local copy + rename)."""
    if is_local(url):
        with open(local, "rb") as handle:
            write_bytes_atomic(url, handle.read())
        return
    fs, path = filesystem(url)
    with_retries("upload", url, lambda: fs.put_file(local, path))


def get_file(url: str, local: str) -> None:
    """Download `url` to a local file."""
    fs, path = filesystem(url)
    with_retries("download", url, lambda: fs.get_file(path, local))


def remove(url: str, recursive: bool = False) -> None:
    """Delete a file (or a directory tree with recursive); absent is fine."""
    fs, path = filesystem(url)

    def rm() -> None:
        fs.invalidate_cache(path)
        if fs.exists(path):
            fs.rm(path, recursive=recursive)
        fs.invalidate_cache(path)

    with_retries("delete", url, rm)


def find_sizes(url: str) -> dict[str, int]:
    """{in-filesystem path: size} of every file under a directory, from one listing."""
    fs, root = filesystem(url)

    def find() -> dict[str, int]:
        fs.invalidate_cache(root)  # another node or process may have changed the files since we last listed
        return {p.rstrip("/"): info["size"] for p, info in fs.find(root, detail=True).items()}

    return with_retries("list", url, find)


def listdir(url: str) -> list[str]:
    """Base names in a directory (empty when it does not exist)."""
    fs, path = filesystem(url)

    def ls() -> list[str]:
        fs.invalidate_cache(path)  # object stores cache listings; another writer may have added names
        if not fs.exists(path):
            return []
        return sorted(os.path.basename(p.rstrip("/")) for p in fs.ls(path, detail=False))

    return with_retries("list", url, ls)


def makedirs(url: str) -> None:
    """Create a directory (a no-op on object stores)."""
    fs, path = filesystem(url)
    with_retries("mkdir", url, lambda: fs.makedirs(path, exist_ok=True))


def local_path(url: str) -> str:
    """The local filesystem path of a local URL."""
    if not is_local(url):
        raise ValueError(f"{url} is not on a local filesystem")
    return url[len("file://"):] if url.startswith("file://") else url
