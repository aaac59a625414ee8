"""Manifests: the files that make a directory whole, checked by size (a listing) or by digest (a full read), each
failure one line naming the file and what differs; a dataset's manifest held to the digest the run was planned with."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from core.errors import UserError
from storage import layout
from storage.digest import digest_bytes
from storage.location import Location
from storage.manifest import read_manifest, verify_dataset, verify_files


def staged(folder: Path, algorithm: str = "blake3") -> dict:
    """A dataset directory of two shards and its manifest."""
    files = []
    for name, body in (("train/shard-00000.arrow", b"train rows"), ("eval/shard-00000.arrow", b"eval")):
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(body)
        files.append({"path": name, "size": len(body), "digest": digest_bytes(body, algorithm)})
    manifest = {"schema": layout.DATASET_SCHEMA, "digest_algorithm": algorithm, "files": files}
    (folder / layout.MANIFEST).write_text(json.dumps(manifest))
    return manifest


@pytest.mark.parametrize("algorithm", ["blake3", "sha256"])
def test_a_whole_directory_verifies_and_its_digest_is_of_the_manifests_bytes(tmp_path, algorithm: str) -> None:
    manifest = staged(tmp_path, algorithm)
    doc, digest = read_manifest(Location(str(tmp_path)), layout.DATASET_SCHEMA)
    assert doc == manifest and digest == digest_bytes((tmp_path / layout.MANIFEST).read_bytes(), algorithm)
    assert verify_dataset(Location(str(tmp_path)), manifest_digest=digest) == manifest


def test_each_difference_is_one_line_naming_the_file(tmp_path) -> None:
    manifest = staged(tmp_path)
    base = Location(str(tmp_path))
    shard = tmp_path / "train" / "shard-00000.arrow"
    shard.write_bytes(b"TRAIN ROWS")  # same size
    verify_files(base, manifest, mode="size")  # the quick check cannot see it
    with pytest.raises(UserError, match=rf"^{shard}: blake3 digest mismatch: expected [0-9a-f]+, got [0-9a-f]+; the"):
        verify_files(base, manifest)
    shard.write_bytes(b"short")
    with pytest.raises(UserError, match=rf"^{shard}: size 5 != expected 10; the file changed after staging"):
        verify_files(base, manifest, mode="size")
    shard.unlink()
    with pytest.raises(UserError, match=rf"^{shard}: missing \(listed in manifest.json\); re-stage or restore it$"):
        verify_files(base, manifest, mode="size")


def test_a_manifest_of_another_kind_version_or_run_is_refused(tmp_path) -> None:
    base = Location(str(tmp_path))
    with pytest.raises(UserError, match=r"manifest.json: missing; the directory is incomplete"):
        read_manifest(base, layout.DATASET_SCHEMA)
    staged(tmp_path)
    with pytest.raises(UserError, match=r"schema 'tandem.dataset/1' is not 'tandem.checkpoint/1'; written by another"):
        read_manifest(base, layout.CHECKPOINT_SCHEMA)
    with pytest.raises(UserError, match=r"digest mismatch: expected abc, got [0-9a-f]+; the dataset was staged again"):
        verify_dataset(base, manifest_digest="abc")
