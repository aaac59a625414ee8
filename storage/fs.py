"""fsspec I/O with the one rule that matters for readers: nothing half-written under a final name (exclusive
creates and compare-and-swap are in storage/conditional.py).

Local/NFS paths write to a temporary name in the same directory and rename (atomic on POSIX).
Object stores have no rename; there a single PUT is atomic per object, and directories are
committed by the marker (COMPLETE, manifest.json) written last.

Every operation takes a `Location` (storage/location.py) and goes through `with_retries` (storage/retry.py): a
transient fault is retried within the retry budget, and after it the operation fails with one line.
"""

from __future__ import annotations

import json
import os
import uuid
from typing import Any

import fsspec
from fsspec.core import url_to_fs

from storage.full import full_storage_is_one_line, removed_on_error
from storage.location import Location, is_local
from storage.retry import s3_error_code, with_retries

# botocore retries a refused connection 4 times over about 8 s by itself; left at that, every attempt of
# with_retries would take 8 s and the budget would overrun by as much. One quick retry of its own keeps blips
# cheap; with_retries does the rest. A user's own config_kwargs (in the storage options) win.
S3_CLIENT_RETRIES = {"retries": {"max_attempts": 2, "mode": "standard"}}


def filesystem(where: Location) -> tuple[fsspec.AbstractFileSystem, str]:
    """The filesystem and in-filesystem path of a location, built with its options."""
    options = dict(where.options)
    if where.url.startswith(("s3://", "s3a://")) and "config_kwargs" not in options:
        options["config_kwargs"] = S3_CLIENT_RETRIES
    return url_to_fs(where.url, **options)


def exists(url: Location) -> bool:
    """Whether a file or directory exists at the URL."""
    fs, path = filesystem(url)
    return with_retries("exists", url, lambda: fs.exists(path))


def read_bytes(url: Location) -> bytes:
    """The whole object."""
    fs, path = filesystem(url)
    return with_retries("read", url, lambda: fs.cat_file(path))


def read_range(url: Location, start: int, end: int) -> bytes:
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


def size(url: Location) -> int:
    """Size in bytes of a file."""
    fs, path = filesystem(url)
    return with_retries("size", url, lambda: fs.size(path))


def read_json(url: Location) -> Any:
    """A JSON document."""
    return json.loads(read_bytes(url))


def write_bytes_atomic(url: Location, data: bytes) -> None:
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


def write_json_atomic(url: Location, doc: Any) -> bytes:
    """Write a JSON document atomically; returns the exact bytes written (for digests)."""
    data = (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode("utf-8")
    write_bytes_atomic(url, data)
    return data


def put_file(local: str, url: Location) -> None:
    """Upload a finished local file to `url` (one PUT per object, or a local copy + rename)."""
    if is_local(url):
        with open(local, "rb") as handle:
            write_bytes_atomic(url, handle.read())
        return
    fs, path = filesystem(url)
    with_retries("upload", url, lambda: fs.put_file(local, path))


def get_file(url: Location, local: str) -> None:
    """Download `url` to a local file."""
    fs, path = filesystem(url)
    with_retries("download", url, lambda: fs.get_file(path, local))


def remove(url: Location, recursive: bool = False) -> None:
    """Delete a file (or a directory tree with recursive); absent is fine."""
    fs, path = filesystem(url)

    def rm() -> None:
        fs.invalidate_cache(path)
        if fs.exists(path):
            fs.rm(path, recursive=recursive)
        fs.invalidate_cache(path)

    with_retries("delete", url, rm)


def find_sizes(url: Location) -> dict[str, int]:
    """{in-filesystem path: size} of every file under a directory, from one listing."""
    fs, root = filesystem(url)

    def find() -> dict[str, int]:
        fs.invalidate_cache(root)  # another node or process may have changed the files since we last listed
        return {p.rstrip("/"): info["size"] for p, info in fs.find(root, detail=True).items()}

    return with_retries("list", url, find)


def listdir(url: Location) -> list[str]:
    """Base names in a directory (empty when it does not exist)."""
    fs, path = filesystem(url)

    def ls() -> list[str]:
        fs.invalidate_cache(path)  # object stores cache listings; another writer may have added names
        if not fs.exists(path):
            return []
        return sorted(os.path.basename(p.rstrip("/")) for p in fs.ls(path, detail=False))

    return with_retries("list", url, ls)


def makedirs(url: Location) -> None:
    """Create a directory (a no-op on object stores)."""
    fs, path = filesystem(url)
    with_retries("mkdir", url, lambda: fs.makedirs(path, exist_ok=True))
