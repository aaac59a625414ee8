"""Staging to and reading from S3 through s3fs, against a real S3 HTTP endpoint on 127.0.0.1 (moto's server)."""

from __future__ import annotations

import uuid
from pathlib import Path

import blake3
import pytest

from config.sections.run_data import DataConfig
from core.errors import UserError
from staging.stage import stage_dataset
from storage.fs import filesystem, read_bytes, write_bytes_atomic
from storage.location import Location, join
from storage.manifest import verify_dataset
from tests.datafiles import arithmetic, qwen, write_jsonl, write_parquet

SAMPLE = Path(__file__).resolve().parents[2] / "data" / "sample" / "conversations.json"


def upload(local: str, url: Location) -> Location:
    write_bytes_atomic(url, Path(local).read_bytes())
    return url


def test_stage_from_s3_to_s3_and_verify_by_reading_back(s3_bucket, tiny_model, tmp_path) -> None:
    upload(str(SAMPLE), join(s3_bucket, "raw/part-0.json"))
    upload(write_parquet(tmp_path / "p.parquet", arithmetic(40)), join(s3_bucket, "raw/part-1.parquet"))
    upload(
        write_jsonl(tmp_path / "bad.jsonl", [qwen(("user", "no answer")), *arithmetic(3, start=90)]),
        join(s3_bucket, "raw/part-2.jsonl"),
    )
    data = DataConfig(
        source=f"{s3_bucket}/raw/part-*",
        max_length=128,
        on_invalid="skip",
        shard_rows=100,
        storage_options=s3_bucket.options,
    )
    storage = join(s3_bucket, "tandem")
    messages: list[str] = []
    ref = stage_dataset(data, storage, tiny_model, progress=messages.append, bars=False)
    assert ref.url == f"{storage}/datasets/{ref.dataset_id}"
    dataset = s3_bucket.with_url(ref.url)
    manifest = verify_dataset(dataset, "full", ref.manifest_digest)  # re-reads every object from the endpoint
    assert [s["url"] for s in manifest["sources"]] == [
        f"{s3_bucket}/raw/part-{i}.{ext}" for i, ext in enumerate(("json", "parquet", "jsonl"))
    ]
    assert [s["format"] for s in manifest["sources"]] == ["qwen", "qwen", "qwen"]
    assert manifest["records"] == {"read": 284, "staged": 283, "rejected": 1, "dropped": 0, "undesirable": 0}
    assert read_bytes(join(dataset, "rejects.jsonl")).decode() == (
        f'{{"location":"{s3_bucket}/raw/part-2.jsonl:1","reason":"no assistant turn"}}\n'
    )
    for entry in manifest["files"]:
        assert blake3.blake3(read_bytes(join(dataset, entry["path"]))).hexdigest() == entry["digest"]
    assert any("shards" in m and "uploaded" in m for m in messages)

    from storage.local_dataset import open_split  # what every rank does with the staged URL
    from storage.node_cache import NodeCache

    train = open_split(dataset, "train", NodeCache(tmp_path / "node-cache", 10**9), ref.manifest_digest)
    assert len(train) == manifest["splits"]["train"]["records"]
    assert all(len(row.input_ids) == len(row.labels) for row in train)

    messages.clear()
    assert stage_dataset(data, storage, tiny_model, progress=messages.append, bars=False) == ref
    assert f"dataset {ref.dataset_id} already staged at {ref.url}" in messages


def test_a_compressed_object_is_read_as_its_content(s3_bucket, tiny_model, tmp_path) -> None:
    import zstandard

    records = write_jsonl(tmp_path / "d.jsonl", arithmetic(40))
    plain = stage_dataset(
        DataConfig(source=records, max_length=64),
        Location(str(tmp_path / "s")),
        tiny_model,
        progress=lambda _: None,
        bars=False,
    )
    stored = zstandard.ZstdCompressor().compress(Path(records).read_bytes())
    write_bytes_atomic(join(s3_bucket, "raw/d.jsonl.zst"), stored)
    ref = stage_dataset(
        DataConfig(source=f"{s3_bucket}/raw/", max_length=64, storage_options=s3_bucket.options),
        join(s3_bucket, "tandem"),
        tiny_model,
        progress=lambda _: None,
        bars=False,
    )
    assert ref.dataset_id == plain.dataset_id  # the same records: the same dataset
    [source] = verify_dataset(s3_bucket.with_url(ref.url), "full")["sources"]
    assert (source["url"], source["format"], source["records"]) == (f"{s3_bucket}/raw/d.jsonl.zst", "qwen", 40)
    assert (source["size"], source["digest"]) == (len(stored), blake3.blake3(stored).hexdigest())


def test_a_modified_object_fails_verification_with_both_digests(s3_bucket, tiny_model) -> None:
    data = DataConfig(source=str(SAMPLE), max_length=128)
    ref = stage_dataset(data, join(s3_bucket, "tandem"), tiny_model, progress=lambda _: None, bars=False)
    dataset = s3_bucket.with_url(ref.url)
    manifest = verify_dataset(dataset, "full")
    entry = manifest["files"][0]
    url = join(dataset, entry["path"])
    body = bytearray(read_bytes(url))
    body[-20] ^= 0xFF
    write_bytes_atomic(url, bytes(body))
    verify_dataset(dataset, "size")
    with pytest.raises(UserError) as info:
        verify_dataset(dataset, "full")
    actual = blake3.blake3(bytes(body)).hexdigest()
    assert str(info.value).startswith(f"{url}: blake3 digest mismatch: expected {entry['digest']}, got {actual};")
    fs, path = filesystem(url)
    fs.rm(path)
    with pytest.raises(UserError, match=rf"^{url}: missing \(listed in manifest.json\)"):
        verify_dataset(dataset, "size")


def test_data_storage_options_reach_a_source_bucket(s3_endpoint, s3_bucket, tiny_model, tmp_path) -> None:
    other = f"s3://tandem-src-{uuid.uuid4().hex[:12]}"  # a plain URL: only data.storage_options can reach it
    import s3fs

    s3fs.S3FileSystem(endpoint_url=s3_endpoint, skip_instance_cache=True).mkdir(other[len("s3://") :])
    source_fs = s3fs.S3FileSystem(endpoint_url=s3_endpoint, skip_instance_cache=True)
    source_fs.pipe_file(
        f"{other[5:]}/data/a.jsonl", Path(write_jsonl(tmp_path / "a.jsonl", arithmetic(30))).read_bytes()
    )
    data = DataConfig(source=f"{other}/data/*.jsonl", storage_options={"endpoint_url": s3_endpoint}, eval_ratio=0.2)
    ref = stage_dataset(data, join(s3_bucket, "tandem"), tiny_model, progress=lambda _: None, bars=False)
    assert verify_dataset(s3_bucket.with_url(ref.url), "full")["sources"][0]["url"] == f"{other}/data/a.jsonl"
