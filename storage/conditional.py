"""Writes that must not race: an exclusive create (a registry version, the run lock) and a compare-and-swap (the
champion alias, the lock's lease), on local/NFS paths (link, flock) and on S3 (conditional PUTs)."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import uuid
from collections.abc import Iterator

import fsspec

from core.errors import UserError
from storage.fs import filesystem, write_bytes_atomic
from storage.full import full_storage_is_one_line, removed_on_error
from storage.location import Location, is_local
from storage.retry import s3_error_code, with_retries


def create_exclusive(url: Location, data: bytes) -> bool:
    """Create the object only if nothing is there yet; False when it already exists.

    Local/NFS: link() of a finished temporary file, which fails if the name exists. S3: a conditional
    PUT (`If-None-Match: *`), which AWS S3 and compatible stores resolve atomically on the server.
    Exactly once under retries (ours and botocore's own): when a PUT's answer is lost and the repeated PUT
    finds the name taken, that taken name may be our own first PUT. So a lost race reads the object back, and
    our exact bytes there mean the claim is ours. Callers whose claims must be told apart put something unique
    in `data` (registry entries carry the flow run id and time, run locks a random token).
    """
    fs, path = filesystem(url)
    if is_local(url):
        return _create_local(path, data)
    _require_s3(url)

    def claim() -> bool:
        try:
            fs.pipe_file(path, data, mode="create")
            return True
        except FileExistsError:
            pass
        except OSError as exc:
            if s3_error_code(exc) not in _LOST_RACE:
                raise
        return _holds(fs, path, data)

    return with_retries("create", url, claim)


def _holds(fs: fsspec.AbstractFileSystem, path: str, data: bytes) -> bool:
    """Whether the object now holds exactly `data` (then a conditional write that 'lost' was our own)."""
    fs.invalidate_cache(path)
    try:
        return fs.cat_file(path) == data
    except FileNotFoundError:
        return False


def _create_local(path: str, data: bytes) -> bool:
    tmp = os.path.join(os.path.dirname(path), f".tmp-{uuid.uuid4().hex}")
    with full_storage_is_one_line(file=path, needed=len(data)), removed_on_error(tmp):
        os.makedirs(os.path.dirname(path), exist_ok=True)
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


# A failed precondition, or S3's 409 for a conditional write racing another one on the same key.
_LOST_RACE = ("PreconditionFailed", "ConditionalRequestConflict")


def _require_s3(url: Location) -> None:
    if not str(url).startswith(("s3://", "s3a://")):
        raise UserError(
            f"{url}: atomic create and compare-and-swap (registry versions, the champion alias) need "
            "run.storage on a local/NFS path or s3://"
        )


def read_versioned(url: Location) -> tuple[bytes | None, str | None]:
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

    def read() -> tuple[bytes | None, str | None]:
        fs.invalidate_cache(path)
        try:
            # ETag first, then the bytes: if a write lands in between, the stale ETag makes the swap fail.
            token = fs.info(path)["ETag"]
            return fs.cat_file(path), token
        except FileNotFoundError:
            return None, None

    return with_retries("read", url, read)


def replace_if_unchanged(url: Location, data: bytes, token: str | None) -> bool:
    """Write `data` only if the object still has `token` (None: only if it is still absent).

    Like create_exclusive, a write that finds the object changed checks whether the change was our own
    earlier attempt (same bytes), so a lost answer is not mistaken for a lost race.
    """
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

    def swap() -> bool:
        try:
            fs.call_s3("put_object", Bucket=bucket, Key=key, Body=data, **condition)
            return True
        except (FileExistsError, FileNotFoundError):
            pass
        except OSError as exc:
            if s3_error_code(exc) not in _LOST_RACE:
                raise
        finally:
            fs.invalidate_cache(path)
        return _holds(fs, path, data)

    return with_retries("conditional write", url, swap)


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
