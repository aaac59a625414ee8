"""Weights files read by their headers: real safetensors files (written by the safetensors library, sharded as
transformers shards them) cut short, with a broken header, or missing from their index are each one line naming the
file, what is wrong and the fix; a good model passes, and so does the tiny model the pipeline builds."""

from __future__ import annotations

import json
import shutil
import zipfile
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from core.errors import UserError
from storage.base_model import describe, model_files
from storage.weights import check_weights

FIX = "download it again"


def sharded(root: Path) -> Path:
    """A two-shard model directory with its index, as a sharded save_pretrained lays it out."""
    root.mkdir()
    shards = {
        "model-00001-of-00002.safetensors": {"a": np.ones((64, 64), np.float32)},
        "model-00002-of-00002.safetensors": {"b": np.zeros((32,), np.float32), "c": np.arange(8, dtype=np.int64)},
    }
    weight_map = {}
    for name, tensors in shards.items():
        save_file(tensors, str(root / name), metadata={"format": "pt"})
        weight_map |= dict.fromkeys(tensors, name)
    (root / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    (root / "config.json").write_text("{}")
    return root


def check(root: Path) -> int:
    return check_weights(str(root), model_files(str(root)))


def test_a_good_model_passes(tmp_path, tiny_model) -> None:
    assert check(sharded(tmp_path / "m")) == 2
    assert check(Path(tiny_model)) == 1


@pytest.mark.parametrize("keep", [4, 100, -1])
def test_a_truncated_file_is_named_with_what_is_missing(tmp_path, keep: int) -> None:
    root = sharded(tmp_path / "m")
    shard = root / "model-00001-of-00002.safetensors"
    data = shard.read_bytes()
    shard.write_bytes(data[:keep])
    with pytest.raises(UserError) as info:
        check(root)
    message = str(info.value)
    assert message.startswith(f"{shard}: ") and "truncated" in message and FIX in message
    assert "\n" not in message
    if keep == -1:
        assert f"{len(data) - 1} bytes, its header describes {len(data)} (1 missing)" in message


def test_a_corrupt_header_is_named(tmp_path) -> None:
    root = sharded(tmp_path / "m")
    shard = root / "model-00002-of-00002.safetensors"
    data = bytearray(shard.read_bytes())
    data[8:12] = b"\x00\xff{["  # the JSON header's first bytes overwritten
    shard.write_bytes(bytes(data))
    with pytest.raises(UserError, match=rf"^{shard}: its safetensors header is not valid JSON .*{FIX}"):
        check(root)
    shard.write_bytes((2**40).to_bytes(8, "little") + bytes(data[8:]))  # a length no header has
    with pytest.raises(UserError, match=rf"^{shard}: not a safetensors file \(its header claims {2**40} bytes\)"):
        check(root)


def test_a_shard_the_index_names_but_the_directory_lacks_is_named(tmp_path) -> None:
    root = sharded(tmp_path / "m")
    (root / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(UserError) as info:
        check(root)
    assert str(info.value) == (
        f"{root}/model-00002-of-00002.safetensors: named in model.safetensors.index.json but missing; "
        "download it again (or copy it again from a good copy)"
    )


def test_a_pytorch_archive_cut_short_is_named(tmp_path) -> None:
    root = tmp_path / "m"
    root.mkdir()
    with zipfile.ZipFile(root / "pytorch_model.bin", "w") as archive:
        archive.writestr("archive/data.pkl", b"x" * 4096)
    assert check(root) == 1
    data = (root / "pytorch_model.bin").read_bytes()
    (root / "pytorch_model.bin").write_bytes(data[: len(data) // 2])
    with pytest.raises(UserError, match=r"pytorch_model.bin: truncated: a PyTorch archive without its directory"):
        check(root)


def test_the_pipeline_names_a_broken_model_before_it_digests_it(tmp_path, tiny_model) -> None:
    model = tmp_path / "model"
    shutil.copytree(tiny_model, model)
    weights = model / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1000])
    with pytest.raises(UserError, match=rf"^{weights}: truncated: .*\(1000 missing\); {FIX}"):
        describe(str(model), "blake3", tmp_path / "cache")
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").rglob("*"))  # nothing hashed
