"""storage/fs.py's I/O on a local folder and on a real S3 endpoint (the `storage` fixture: both): whole objects and JSON
written and read back, overwritten whole, with their sizes; byte ranges, short at the end and empty past it (S3's
InvalidRange); listings (sorted base names, every file's size) that see files another client wrote since the last
listing; removal of a file or a tree, absent being fine; uploads and downloads. Locally, a write that fails leaves the
old file and no temporary one. An S3 filesystem gets the client's quick retry unless the options name their own."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from storage.fs import (
    S3_CLIENT_RETRIES,
    exists,
    filesystem,
    find_sizes,
    get_file,
    listdir,
    makedirs,
    put_file,
    read_bytes,
    read_json,
    read_range,
    remove,
    size,
    write_bytes_atomic,
    write_json_atomic,
)
from storage.location import Location, join


def test_whole_objects_and_json_round_trip_and_overwrite_whole(storage: Location) -> None:
    target = join(storage, "runs", "r", "status.json")  # no directory made first: the write makes what it needs
    assert not exists(target)
    write_bytes_atomic(target, b"first version, longer")
    write_bytes_atomic(target, b"second")
    assert (read_bytes(target), size(target), exists(target)) == (b"second", 6, True)
    written = write_json_atomic(target, {"b": 1, "a": [1, 2]})
    assert written == b'{\n  "a": [\n    1,\n    2\n  ],\n  "b": 1\n}\n' == read_bytes(target)  # what a digest reads
    assert read_json(target) == {"a": [1, 2], "b": 1}
    with pytest.raises(FileNotFoundError):
        read_bytes(join(storage, "runs", "r", "absent.json"))


def test_byte_ranges_are_short_at_the_end_and_empty_past_it(storage: Location) -> None:
    shard = join(storage, "shard.arrow")
    write_bytes_atomic(shard, bytes(range(10)))
    assert read_range(shard, 2, 5) == bytes([2, 3, 4])
    assert read_range(shard, 8, 64) == bytes([8, 9])
    assert read_range(shard, 10, 20) == b""
    assert read_range(shard, 0, 10) == bytes(range(10))


def test_listings_are_sorted_sized_and_see_another_clients_writes(storage: Location) -> None:
    run = join(storage, "runs", "r")
    assert listdir(run) == [] and find_sizes(run) == {}  # absent: empty, not an error
    for name, data in (("spec.json", b"{}"), ("checkpoints/step-2/a.bin", b"12345"), ("b.txt", b"x")):
        write_bytes_atomic(join(run, name), data)
    assert listdir(run) == ["b.txt", "checkpoints", "spec.json"]
    _, root = filesystem(run)
    assert find_sizes(run) == {f"{root}/b.txt": 1, f"{root}/checkpoints/step-2/a.bin": 5, f"{root}/spec.json": 2}
    # Another client (another node) adds a file: this process's cached listing must not hide it.
    fs, path = filesystem(run)
    other = type(fs)(skip_instance_cache=True, **run.options)
    other.pipe_file(f"{path}/late.txt", b"abc")
    assert "late.txt" in listdir(run) and find_sizes(run)[f"{root}/late.txt"] == 3


def test_remove_takes_a_file_or_a_tree_and_absent_is_fine(storage: Location) -> None:
    run = join(storage, "runs", "r")
    for name in ("keep.json", "checkpoints/step-1/a.bin", "checkpoints/step-1/b.bin"):
        write_bytes_atomic(join(run, name), b"data")
    remove(join(run, "keep.json"))
    remove(join(run, "keep.json"))
    remove(join(run, "checkpoints"), recursive=True)
    assert listdir(run) == [] and not exists(join(run, "checkpoints", "step-1", "a.bin"))
    remove(join(storage, "never", "was"), recursive=True)


def test_upload_download_and_makedirs(storage: Location, tmp_path: Path) -> None:
    local = tmp_path / "weights.bin"
    local.write_bytes(b"w" * 1000)
    makedirs(join(storage, "final"))
    put_file(str(local), join(storage, "final", "weights.bin"))
    get_file(join(storage, "final", "weights.bin"), str(tmp_path / "back.bin"))
    assert (tmp_path / "back.bin").read_bytes() == local.read_bytes()
    assert listdir(join(storage, "final")) == ["weights.bin"]


def test_a_failed_local_write_keeps_the_old_file_and_no_temporary_one(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    write_bytes_atomic(Location(str(folder / "status.json")), b"old")
    (folder / "blocked" / "inside").mkdir(parents=True)  # a directory where the new file would go: the rename fails
    with pytest.raises(OSError):
        write_bytes_atomic(Location(str(folder / "blocked")), b"new")
    assert sorted(os.listdir(folder)) == ["blocked", "status.json"]
    assert (folder / "status.json").read_bytes() == b"old"
    makedirs(Location(f"file://{folder}/made/deep"))
    assert (folder / "made" / "deep").is_dir()


def test_s3_clients_retry_quickly_unless_the_options_say_otherwise(s3_bucket: Location) -> None:
    fs, path = filesystem(s3_bucket)
    assert fs.config_kwargs == S3_CLIENT_RETRIES and path == s3_bucket.url.removeprefix("s3://")
    own = {"retries": {"max_attempts": 9}}
    mine, _ = filesystem(Location(s3_bucket.url, {**s3_bucket.options, "config_kwargs": own}))
    assert mine.config_kwargs == own
