"""Where a node reads a staged dataset from, and the check that what it reads is what was staged.

- A dataset of Arrow shards on a local or NFS path is read in place: every rank maps the shards where they are.
- A dataset on an object store, or one staged in the earlier Parquet form, is read from a copy in the node cache
  (storage/node_cache.py, `datasets/`): each shard is fetched once per node (a Parquet shard is converted to the
  Arrow form as it arrives), digested as it arrives and held against the manifest, so the node's preflight, its ranks
  and a later evaluation all read that one copy. The copy is reused by every later launch, retry and run of the
  dataset on the node.

Preflight (`prepare_dataset`) holds every file against its digest (a file's digest comes from the node cache when
the file has not changed since it was last hashed: size and modification time) and fetches again a cached file that
differs; a rank (`open_split`) checks sizes only, and fills the copy itself when no preflight did (evaluation runs
none). Any shard that cannot be mapped is named in one line: in place, re-stage (exit 2); a cached copy is removed
first, so the retry (exit 75) fetches it again.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pyarrow.parquet as pq

from core.errors import RetryableError, UserError
from storage import layout
from storage.digest import digest_bytes, hasher
from storage.fs import read_range
from storage.full import full_storage_is_one_line
from storage.location import Location, is_local, join, local_path
from storage.manifest import read_manifest, verify_files
from storage.node_cache import (
    CONTENTS,
    Lease,
    NodeCache,
    dataset_entry,
    evict,
    file_digest,
    filling,
    remember_digest,
    touch,
)
from storage.shards import encode_shard, split_rows
from storage.split_reader import ImageSource, Shard, ShardError, Split

FETCH_BLOCK = 8 * 1024 * 1024  # one ranged read of a fetch
ARROW_BYTES_PER_TOKEN = 8  # input_ids and labels, int32 each: a converted Parquet shard's size, roughly


@dataclass
class Filled:
    """What filling a copy did: files fetched (and their bytes), files found whole, copies removed to make room."""

    fetched: int = 0
    fetched_bytes: int = 0
    kept: int = 0
    evicted: list[str] = field(default_factory=list)


def shard_entries(manifest: dict[str, Any], split: str | None = None) -> list[dict[str, Any]]:
    """The manifest's shard entries (of one split, or of both), in order."""
    splits = (split,) if split else layout.SPLITS
    return [e for e in manifest["files"] if e["path"].split("/", 1)[0] in splits and e["path"] != layout.REJECTS]


def copied_entries(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    """The files a node cache copy holds: the shards, and a dataset's images (`images/`), fetched as they are."""
    images = [e for e in manifest["files"] if e["path"].split("/", 1)[0] == layout.IMAGES]
    return shard_entries(manifest) + images


def image_source(manifest: dict[str, Any], dataset_folder: Path) -> ImageSource | None:
    """Where a split's images are read from (a dataset with images), at the pixels they were staged with."""
    images = manifest.get("images")
    if not images:
        return None
    prefix = layout.IMAGES + "/"
    files = [e for e in manifest["files"] if e["path"].startswith(prefix)]
    sources = {e["path"][len(prefix) :]: str(e.get("source", e["path"])) for e in files}
    folder = dataset_folder / layout.IMAGES
    return ImageSource(folder, int(images["min_pixels"]), int(images["max_pixels"]), sources)


def is_parquet(manifest: dict[str, Any]) -> bool:
    """Whether the dataset was staged in the earlier Parquet form."""
    return any(e["path"].endswith(layout.PARQUET_SHARD_SUFFIX) for e in shard_entries(manifest))


def in_place(dataset: Location, manifest: dict[str, Any]) -> bool:
    """Whether ranks map the dataset's shards where they are stored (Arrow shards on a local or NFS path)."""
    return is_local(dataset) and not is_parquet(manifest)


def local_name(path: str) -> str:
    """A shard's name in a node cache copy (a Parquet shard becomes an Arrow one)."""
    if path.endswith(layout.PARQUET_SHARD_SUFFIX):
        return path[: -len(layout.PARQUET_SHARD_SUFFIX)] + layout.SHARD_SUFFIX
    return path


def prepare_dataset(dataset: Location, manifest_digest: str, cache: NodeCache) -> str:
    """Preflight's dataset check: the manifest is the one spec.json names, and every file the ranks read matches it
    (in place, or this node's cache copy, fetched or fetched again where it differs); returns the report line."""
    manifest, _ = read_manifest_checked(dataset, manifest_digest)
    name = manifest["dataset_id"]
    if in_place(dataset, manifest):
        verify_in_place(dataset, manifest, cache.root)
        return f"{name}: {len(manifest['files'])} files verified in place"
    if is_local(dataset):  # the earlier Parquet form: its files as staged are checked before they are converted
        verify_in_place(dataset, manifest, cache.root)
    lease, filled = ensure_copy(dataset, manifest, manifest_digest, cache, verify=True)
    lease.release()
    evicted = f"; removed {', '.join(filled.evicted)} (least recently used)" if filled.evicted else ""
    fetched = f", {filled.fetched} fetched ({filled.fetched_bytes / 1e9:.2f} GB)" if filled.fetched else ""
    return f"{name}: node cache copy, {filled.kept} files verified{fetched}{evicted}"


def read_manifest_checked(dataset: Location, manifest_digest: str | None) -> tuple[dict[str, Any], str]:
    """(manifest, its digest), refusing one that is not the manifest spec.json names."""
    manifest, digest = read_manifest(dataset, layout.DATASET_SCHEMAS)
    if manifest_digest is not None and digest != manifest_digest:
        raise UserError(
            f"{join(dataset, layout.MANIFEST)}: digest mismatch: expected {manifest_digest}, got {digest}; "
            "the dataset was staged again after the run was planned, prepare it again"
        )
    return manifest, digest


def verify_in_place(dataset: Location, manifest: dict[str, Any], root: Path) -> None:
    """Every file of a local dataset present, of its size and digest (digests from the node cache when unchanged)."""
    verify_files(dataset, manifest, mode="size")
    algorithm = manifest["digest_algorithm"]
    for entry in manifest["files"]:
        path = os.path.join(local_path(dataset), entry["path"])
        digest, _ = file_digest(path, algorithm, root)
        if digest != entry["digest"]:
            raise UserError(
                f"{path}: {algorithm} digest mismatch: expected {entry['digest']}, got {digest}; "
                "the file is corrupt or was modified, re-stage it"
            )


def open_split(dataset: Location, split: str, cache: NodeCache, manifest_digest: str | None = None) -> Split:
    """A split as a rank reads it: mapped in place, or from the node cache's copy (filled now when no preflight filled
    it); the copy is held (shared lock) while the split lives, so it is not removed under the rank."""
    manifest, digest = read_manifest_checked(dataset, manifest_digest)
    counts = manifest["splits"][split]
    entries = shard_entries(manifest, split)
    if in_place(dataset, manifest):
        verify_files(dataset, {**manifest, "files": entries}, mode="size")
        shards = [map_shard(os.path.join(local_path(dataset), e["path"]), None) for e in entries]
        in_place_split = Split(shards, counts["records"])
        in_place_split.images = image_source(manifest, Path(local_path(dataset)))
        return in_place_split
    lease, _ = ensure_copy(dataset, manifest, digest, cache, verify=False)
    entry = dataset_entry(cache.root, manifest["dataset_id"], digest)
    try:
        split_view = Split([map_shard(entry / local_name(e["path"]), entry) for e in entries], counts["records"])
    except BaseException:
        # Let the copy go now, not when the error's traceback is dropped: a hold kept alive by a traceback blocks
        # the next fill of this copy in the same process (flock: each open file is a holder of its own).
        lease.release()
        raise
    split_view.lease = lease
    split_view.images = image_source(manifest, entry)
    assert len(split_view) == split_rows(counts), "the shards hold other rows than the manifest counts"
    return split_view


def ensure_copy(
    dataset: Location, manifest: dict[str, Any], manifest_digest: str, cache: NodeCache, verify: bool
) -> tuple[Lease, Filled]:
    """This node's copy of a dataset, whole (by size; with `verify`, by digest too), filled where it is not; returns
    the shared hold on it and what filling did. The hold is never given up to fill: filling takes a lock of its own
    (node_cache.filling), so ranks that read the copy for their whole life never keep another rank of the node, which
    found the copy incomplete a moment before, waiting forever; the second filler finds the copy whole and goes on."""
    entries = copied_entries(manifest)
    entry = dataset_entry(cache.root, manifest["dataset_id"], manifest_digest)
    digests = cache.root if verify else None
    lease = Lease(entry)
    try:
        filled = Filled(kept=len(entries))
        if not is_complete(entry, entries, digests):
            with filling(entry):
                if not is_complete(entry, entries, digests):  # another process may have filled it meanwhile
                    filled = fill(dataset, manifest, entry, cache, verify)
        touch(entry)
    except BaseException:
        lease.release()
        raise
    return lease, filled


def is_complete(entry: Path, entries: list[dict[str, Any]], digests: Path | None) -> bool:
    """Whether a copy is complete (contents.json written) and holds `entries` as it lists them."""
    contents = read_contents(entry)
    return contents is not None and complete(entry, contents, entries, digests)


def map_shard(path: str | Path, copy: Path | None) -> Shard:
    """Map one shard; one that cannot be read is named: re-stage it (in place), or it is removed from the copy and
    the error is retryable (the retry's preflight fetches it again)."""
    try:
        return Shard(path)
    except ShardError as exc:
        if copy is None:
            raise UserError(f"{path}: not a readable dataset shard ({exc}); the file is damaged, re-stage it") from None
        Path(path).unlink(missing_ok=True)  # the copy is incomplete without it: the next fill fetches it again
        raise RetryableError(
            f"{path}: not a readable dataset shard ({exc}); removed from the node cache, a retry fetches it again"
        ) from None


def read_contents(entry: Path) -> dict[str, Any] | None:
    """A complete copy's contents.json, or None."""
    try:
        doc: dict[str, Any] = orjson.loads((entry / CONTENTS).read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None
    return doc


def complete(entry: Path, contents: dict[str, Any], entries: list[dict[str, Any]], digests: Path | None) -> bool:
    """Whether a copy holds every shard of `entries` as contents.json lists it: present, of its size, and (given the
    node cache's root in `digests`) of its digest."""
    listed = {f["path"]: f for f in contents["files"]}
    return all(
        (known := listed.get(local_name(e["path"]))) is not None
        and matches(entry / known["path"], known, contents["digest_algorithm"], digests)
        for e in entries
    )


def matches(path: Path, known: dict[str, Any], algorithm: str, digests: Path | None) -> bool:
    """A cached file is the one contents.json lists: its size, and its digest when `digests` (the cache root) is
    given (hashed again only when the file changed since it was last hashed)."""
    if _size(path) != known["size"]:
        return False
    return digests is None or file_digest(path, algorithm, digests)[0] == known["digest"]


def _size(path: Path) -> int | None:
    try:
        return path.stat().st_size
    except OSError:
        return None


def fill(dataset: Location, manifest: dict[str, Any], entry: Path, cache: NodeCache, verify: bool) -> Filled:
    """Make the copy whole (the caller holds its fill lock, node_cache.filling): keep each file that matches what
    contents.json lists (by size, and with `verify` by digest), fetch (or convert) the others, then write contents.json
    last."""
    entries, algorithm = copied_entries(manifest), manifest["digest_algorithm"]
    listed = {f["path"]: f for f in (read_contents(entry) or {"files": []})["files"]}
    (entry / CONTENTS).unlink(missing_ok=True)
    filled, files, missing = Filled(), [], []
    for e in entries:
        known = listed.get(local_name(e["path"]))
        if known is not None and matches(entry / known["path"], known, algorithm, cache.root if verify else None):
            filled.kept += 1
            files.append(known)
        else:
            missing.append(e)
    if missing:
        filled.evicted = make_room(manifest, entry, cache, missing)
    for e in missing:
        files.append(fetch_shard(dataset, e, entry, algorithm, cache.root))
        filled.fetched += 1
        filled.fetched_bytes += e["size"]
    doc = {"dataset_id": manifest["dataset_id"], "digest_algorithm": algorithm, "files": files}
    write_local(entry / CONTENTS, orjson.dumps(doc, option=orjson.OPT_INDENT_2))
    return filled


def make_room(manifest: dict[str, Any], entry: Path, cache: NodeCache, missing: list[dict[str, Any]]) -> list[str]:
    """Remove least recently used copies until the missing files fit under launch.node_cache_max_gb; a dataset
    larger than the cap stops here."""
    whole = sum(copy_bytes(manifest, e) for e in copied_entries(manifest))
    if whole > cache.max_bytes:
        raise UserError(
            f"dataset {manifest['dataset_id']} needs {whole / 1e9:.2f} GB in the node cache ({cache.root}), more "
            f"than launch.node_cache_max_gb={cache.max_bytes / 1e9:g}; raise it (or stage to a path every node "
            "mounts: local datasets are read in place)"
        )
    return evict(cache.root, entry, sum(copy_bytes(manifest, e) for e in missing), cache.max_bytes)


def copy_bytes(manifest: dict[str, Any], entry: dict[str, Any]) -> int:
    """A shard's size in the copy: as stored, or for a Parquet shard its tokens as Arrow (8 bytes a token, roughly;
    its manifest entry does not count its tokens, so the split's are shared out by size)."""
    if not entry["path"].endswith(layout.PARQUET_SHARD_SUFFIX):
        return int(entry["size"])
    split = entry["path"].split("/", 1)[0]
    stored = sum(e["size"] for e in shard_entries(manifest, split)) or 1
    return int(manifest["splits"][split]["tokens"] * ARROW_BYTES_PER_TOKEN * entry["size"] / stored)


def fetch_shard(dataset: Location, entry: dict[str, Any], copy: Path, algorithm: str, root: Path) -> dict[str, Any]:
    """Copy one shard into the node cache, held against its manifest digest as it arrives (a Parquet shard is then
    converted to the Arrow form); returns its contents.json entry. A full node disk is one line (StorageFull)."""
    with full_storage_is_one_line(file=str(copy / local_name(entry["path"])), needed=int(entry["size"])):
        return _fetch_shard(dataset, entry, copy, algorithm, root)


def _fetch_shard(dataset: Location, entry: dict[str, Any], copy: Path, algorithm: str, root: Path) -> dict[str, Any]:
    url, name = join(dataset, entry["path"]), local_name(entry["path"])
    target = copy / name
    fetched = target.with_name(f".tmp-{uuid.uuid4().hex}-{Path(entry['path']).name}")
    try:
        digest, size = download(url, fetched, algorithm)
        if size != entry["size"] or digest != entry["digest"]:
            raise UserError(
                f"{url}: {algorithm} digest mismatch: expected {entry['digest']} ({entry['size']} bytes), got "
                f"{digest} ({size} bytes); the file is corrupt or was modified, re-stage it"
            )
        if name == entry["path"]:
            os.replace(fetched, target)
        else:
            data = encode_shard(pq.read_table(fetched).combine_chunks().to_batches()[0])
            digest, size = digest_bytes(data, algorithm), len(data)
            write_local(target, data)
    finally:
        fetched.unlink(missing_ok=True)
    remember_digest(target, algorithm, digest, root)
    return {"path": name, "size": size, "digest": digest}


def download(url: Location, target: Path, algorithm: str) -> tuple[str, int]:
    """Copy a stored file to a local one in ranged reads (each retried on its own), digesting the bytes as they
    arrive; returns (digest, size)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    h, offset = hasher(algorithm), 0
    with open(target, "wb") as out:
        while block := read_range(url, offset, offset + FETCH_BLOCK):
            h.update(block)
            out.write(block)
            offset += len(block)
    return h.hexdigest(), offset


def write_local(path: Path, data: bytes) -> None:
    """A file of the node cache, written whole under a temporary name, then renamed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".tmp-{uuid.uuid4().hex}-{path.name}")
    with open(tmp, "wb") as handle:
        handle.write(data)
    os.replace(tmp, path)
