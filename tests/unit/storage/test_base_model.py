"""The base model's manifest and the node cache its digests come from: a Hugging Face cache's symlinks followed,
hidden files left out, the same model always the same manifest, a digest computed once per file version."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save

from core.errors import UserError
from storage import layout
from storage.base_model import read_base_model, record_base_model, verify_local_model
from storage.location import Location
from storage.node_cache import file_digest


def weights() -> bytes:
    """A real safetensors file of WEIGHTS_BYTES bytes with random contents (the pipeline reads its header)."""
    data = save({"w": np.frombuffer(os.urandom(3992), dtype=np.uint8)}, metadata={"format": "pt"})
    assert len(data) == WEIGHTS_BYTES
    return data


WEIGHTS_BYTES = 4096


def hub_snapshot(root: Path) -> Path:
    """A model as the Hugging Face cache holds it: the snapshot's files are symlinks into blobs/."""
    blobs, snapshot = root / "blobs", root / "snapshots" / "abc123"
    blobs.mkdir(parents=True)
    snapshot.mkdir(parents=True)
    for name, data in (("config.json", b'{"model_type": "qwen2"}'), ("model.safetensors", weights())):
        (blobs / f"blob-{name}").write_bytes(data)
        (snapshot / name).symlink_to(blobs / f"blob-{name}")
    (snapshot / ".gitattributes").write_text("*.safetensors filter=lfs\n")
    return snapshot


def test_the_manifest_follows_symlinks_leaves_hidden_files_out_and_depends_on_the_files_alone(tmp_path) -> None:
    model = hub_snapshot(tmp_path / "hub")
    cache = tmp_path / "cache"
    first = record_base_model(Location(str(tmp_path / "run1")), str(model), "blake3", cache)
    doc = json.loads((tmp_path / "run1" / layout.BASE_MODEL).read_text())
    assert doc["schema"] == layout.BASE_MODEL_SCHEMA
    assert [(f["path"], f["size"]) for f in doc["files"]] == [("config.json", 23), ("model.safetensors", WEIGHTS_BYTES)]
    # Another run, the same model: the same manifest and digest (the lineage of both names the same base model).
    assert record_base_model(Location(str(tmp_path / "run2")), str(model), "blake3", cache) == first
    assert read_base_model(Location(str(tmp_path / "run2")), first) == doc
    with pytest.raises(UserError, match=r"not the manifest spec\.json recorded"):
        read_base_model(Location(str(tmp_path / "run2")), "0" * 64)


def test_a_digest_is_computed_once_per_version_of_a_file(tmp_path) -> None:
    path, cache = tmp_path / "weights.bin", tmp_path / "cache"
    path.write_bytes(b"a" * 1000)
    digest, cached = file_digest(path, "blake3", cache)
    assert not cached
    assert file_digest(path, "blake3", cache) == (digest, True)
    assert file_digest(path, "sha256", cache)[1] is False  # another algorithm is another entry
    time.sleep(0.01)
    path.write_bytes(b"b" * 1000)  # same size, new bytes and mtime: the entry no longer matches
    changed, cached = file_digest(path, "blake3", cache)
    assert not cached and changed != digest


def test_a_cut_short_copy_is_named_with_both_sizes(tmp_path) -> None:
    model = hub_snapshot(tmp_path / "hub")
    cache = tmp_path / "cache"
    digest = record_base_model(Location(str(tmp_path / "run")), str(model), "blake3", cache)
    manifest = read_base_model(Location(str(tmp_path / "run")), digest)
    assert verify_local_model(manifest, str(model), cache) == (2, 2)
    copy = tmp_path / "node-copy"
    copy.mkdir()
    (copy / "config.json").write_bytes((model / "config.json").read_bytes())
    (copy / "model.safetensors").write_bytes((model / "model.safetensors").read_bytes()[:1000])
    with pytest.raises(UserError, match=rf"^{copy}/model.safetensors: 1000 bytes, the pipeline's copy has 4096 "):
        verify_local_model(manifest, str(copy), cache)
