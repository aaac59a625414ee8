"""fsspec I/O with the one rule that matters for readers: nothing half-written under a final name.

Local/NFS paths write to a temporary name in the same directory and rename (atomic on POSIX).
Object stores have no rename; there a single PUT is atomic per object, and directories are
committed by the marker (COMPLETE, manifest.json) written last.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import uuid
from collections.abc import Iterator
from typing import Any

import fsspec
from fsspec.core import url_to_fs

# Processes started by a launcher (torchrun ranks) inherit the options here, so that they can read
# spec.json from an object store before they know the config.
OPTIONS_ENV = "TANDEM_STORAGE_OPTIONS"
_OPTIONS: dict[str, dict[str, Any]] = json.loads(os.environ.get(OPTIONS_ENV) or "{}")


def set_storage_options(prefix: str, options: dict[str, Any]) -> None:
    """Remember fsspec options (endpoint, credentials) for every URL under `prefix`."""
    if options:
        _OPTIONS[prefix.rstrip("/")] = dict(options)


def options_environment() -> dict[str, str]:
    """The environment entry that hands the registered options to child processes."""
    return {OPTIONS_ENV: json.dumps(_OPTIONS)} if _OPTIONS else {}


def filesystem(url: str) -> tuple[fsspec.AbstractFileSystem, str]:
    """The filesystem and in-filesystem path of a URL, with options registered for its prefix."""
    matches = [prefix for prefix in _OPTIONS if url == prefix or url.startswith(prefix + "/")]
    # The most specific prefix wins: data.source may live under run.storage with other credentials.
    options = _OPTIONS[max(matches, key=len)] if matches else {}
    return url_to_fs(url, **options)


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
    return fs.exists(path)


def read_bytes(url: str) -> bytes:
    """The whole object."""
    fs, path = filesystem(url)
    return fs.cat_file(path)


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
        fs.pipe_file(path, data)


def write_json_atomic(url: str, doc: Any) -> bytes:
    """Write a JSON document atomically; returns the exact bytes written (for digests)."""
    data = (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode("utf-8")
    write_bytes_atomic(url, data)
    return data


def create_exclusive(url: str, data: bytes) -> bool:
    """Create the object only if nothing is there yet; False when it already exists.

    Local/NFS: link() of a finished temporary file, which fails if the name exists. S3: a conditional
    PUT (`If-None-Match: *`), which AWS S3 and compatible stores resolve atomically on the server.
    """
    fs, path = filesystem(url)
    if is_local(url):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = os.path.join(os.path.dirname(path), f".tmp-{uuid.uuid4().hex}")
        with open(tmp, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        try:
            os.link(tmp, path)  # link() fails if the name exists: an atomic claim that never overwrites
        except FileExistsError:
            return False
        finally:
            os.unlink(tmp)
        return True
    _require_s3(url)
    try:
        fs.pipe_file(path, data, mode="create")
    except FileExistsError:
        return False
    except OSError as exc:
        if _s3_error_code(exc) in _LOST_RACE:
            return False
        raise
    return True


# A failed precondition, or S3's 409 for a conditional write racing another one on the same key.
_LOST_RACE = ("PreconditionFailed", "ConditionalRequestConflict")


def _s3_error_code(exc: BaseException) -> str | None:
    """The S3 error code behind an s3fs exception (s3fs keeps botocore's ClientError as the cause)."""
    response = getattr(exc.__cause__, "response", None)
    return response.get("Error", {}).get("Code") if isinstance(response, dict) else None


def _require_s3(url: str) -> None:
    if not url.startswith(("s3://", "s3a://")):
        from config.errors import UserError

        raise UserError(f"{url}: atomic create and compare-and-swap (registry versions, the champion alias) need "
                        "run.storage on a local/NFS path or s3://")


def read_versioned(url: str) -> tuple[bytes | None, str | None]:
    """(bytes, token) of an object, or (None, None) when absent; pass the token to replace_if_unchanged."""
    fs, path = filesystem(url)
    if is_local(url):
        try:
            with open(path, "rb") as handle:
                data = handle.read()
        except FileNotFoundError:
            return None, None
        return data, hashlib.sha256(data).hexdigest()
    _require_s3(url)
    fs.invalidate_cache(path)
    try:
        # ETag first, then the bytes: if a write lands in between, the stale ETag makes the swap fail.
        token = fs.info(path)["ETag"]
        return fs.cat_file(path), token
    except FileNotFoundError:
        return None, None


def replace_if_unchanged(url: str, data: bytes, token: str | None) -> bool:
    """Write `data` only if the object still has `token` (None: only if it is still absent)."""
    fs, path = filesystem(url)
    if is_local(url):
        with _locked(path):
            current = read_versioned(url)[1]
            if current != token:
                return False
            write_bytes_atomic(url, data)
            return True
    _require_s3(url)
    bucket, key, _ = fs.split_path(path)
    condition = {"IfMatch": token} if token is not None else {"IfNoneMatch": "*"}
    try:
        fs.call_s3("put_object", Bucket=bucket, Key=key, Body=data, **condition)
    except (FileExistsError, FileNotFoundError):
        return False
    except OSError as exc:
        if _s3_error_code(exc) in _LOST_RACE:
            return False
        raise
    finally:
        fs.invalidate_cache(path)
    return True


@contextlib.contextmanager
def _locked(path: str) -> Iterator[None]:
    """An exclusive lock (flock on a sidecar file) around a local read-modify-write."""
    directory, name = os.path.split(path)
    os.makedirs(directory, exist_ok=True)
    fd = os.open(os.path.join(directory, f".{name}.lock"), os.O_CREAT | os.O_RDWR, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def listdir(url: str) -> list[str]:
    """Base names in a directory (empty when it does not exist)."""
    fs, path = filesystem(url)
    fs.invalidate_cache(path)  # object stores cache listings; another writer may have added names
    if not fs.exists(path):
        return []
    return sorted(os.path.basename(p.rstrip("/")) for p in fs.ls(path, detail=False))


def makedirs(url: str) -> None:
    """Create a directory (a no-op on object stores)."""
    fs, path = filesystem(url)
    fs.makedirs(path, exist_ok=True)


def local_path(url: str) -> str:
    """The local filesystem path of a local URL."""
    if not is_local(url):
        raise ValueError(f"{url} is not on a local filesystem")
    return url[len("file://"):] if url.startswith("file://") else url
