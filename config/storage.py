"""fsspec I/O with the one rule that matters for readers: nothing half-written under a final name.

Local/NFS paths write to a temporary name in the same directory and rename (atomic on POSIX).
Object stores have no rename; there a single PUT is atomic per object, and directories are
committed by the marker (COMPLETE, manifest.json) written last.
"""

from __future__ import annotations

import json
import os
import uuid
from typing import Any

import fsspec
from fsspec.core import url_to_fs

_OPTIONS: dict[str, dict[str, Any]] = {}


def set_storage_options(prefix: str, options: dict[str, Any]) -> None:
    """Remember fsspec options (endpoint, credentials) for every URL under `prefix`."""
    if options:
        _OPTIONS[prefix.rstrip("/")] = dict(options)


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
    """Create the object only if nothing is there yet; False when it already exists."""
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
    raise NotImplementedError(f"exclusive create is implemented for local storage only, not {url}")


def listdir(url: str) -> list[str]:
    """Base names in a directory (empty when it does not exist)."""
    fs, path = filesystem(url)
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
