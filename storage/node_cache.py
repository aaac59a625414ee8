"""The node-local cache: what a node keeps on its own disk between launches, so that a retry or the next run does not
redo work the node already did.

- `digests/`: the digests of local files (the base model's, a dataset's shards), keyed by the file's real path, size
  and modification time, so that a 144 GB model directory is hashed once per node, not at every launch. Every entry
  is one small file written by rename; one that does not match the file's current size and time is ignored and
  replaced.
- `datasets/`: local copies of staged datasets that ranks cannot map where they are stored (on an object store, or
  in the earlier Parquet form), one directory per dataset keyed by its manifest's digest (storage/local_dataset.py
  fills and reads them). A copy is complete when its `contents.json` is there (written last); the file's modification
  time is the copy's last use, and copies beyond `launch.node_cache_max_gb` are removed least recently used first.
  Each copy has a lock file beside it (`{name}.lock`): every rank reading a copy holds it shared for as long as it
  runs, and eviction takes it exclusively without waiting, so a copy in use is never removed. Whoever fills a copy
  holds a second lock (`{name}.fill`) exclusively, keeping its shared hold: readers never block a filler.
- `reference/`: copies of full fine-tuning's reference tables kept on an object store
  (trainer/objectives/preference/reference_table.py), one file per table URL and version, fetched once per node (under
  the same `{name}.fill` lock) and renamed into place, for the node's ranks to memory-map; 16 bytes a pair, not counted
  in `launch.node_cache_max_gb`.
- `compile/`: torch.compile's caches for train.compile (trainer/model/compiled.py): inductor's compiled code
  (`compile/inductor`, TORCHINDUCTOR_CACHE_DIR) and Triton's kernels (`compile/triton`, TRITON_CACHE_DIR), so a second
  run of the same model on the node loads its layers' code instead of compiling it; not counted in
  `launch.node_cache_max_gb`.

The cache lives in `launch.node_cache_dir` (default `~/.cache/tandem`, or `TANDEM_NODE_CACHE` when set). Deleting the
directory is always safe while no job runs on the node: it costs the next launch a hash or a download.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from config.sections.launch import LaunchConfig
from storage.digest import CHUNK, digest_bytes, hasher

log = logging.getLogger(__name__)
CACHE_ENV = "TANDEM_NODE_CACHE"
DIGESTS = "digests"
DATASETS = "datasets"
REFERENCE = "reference"
COMPILE = "compile"
CONTENTS = "contents.json"  # a dataset copy's list of files, written last: the copy is complete once it is there


def cache_root(configured: str | None = None) -> Path:
    """The node cache's directory: the configured one, else TANDEM_NODE_CACHE, else ~/.cache/tandem."""
    chosen = configured or os.environ.get(CACHE_ENV) or os.path.join("~", ".cache", "tandem")
    return Path(os.path.expanduser(chosen))


@dataclass(frozen=True)
class NodeCache:
    """The node cache's directory and the most its dataset copies may hold (launch.node_cache_max_gb)."""

    root: Path
    max_bytes: int


def node_cache(launch: LaunchConfig) -> NodeCache:
    """The node cache a launch config names."""
    return NodeCache(cache_root(launch.node_cache_dir), int(launch.node_cache_max_gb * 1e9))


def file_digest(path: str | os.PathLike[str], algorithm: str, root: Path) -> tuple[str, bool]:
    """(hex digest of a local file, whether it came from the cache); symlinks are followed (a Hugging Face cache's
    snapshot points into its blobs), and the cache entry is keyed by the real path, size and mtime."""
    real, entry, stamp = _digest_entry(path, algorithm, root)
    try:
        cached = json.loads(entry.read_text())
        if {k: cached.get(k) for k in stamp} == stamp and isinstance(cached.get("digest"), str):
            return cached["digest"], True
    except (OSError, ValueError):
        pass
    digest = local_digest(real, algorithm)
    write_entry(entry, {**stamp, "digest": digest})
    return digest, False


def remember_digest(path: str | os.PathLike[str], algorithm: str, digest: str, root: Path) -> None:
    """Record the digest of a local file just written from bytes whose digest is known (a fetched copy), so that the
    next check does not hash it again."""
    _, entry, stamp = _digest_entry(path, algorithm, root)
    write_entry(entry, {**stamp, "digest": digest})


def _digest_entry(path: str | os.PathLike[str], algorithm: str, root: Path) -> tuple[str, Path, dict[str, object]]:
    """(real path, its digest entry's file, the file version the entry is valid for)."""
    real = os.path.realpath(path)
    stat = os.stat(real)
    key = digest_bytes(f"{real}\0{algorithm}".encode(), "blake3")[:40]
    stamp = {"path": real, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "algorithm": algorithm}
    return real, root / DIGESTS / f"{key}.json", stamp


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


def dataset_entry(root: Path, dataset_id: str, manifest_digest: str) -> Path:
    """The directory of a dataset's local copy: keyed by its manifest's digest, so that a dataset staged again (same
    id, another manifest) never mixes with the old copy."""
    return root / DATASETS / f"{dataset_id}-{manifest_digest[:16]}"


def lock_path(entry: Path) -> Path:
    """The lock file of a copy, beside its directory (it outlives the copy's removal)."""
    return entry.with_name(entry.name + ".lock")


class Lease:
    """A shared hold on a copy for as long as a reader keeps it (a rank: its whole life), so it is not removed."""

    def __init__(self, entry: Path) -> None:
        entry.parent.mkdir(parents=True, exist_ok=True)
        self._fd: int | None = os.open(lock_path(entry), os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(self._fd, fcntl.LOCK_SH)

    def release(self) -> None:
        """Let the copy go (closing the descriptor releases the lock)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __del__(self) -> None:
        self.release()


@contextlib.contextmanager
def filling(entry: Path) -> Iterator[None]:
    """The right to fill a copy: an exclusive lock on a file of its own (`{name}.fill`), taken while the filler keeps
    its shared hold on the copy (so that eviction leaves the copy alone, and readers never block the filler)."""
    entry.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(entry.with_name(entry.name + ".fill"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def last_used(entry: Path) -> float | None:
    """When a complete copy was last used (its contents.json's modification time); None for an incomplete one."""
    try:
        return (entry / CONTENTS).stat().st_mtime
    except OSError:
        return None


def touch(entry: Path) -> None:
    """Mark a complete copy as used now (least recently used copies go first)."""
    with contextlib.suppress(OSError):
        os.utime(entry / CONTENTS)


def entry_bytes(entry: Path) -> int:
    """Bytes a copy holds on disk (its files, complete or not)."""
    return sum(path.stat().st_size for path in entry.rglob("*") if path.is_file())


def evict(root: Path, keep: Path, need: int, cap: int) -> list[str]:
    """Remove dataset copies other than `keep`, least recently used first, skipping those in use, until `need` more
    bytes fit under `cap` with what remains; returns the names removed."""
    folder = root / DATASETS
    others = [p for p in folder.iterdir() if p.is_dir() and p != keep] if folder.is_dir() else []
    sizes = {p: entry_bytes(p) for p in others}
    held = sum(sizes.values())
    removed: list[str] = []
    for entry in sorted(others, key=lambda p: last_used(p) or 0.0):
        if held + need <= cap:
            break
        if remove_unused(entry):
            held -= sizes[entry]
            removed.append(entry.name)
    return removed


@contextlib.contextmanager
def unused(entry: Path) -> Iterator[bool]:
    """The copy's lock held exclusively for the block if no reader or filler holds it; yields whether it was free
    (without waiting: a copy in use is simply not free)."""
    fd = os.open(lock_path(entry), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)


def remove_unused(entry: Path) -> bool:
    """Remove a copy unless a reader or a filler holds its lock; contents.json first, so that a copy being removed is
    never complete."""
    with unused(entry) as free:
        if not free:
            return False
        with contextlib.suppress(FileNotFoundError):
            (entry / CONTENTS).unlink()
        shutil.rmtree(entry, ignore_errors=True)
        log.info("node cache: removed %s (least recently used, over launch.node_cache_max_gb)", entry)
        return True
