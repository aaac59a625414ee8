"""The node cache: a local file's digest computed once per version of the file, a dataset copy kept apart per manifest,
and copies beyond the cap removed least recently used first, never one a reader or a filler holds."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from config.sections.launch import LaunchConfig
from storage.node_cache import (
    CONTENTS,
    Lease,
    cache_root,
    dataset_entry,
    evict,
    file_digest,
    filling,
    local_digest,
    node_cache,
    remember_digest,
    unused,
)


def test_a_digest_is_computed_once_per_version_of_the_file(tmp_path) -> None:
    root, model = tmp_path / "cache", tmp_path / "model.safetensors"
    model.write_bytes(b"weights" * 1000)
    digest, cached = file_digest(model, "blake3", root)
    assert (digest, cached) == (local_digest(str(model), "blake3"), False)
    link = tmp_path / "snapshot.safetensors"
    link.symlink_to(model)  # a Hugging Face cache's snapshot points into its blobs: one entry, by the real path
    assert file_digest(link, "blake3", root) == (digest, True)
    model.write_bytes(b"other!!" * 1000)  # same size, a new modification time: a new version
    stat = model.stat()
    os.utime(model, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    assert file_digest(model, "blake3", root) == (local_digest(str(model), "blake3"), False)
    fetched = tmp_path / "fetched.bin"
    fetched.write_bytes(b"known")
    remember_digest(fetched, "sha256", "a-known-digest", root)  # a copy whose digest was checked on the way in
    assert file_digest(fetched, "sha256", root) == ("a-known-digest", True)


def test_the_root_is_the_configured_one_else_the_environment_else_home(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("TANDEM_NODE_CACHE", str(tmp_path / "env"))
    assert cache_root("/scratch/cache") == Path("/scratch/cache")
    assert cache_root() == tmp_path / "env"
    monkeypatch.delenv("TANDEM_NODE_CACHE")
    assert cache_root() == Path.home() / ".cache" / "tandem"
    cache = node_cache(LaunchConfig(node_cache_dir=str(tmp_path / "c"), node_cache_max_gb=2.5))
    assert (cache.root, cache.max_bytes) == (tmp_path / "c", 2_500_000_000)


def copy_of(root: Path, name: str, size: int, used: float) -> Path:
    """A complete dataset copy of `size` bytes, last used at `used`."""
    entry = dataset_entry(root, name, "f" * 64)
    entry.mkdir(parents=True)
    (entry / "shard.arrow").write_bytes(b"\0" * size)
    (entry / CONTENTS).write_text("{}")
    os.utime(entry / CONTENTS, (used, used))
    return entry


def test_eviction_goes_least_recently_used_first_and_skips_copies_in_use(tmp_path) -> None:
    now = time.time()
    old, middle, new = (copy_of(tmp_path, name, 100, now - age) for name, age in (("a", 300), ("b", 200), ("c", 100)))
    keep = copy_of(tmp_path, "d", 100, now)
    held = Lease(old)  # a rank reads the oldest copy: it stays
    assert evict(tmp_path, keep, need=100, cap=300) == [middle.name, new.name]
    assert old.is_dir() and keep.is_dir() and not middle.exists() and not new.exists()
    held.release()
    assert evict(tmp_path, keep, need=100, cap=150) == [old.name]


def test_a_copy_is_free_only_while_no_reader_holds_it_and_one_filler_fills_at_a_time(tmp_path) -> None:
    entry = dataset_entry(tmp_path, "a", "f" * 64)
    entry.parent.mkdir(parents=True)
    with unused(entry) as free:
        assert free
    lease = Lease(entry)
    with unused(entry) as free:
        assert not free
    lease.release()
    order: list[str] = []

    def second_filler() -> None:
        with filling(entry):
            order.append("second")

    with filling(entry):
        other = threading.Thread(target=second_filler)
        other.start()
        other.join(0.5)  # it waits for the first filler
        order.append("first")
    other.join(10)
    assert order == ["first", "second"]
    assert dataset_entry(tmp_path, "a", "0" * 64) != entry  # the same dataset staged again: another copy
