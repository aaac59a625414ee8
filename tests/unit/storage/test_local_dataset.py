"""What a node reads a staged dataset from (storage/local_dataset.py): the node cache's copy of a dataset on an object
store (a real S3 endpoint on 127.0.0.1), fetched and verified once, read by the ranks without another download,
fetched again where it is damaged, least recently used copies removed beyond launch.node_cache_max_gb; a dataset in
the earlier Parquet form converted into the cache and read as before; a shard that cannot be read named in one line."""

from __future__ import annotations

import json
import os
import shutil
import threading
from pathlib import Path

import blake3
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from config.sections.run_data import DataConfig
from core.errors import RetryableError, UserError
from staging.stage import stage_dataset
from storage import layout
from storage.fs import filesystem, read_bytes
from storage.local_dataset import open_split, prepare_dataset
from storage.location import Location, join
from storage.manifest import read_manifest
from storage.node_cache import NodeCache, dataset_entry, unused
from storage.shards import Row
from storage.spec import DatasetRef
from tests.datafiles import arithmetic, write_jsonl

SCHEMA = "tandem.dataset/1"


def rows_of(shard: bytes) -> list[Row]:
    """The rows of one shard's bytes, read whole."""
    columns = pa.ipc.open_file(pa.BufferReader(shard)).read_all().to_pydict()
    return [Row(i, la, [len(i)]) for i, la in zip(columns["input_ids"], columns["labels"], strict=True)]


def split_rows(dataset: Location, split: str) -> list[Row]:
    """Every row of a split, from the stored shards themselves."""
    manifest, _ = read_manifest(dataset, SCHEMA)
    return [
        r
        for e in manifest["files"]
        if e["path"].startswith(f"{split}/")
        for r in rows_of(read_bytes(join(dataset, e["path"])))
    ]


@pytest.fixture(scope="module")
def on_s3(s3_endpoint, tiny_model, tmp_path_factory) -> dict[str, DatasetRef]:
    """Two small datasets staged to S3, `a` in 3 train shards and `b`."""
    import s3fs

    s3fs.S3FileSystem(client_kwargs={"endpoint_url": s3_endpoint}).mkdir("tandem-node-cache")
    storage = Location("s3://tandem-node-cache/store", {"endpoint_url": s3_endpoint})
    source = tmp_path_factory.mktemp("node-cache-sources")
    return {
        name: stage_dataset(
            DataConfig(source=write_jsonl(source / f"{name}.jsonl", arithmetic(n, start)), shard_rows=20),
            storage,
            tiny_model,
            progress=lambda _: None,
            bars=False,
        )
        for name, n, start in (("a", 60, 0), ("b", 30, 100))
    }


def located(ref: DatasetRef, s3_endpoint: str) -> Location:
    return Location(ref.url, {"endpoint_url": s3_endpoint})


def test_a_node_fetches_a_dataset_once_and_its_ranks_read_that_copy(on_s3, s3_endpoint, tmp_path) -> None:
    ref = on_s3["a"]
    original = located(ref, s3_endpoint)
    # A copy of the dataset of its own, whose shards this test deletes from the bucket.
    fs, path = filesystem(original)
    fs.copy(path, path + "-copy", recursive=True)
    dataset = original.with_url(ref.url + "-copy")
    cache = NodeCache(tmp_path / "cache", 10**9)
    files = len(read_manifest(dataset, SCHEMA)[0]["files"])
    assert prepare_dataset(dataset, ref.manifest_digest, cache).endswith(f"0 files verified, {files} fetched (0.00 GB)")
    assert prepare_dataset(dataset, ref.manifest_digest, cache).endswith(f"{files} files verified")  # a retry, a run
    expected = {split: split_rows(dataset, split) for split in ("train", "eval")}
    fs.rm(f"{path}-copy/train", recursive=True)
    fs.rm(f"{path}-copy/eval", recursive=True)
    # Without a shard left on the store: the ranks and the next preflight read the node's copy, downloading nothing.
    assert prepare_dataset(dataset, ref.manifest_digest, cache).endswith(f"{files} files verified")
    for split in ("train", "eval"):
        assert list(open_split(dataset, split, cache, ref.manifest_digest)) == expected[split]
    with pytest.raises(UserError, match=r"manifest.json: digest mismatch: expected 00ff, got [0-9a-f]+; the dataset"):
        open_split(dataset, "train", cache, "00ff")


def test_a_damaged_cached_file_is_fetched_again(on_s3, s3_endpoint, tmp_path) -> None:
    ref = on_s3["a"]
    dataset, cache = located(ref, s3_endpoint), NodeCache(tmp_path / "cache", 10**9)
    prepare_dataset(dataset, ref.manifest_digest, cache)
    shard = dataset_entry(cache.root, ref.dataset_id, ref.manifest_digest) / "train" / "shard-00001.arrow"
    good = shard.read_bytes()
    changed = bytearray(good)
    changed[len(good) // 2] ^= 0xFF  # a flipped bit: same size, new modification time, so hashed again
    shard.write_bytes(bytes(changed))
    assert prepare_dataset(dataset, ref.manifest_digest, cache).endswith(", 1 fetched (0.00 GB)")
    assert shard.read_bytes() == good
    shard.write_bytes(good[:100])  # cut short: a rank sees it by its size, and fetches it again itself
    with open_split(dataset, "train", cache) as split:
        assert list(split) == split_rows(dataset, "train")
    # The worst case: other bytes of the same size under the old modification time. Preflight trusts the digest it
    # recorded; the rank cannot map the file, names it, and removes it, so the retry's preflight fetches it again.
    stat = shard.stat()
    shard.write_bytes(b"\0" * len(good))
    os.utime(shard, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    with pytest.raises(
        RetryableError, match=rf"^{shard}: not a readable dataset shard \(.*\); removed from the node"
    ) as caught:
        open_split(dataset, "train", cache)
    # The failed open let its hold on the copy go, even while its traceback lives (else the fill below would wait on
    # it forever: flock counts each open file as a holder of its own, in the same process too).
    with unused(dataset_entry(cache.root, ref.dataset_id, ref.manifest_digest)) as free:
        assert free and caught.traceback
    assert prepare_dataset(dataset, ref.manifest_digest, cache).endswith(", 1 fetched (0.00 GB)")
    assert shard.read_bytes() == good


def test_a_rank_fills_a_copy_that_others_already_read(on_s3, s3_endpoint, tmp_path) -> None:
    """Two ranks of a node, no preflight (the evaluation stage): the one that found the copy incomplete fills it while
    the other, which read it first, keeps its hold for good; it never waits for that hold to go."""
    ref = on_s3["b"]
    dataset, cache = located(ref, s3_endpoint), NodeCache(tmp_path / "cache", 10**9)
    reader = open_split(dataset, "eval", cache)  # the rank that came first: holds the copy for its whole life
    shard = dataset_entry(cache.root, ref.dataset_id, ref.manifest_digest) / "train" / "shard-00000.arrow"
    shard.write_bytes(shard.read_bytes()[:50])  # what the other rank finds: a copy to fill
    done: list[int] = []
    other = threading.Thread(target=lambda: done.append(len(open_split(dataset, "train", cache))), daemon=True)
    other.start()
    other.join(timeout=60)
    assert done == [len(split_rows(dataset, "train"))] and len(reader) == len(split_rows(dataset, "eval"))


def test_copies_beyond_the_cap_go_least_recently_used_first_unless_in_use(on_s3, s3_endpoint, tmp_path) -> None:
    a, b = on_s3["a"], on_s3["b"]
    sizes = {
        n: sum(e["size"] for e in read_manifest(located(r, s3_endpoint), SCHEMA)[0]["files"]) for n, r in on_s3.items()
    }
    cache = NodeCache(tmp_path / "cache", sizes["a"] + sizes["b"] - 1)  # room for one of them at a time
    entry_a = dataset_entry(cache.root, a.dataset_id, a.manifest_digest)
    prepare_dataset(located(a, s3_endpoint), a.manifest_digest, cache)
    line = prepare_dataset(located(b, s3_endpoint), b.manifest_digest, cache)
    assert line.endswith(f"; removed {entry_a.name} (least recently used)") and not entry_a.exists()
    held = open_split(located(b, s3_endpoint), "train", cache)  # a rank reading b: b stays, over the cap if need be
    assert "removed" not in prepare_dataset(located(a, s3_endpoint), a.manifest_digest, cache)
    assert dataset_entry(cache.root, b.dataset_id, b.manifest_digest).exists() and len(held) > 0
    small = NodeCache(tmp_path / "small", sizes["b"] // 2)
    needs = rf"^dataset {b.dataset_id} needs 0.00 GB in the node cache \({small.root}\), more than launch.node_cache_"
    with pytest.raises(UserError, match=needs + r"max_gb=[0-9.e-]+; raise it"):
        prepare_dataset(located(b, s3_endpoint), b.manifest_digest, small)


def test_a_dataset_in_the_earlier_parquet_form_is_read_through_the_node_cache(tmp_path, tiny_model) -> None:
    source = write_jsonl(tmp_path / "d.jsonl", arithmetic(50))
    ref = stage_dataset(
        DataConfig(source=source, shard_rows=20),
        Location(str(tmp_path / "s")),
        tiny_model,
        progress=lambda _: None,
        bars=False,
    )
    expected = {split: split_rows(Location(ref.url), split) for split in ("train", "eval")}
    old = Location(str(as_parquet_form(Path(ref.url))))
    cache = NodeCache(tmp_path / "cache", 10**9)
    manifest_digest = read_manifest(old, SCHEMA)[1]
    line = prepare_dataset(old, manifest_digest, cache)
    assert "node cache copy" in line and "fetched" in line
    for split in ("train", "eval"):
        assert list(open_split(old, split, cache, manifest_digest)) == expected[split]


def as_parquet_form(dataset: Path) -> Path:
    """The dataset as the earlier version staged it: each shard a Parquet file (zstd) of the same columns."""
    old = dataset.with_name(dataset.name + "-parquet")
    shutil.copytree(dataset, old)
    manifest = json.loads((old / "manifest.json").read_text())
    for entry in manifest["files"]:
        if entry["path"].endswith(".arrow"):
            table = pa.ipc.open_file(old / entry["path"]).read_all()
            (old / entry["path"]).unlink()
            entry["path"] = entry["path"].replace(".arrow", ".parquet")
            pq.write_table(table, old / entry["path"], compression="zstd")
            data = (old / entry["path"]).read_bytes()
            entry["size"], entry["digest"] = len(data), blake3.blake3(data).hexdigest()
    (old / "manifest.json").write_text(json.dumps(manifest))
    return old


def test_a_shard_that_cannot_be_read_is_named_in_one_line(tmp_path, tiny_model) -> None:
    ref = stage_dataset(
        DataConfig(source=write_jsonl(tmp_path / "d.jsonl", arithmetic(30))),
        Location(str(tmp_path / "s")),
        tiny_model,
        progress=lambda _: None,
        bars=False,
    )
    shard, cache = Path(ref.url) / "train" / "shard-00000.arrow", NodeCache(tmp_path / "cache", 10**9)
    good = shard.read_bytes()
    shard.write_bytes(good[:-64])  # cut short: seen by its size before it is mapped
    with pytest.raises(UserError, match=rf"^{shard}: size \d+ != expected \d+; the file changed after staging, re-st"):
        open_split(Location(ref.url), "train", cache)
    shard.write_bytes(good[:-64] + b"\0" * 64)  # its footer overwritten: the size is right, the file is not
    with pytest.raises(
        UserError, match=rf"^{shard}: not a readable dataset shard \(.+\); the file is damaged, re-stage"
    ):
        open_split(Location(ref.url), "train", cache)


def test_a_datasets_images_come_with_its_shards_into_the_node_cache(s3_endpoint, qwen25_vl, tmp_path) -> None:
    """An image dataset on S3: preflight fetches its images with its shards, held against their digests, and the
    ranks read them from the copy (never from where the user kept them)."""
    import s3fs

    s3fs.S3FileSystem(client_kwargs={"endpoint_url": s3_endpoint}).mkdir("tandem-node-cache-images")
    storage = Location("s3://tandem-node-cache-images/store", {"endpoint_url": s3_endpoint})
    demo = Path(__file__).resolve().parents[3] / "data" / "mllm_demo"
    data = DataConfig(source=f"{demo}/dataset_info.json#mllm_demo", max_length=256, num_proc=1)
    ref = stage_dataset(data, storage, qwen25_vl, progress=lambda _: None, bars=False)
    dataset, cache = located(ref, s3_endpoint), NodeCache(tmp_path / "cache", 10**9)
    manifest = read_manifest(dataset, layout.DATASET_SCHEMAS)[0]
    images = [e for e in manifest["files"] if e["path"].startswith("images/")]
    assert prepare_dataset(dataset, ref.manifest_digest, cache).endswith(f"{len(manifest['files'])} fetched (0.00 GB)")
    with open_split(dataset, "train", cache, ref.manifest_digest) as split:
        assert split.images is not None and split.images.folder.is_relative_to(tmp_path / "cache")
        assert sorted(p.name for p in split.images.folder.iterdir()) == sorted(e["path"][7:] for e in images)
        row = next(r for r in split if r.images)
        assert (split.images.folder / row.images[0]).read_bytes() == read_bytes(join(dataset, "images", row.images[0]))
        assert split.images.label(row.images[0]).endswith((".png", ".jpg"))
