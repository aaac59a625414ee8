"""The node-local cache: what a node keeps on its own disk between launches, so that a retry or the next run does not
redo work the node already did. Today: the digests of local files (the base model's), keyed by the file's real path,
size and modification time, so that a 144 GB model directory is hashed once per node, not at every launch.

The cache lives in `launch.node_cache_dir` (default `~/.cache/tandem`, or `TANDEM_NODE_CACHE` when set). Every entry
is one small file written by rename, so concurrent nodes and ranks on one machine never see half an entry; an
entry that does not match the file's current size and time is ignored and replaced. Deleting the directory is
always safe.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from storage.digest import CHUNK, digest_bytes, hasher

CACHE_ENV = "TANDEM_NODE_CACHE"
DIGESTS = "digests"


def cache_root(configured: str | None = None) -> Path:
    """The node cache's directory: the configured one, else TANDEM_NODE_CACHE, else ~/.cache/tandem."""
    chosen = configured or os.environ.get(CACHE_ENV) or os.path.join("~", ".cache", "tandem")
    return Path(os.path.expanduser(chosen))


def file_digest(path: str | os.PathLike[str], algorithm: str, root: Path) -> tuple[str, bool]:
    """(hex digest of a local file, whether it came from the cache); symlinks are followed (a Hugging Face cache's
    snapshot points into its blobs), and the cache entry is keyed by the real path, size and mtime."""
    real = os.path.realpath(path)
    stat = os.stat(real)
    key = digest_bytes(f"{real}\0{algorithm}".encode(), "blake3")[:40]
    entry = root / DIGESTS / f"{key}.json"
    stamp = {"path": real, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "algorithm": algorithm}
    try:
        cached = json.loads(entry.read_text())
        if {k: cached.get(k) for k in stamp} == stamp and isinstance(cached.get("digest"), str):
            return cached["digest"], True
    except (OSError, ValueError):
        pass
    digest = local_digest(real, algorithm)
    write_entry(entry, {**stamp, "digest": digest})
    return digest, False


def local_digest(path: str, algorithm: str) -> str:
    """Hex digest of a local file, read in chunks."""
    h = hasher(algorithm)
    with open(path, "rb") as handle:
        while chunk := handle.read(CHUNK):
            h.update(chunk)
    return str(h.hexdigest())


def write_entry(entry: Path, doc: dict[str, object]) -> None:
    """One cache entry, written whole by rename; a cache that cannot be written only costs the next hash."""
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=entry.parent, prefix=".tmp-")
        with os.fdopen(fd, "w") as handle:
            json.dump(doc, handle)
        os.replace(tmp, entry)
    except OSError:
        pass
