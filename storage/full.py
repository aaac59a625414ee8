"""Storage full: the one home of the error, for every writer (a task, a node, a rank, the checkpoint writer). A write
that finds no room (ENOSPC, or EDQUOT: a quota) is one line naming the store, the file, the free and needed bytes and
the fix, and exit 2."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
from collections.abc import Iterator

from core.errors import UserError
from storage.location import Location, is_local, is_local_url, local_path

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


def storage_root(where: Location) -> str:
    """The store a location lies on, as the user names it: the mount point of a local path, scheme://bucket of an
    object store."""
    if not is_local(where):
        scheme, _, rest = where.url.partition("://")
        return f"{scheme}://{rest.split('/', 1)[0]}"
    path = os.path.abspath(local_path(where))
    while not os.path.ismount(path):
        path = os.path.dirname(path)
    return path


def free_bytes(where: Location) -> int | None:
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


def storage_full_message(where: Location, file: str | None, needed: int | None) -> str:
    """The one line for a write that found storage full: the store, the file, free and needed bytes, the fix. The file,
    when known and local, names the filesystem (a run's directory may span mounts)."""
    place = Location(file) if file is not None and is_local_url(file) else where
    free = free_bytes(place)
    figures = (f"{human_bytes(free)} free" if free is not None else "free space not reported") + (
        f", {human_bytes(needed)} needed" if needed is not None else ""
    )
    return (
        f"storage full: {storage_root(place)} ({figures}) while writing {file or place}; free space there, lower "
        "train.keep_latest_k, or point run.storage at a larger store, then run again: the run resumes from its "
        "newest complete checkpoint"
    )


def storage_full(
    exc: BaseException,
    where: Location | None = None,
    *,
    file: str | None = None,
    needed: int | None = None,
    fallback: Location | None = None,
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
    place = where if where is not None else (Location(file) if file is not None else fallback)
    if place is None:
        return StorageFull(f"storage full ({err.strerror}); free space on run.storage or lower train.keep_latest_k")
    return StorageFull(storage_full_message(place, file, needed))


@contextlib.contextmanager
def full_storage_is_one_line(
    where: Location | None = None,
    *,
    file: str | None = None,
    needed: int | None = None,
    fallback: Location | None = None,
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
