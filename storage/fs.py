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

import contextlib
import errno
import json
import logging
import os
import shutil
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

import fsspec
from fsspec.core import url_to_fs

from core.errors import RetryableError, UserError

log = logging.getLogger(__name__)
T = TypeVar("T")

# A launcher hands a process it starts (a node, a torchrun rank) the options of the one location it must read first
# (the run's spec.json) in this variable; everything else that process reaches comes from the spec's config.
OPTIONS_ENV = "TANDEM_STORAGE_OPTIONS"
Options = Mapping[str, Any]


@dataclass(frozen=True)
class Location:
    """A place on storage: its URL (a local or NFS path, file://…, s3://…) and the fsspec options that reach it
    (endpoint, client settings; never credentials, which come from the environment or a profile). The options travel
    with the location: `join` keeps them, and str() is the URL alone."""

    url: str
    options: Options = field(default_factory=dict, compare=False)

    def __str__(self) -> str:
        return self.url

    def with_url(self, url: str) -> Location:
        """Another URL reached with the same options (a URL read back from a document under this location)."""
        return Location(url, self.options)


Where = Location | str  # a plain string is a location without options
# A location or a URL, given back in the same kind by what derives one from it (join, storage/layout.py).
W = TypeVar("W", bound=Location | str)


def at(where: Where) -> Location:
    """The location of a URL or a Location."""
    return where if isinstance(where, Location) else Location(where)


def options_environment(where: Location) -> dict[str, str]:
    """The environment entry that hands a location's options to a process the launcher starts."""
    return {OPTIONS_ENV: json.dumps(dict(where.options))} if where.options else {}


def environment_location(url: str) -> Location:
    """A URL given to this process (its --spec) with the options its launcher handed down (options_environment)."""
    return Location(url, json.loads(os.environ.get(OPTIONS_ENV) or "{}"))


# botocore retries a refused connection 4 times over about 8 s by itself; left at that, every attempt of
# with_retries would take 8 s and the budget would overrun by as much. One quick retry of its own keeps blips
# cheap; with_retries does the rest. A user's own config_kwargs (in the storage options) win.
S3_CLIENT_RETRIES = {"retries": {"max_attempts": 2, "mode": "standard"}}


def filesystem(where: Where) -> tuple[fsspec.AbstractFileSystem, str]:
    """The filesystem and in-filesystem path of a location, built with its options."""
    location = at(where)
    options = dict(location.options)
    if location.url.startswith(("s3://", "s3a://")) and "config_kwargs" not in options:
        options["config_kwargs"] = S3_CLIENT_RETRIES
    return url_to_fs(location.url, **options)


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


def endpoint_hint(where: Where) -> str:
    """Where the endpoint of a location comes from, for the error after the retry budget."""
    if is_local(where):
        return "is the filesystem mounted and reachable on this machine?"
    options = at(where).options
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


def with_retries(what: str, url: Where, call: Callable[[], T]) -> T:
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


def s3_error_code(exc: BaseException) -> str | None:
    """The S3 error code behind an s3fs exception (s3fs keeps botocore's ClientError as the cause)."""
    response = getattr(exc.__cause__, "response", None)
    return response.get("Error", {}).get("Code") if isinstance(response, dict) else None


def is_local(where: Where) -> bool:
    """True for plain paths and file:// URLs (local disk or an NFS mount)."""
    url = str(where)
    return "://" not in url or url.startswith("file://")


def join(base: W, *parts: str) -> W:
    """Join URL/path parts with '/' (fsspec URLs always use '/'); a Location keeps its options."""
    out = str(base).rstrip("/")
    for part in parts:
        out = f"{out}/{part.strip('/')}"
    return cast(W, Location(out, base.options) if isinstance(base, Location) else out)


def exists(url: Where) -> bool:
    """Whether a file or directory exists at the URL."""
    fs, path = filesystem(url)
    return with_retries("exists", url, lambda: fs.exists(path))


def read_bytes(url: Where) -> bytes:
    """The whole object."""
    fs, path = filesystem(url)
    return with_retries("read", url, lambda: fs.cat_file(path))


def read_range(url: Where, start: int, end: int) -> bytes:
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


def size(url: Where) -> int:
    """Size in bytes of a file."""
    fs, path = filesystem(url)
    return with_retries("size", url, lambda: fs.size(path))


def read_json(url: Where) -> Any:
    """A JSON document."""
    return json.loads(read_bytes(url))


def write_bytes_atomic(url: Where, data: bytes) -> None:
    """Write `data` so that readers see the old object or the whole new one, never a part."""
    fs, path = filesystem(url)
    if is_local(url):
        directory = os.path.dirname(path)
        tmp = os.path.join(directory, f".tmp-{uuid.uuid4().hex}-{os.path.basename(path)}")
        with full_storage_is_one_line(url, file=str(url), needed=len(data)), removed_on_error(tmp):
            os.makedirs(directory, exist_ok=True)
            with open(tmp, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, path)
    else:
        # One PUT is atomic per object; repeating it after a lost answer writes the same bytes again.
        with_retries("write", url, lambda: fs.pipe_file(path, data))


def write_json_atomic(url: Where, doc: Any) -> bytes:
    """Write a JSON document atomically; returns the exact bytes written (for digests)."""
    data = (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode("utf-8")
    write_bytes_atomic(url, data)
    return data


def put_file(local: str, url: Where) -> None:
    """Upload a finished local file to `url` (one PUT per object, or a local copy + rename)."""
    if is_local(url):
        with open(local, "rb") as handle:
            write_bytes_atomic(url, handle.read())
        return
    fs, path = filesystem(url)
    with_retries("upload", url, lambda: fs.put_file(local, path))


def get_file(url: Where, local: str) -> None:
    """Download `url` to a local file."""
    fs, path = filesystem(url)
    with_retries("download", url, lambda: fs.get_file(path, local))


def remove(url: Where, recursive: bool = False) -> None:
    """Delete a file (or a directory tree with recursive); absent is fine."""
    fs, path = filesystem(url)

    def rm() -> None:
        fs.invalidate_cache(path)
        if fs.exists(path):
            fs.rm(path, recursive=recursive)
        fs.invalidate_cache(path)

    with_retries("delete", url, rm)


def find_sizes(url: Where) -> dict[str, int]:
    """{in-filesystem path: size} of every file under a directory, from one listing."""
    fs, root = filesystem(url)

    def find() -> dict[str, int]:
        fs.invalidate_cache(root)  # another node or process may have changed the files since we last listed
        return {p.rstrip("/"): info["size"] for p, info in fs.find(root, detail=True).items()}

    return with_retries("list", url, find)


def listdir(url: Where) -> list[str]:
    """Base names in a directory (empty when it does not exist)."""
    fs, path = filesystem(url)

    def ls() -> list[str]:
        fs.invalidate_cache(path)  # object stores cache listings; another writer may have added names
        if not fs.exists(path):
            return []
        return sorted(os.path.basename(p.rstrip("/")) for p in fs.ls(path, detail=False))

    return with_retries("list", url, ls)


def makedirs(url: Where) -> None:
    """Create a directory (a no-op on object stores)."""
    fs, path = filesystem(url)
    with_retries("mkdir", url, lambda: fs.makedirs(path, exist_ok=True))


def local_path(where: Where) -> str:
    """The local filesystem path of a local location."""
    url = str(where)
    if not is_local(url):
        raise ValueError(f"{url} is not on a local filesystem")
    return url[len("file://") :] if url.startswith("file://") else url


# Storage full: the one home of the error, for every writer (a task, a node, a rank, the checkpoint writer).
FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


class StorageFull(UserError):
    """A write found no room left on storage (ENOSPC, or EDQUOT: a quota): exit 2, since a retry of the same job
    writes the same bytes into the same full store; the user frees space, lowers train.keep_latest_k, or moves
    run.storage, and the rerun resumes from the newest complete checkpoint (nothing complete is lost)."""


def full_errno(exc: BaseException) -> OSError | None:
    """The OSError with ENOSPC/EDQUOT in `exc`'s chain (its causes and contexts), if any."""
    seen: set[int] = set()
    err: BaseException | None = exc
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, OSError) and err.errno in FULL_ERRNOS:
            return err
        err = err.__cause__ or err.__context__
    return None


def storage_root(where: Where) -> str:
    """The store a location lies on, as the user names it: the mount point of a local path, scheme://bucket of an
    object store."""
    url = str(where)
    if not is_local(url):
        scheme, _, rest = url.partition("://")
        return f"{scheme}://{rest.split('/', 1)[0]}"
    path = os.path.abspath(local_path(url))
    while not os.path.ismount(path):
        path = os.path.dirname(path)
    return path


def free_bytes(where: Where) -> int | None:
    """Bytes free for this process on the filesystem of a local location (its nearest existing directory); None
    where the store does not report it (object stores)."""
    if not is_local(where):
        return None
    path = os.path.abspath(local_path(where))
    while not os.path.exists(path):
        path = os.path.dirname(path)
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


def human_bytes(n: int) -> str:
    """1234567 -> '1.2 MB' (decimal units, as df -H and the configuration's sizes)."""
    value = float(n)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(value) < 1000 or unit == "TB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{n} B"  # unreachable: TB ends the loop


def storage_full_message(where: Where, file: str | None, needed: int | None) -> str:
    """The one line for a write that found storage full: the store, the file, free and needed bytes, the fix. The file,
    when known and local, names the filesystem (a run's directory may span mounts)."""
    where = file if file is not None and is_local(file) else where
    free = free_bytes(where)
    figures = (f"{human_bytes(free)} free" if free is not None else "free space not reported") + (
        f", {human_bytes(needed)} needed" if needed is not None else ""
    )
    return (
        f"storage full: {storage_root(where)} ({figures}) while writing {file or where}; free space there, lower "
        "train.keep_latest_k, or point run.storage at a larger store, then run again: the run resumes from its "
        "newest complete checkpoint"
    )


def storage_full(
    exc: BaseException,
    where: Where | None = None,
    *,
    file: str | None = None,
    needed: int | None = None,
    fallback: Where | None = None,
) -> StorageFull | None:
    """`exc` as StorageFull when storage was full (ENOSPC/EDQUOT anywhere in its chain), else None. `where`: the
    store or location written to (else the file the OSError names, else `fallback`); `file`: what was being written
    (else the OSError's file name); `needed`: the bytes the write wanted, when known."""
    if isinstance(exc, StorageFull):
        return exc
    err = full_errno(exc)
    if err is None:
        return None
    named = err.filename2 if isinstance(err.filename2, str) else err.filename
    file = file or (named if isinstance(named, str) else None)
    place = where if where is not None else (file if file is not None else fallback)
    if place is None:
        return StorageFull(f"storage full ({err.strerror}); free space on run.storage or lower train.keep_latest_k")
    return StorageFull(storage_full_message(place, file, needed))


@contextlib.contextmanager
def full_storage_is_one_line(
    where: Where | None = None, *, file: str | None = None, needed: int | None = None, fallback: Where | None = None
) -> Iterator[None]:
    """Turn an ENOSPC/EDQUOT raised inside the block into StorageFull (one line for the user, exit 2); the
    arguments are storage_full's."""
    try:
        yield
    except OSError as exc:
        if (full := storage_full(exc, where, file=file, needed=needed, fallback=fallback)) is not None:
            raise full from exc
        raise


@contextlib.contextmanager
def removed_on_error(path: str) -> Iterator[None]:
    """Delete a temporary file when the block fails (a full disk must not also keep the part that did not fit)."""
    try:
        yield
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(path)
        raise
