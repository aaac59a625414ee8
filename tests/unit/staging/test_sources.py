"""Compressed data files (.gz, .bz2, .xz, .zst): read as their content, found in directories, detected by their
content, located by the content's lines, digested as stored; a corrupt one is one line naming the file."""

from __future__ import annotations

import bz2
import gzip
import json
import lzma
from pathlib import Path

import blake3
import pytest
import zstandard

from config.sections.run_data import DataConfig
from core.errors import UserError
from staging.stage import stage_dataset
from storage.location import Location
from storage.manifest import read_manifest
from tests.datafiles import arithmetic, qwen

CODECS = {
    # Two members or frames each, as concatenated or parallel compressors write them: both must be read.
    ".gz": lambda a, b: gzip.compress(a) + gzip.compress(b),
    ".bz2": lambda a, b: bz2.compress(a) + bz2.compress(b),
    ".xz": lambda a, b: lzma.compress(a) + lzma.compress(b),
    ".zst": lambda a, b: zstandard.ZstdCompressor().compress(a) + zstandard.ZstdCompressor().compress(b),
}


def stage(data: DataConfig, storage: Path, model: str):
    return stage_dataset(data, Location(str(storage)), model, progress=lambda _: None, bars=False)


def compressed(path: Path, content: bytes) -> Path:
    half = len(content) // 2
    path.write_bytes(CODECS["".join(path.suffixes[-1:])](content[:half], content[half:]))
    return path


def test_compressed_files_stage_the_same_dataset_as_their_content(tmp_path, tiny_model) -> None:
    records = arithmetic(40)
    lines = "".join(json.dumps(r) + "\n" for r in records).encode()
    plain = tmp_path / "plain.jsonl"
    plain.write_bytes(lines)
    reference = stage(DataConfig(source=str(plain), max_length=64), tmp_path / "s", tiny_model).dataset_id
    folder = tmp_path / "compressed"
    folder.mkdir()
    for suffix in CODECS:
        compressed(folder / f"d.jsonl{suffix}", lines)
    (folder / "notes.txt.gz").write_bytes(gzip.compress(b"not data"))  # not a data file: not listed
    for path in sorted(folder.glob("d.*")):
        ref = stage(DataConfig(source=str(path), max_length=64), tmp_path / path.name, tiny_model)
        assert ref.dataset_id == reference, path.name
        [source] = read_manifest(Location(ref.url), "tandem.dataset/1")[0]["sources"]
        assert (source["format"], source["records"]) == ("qwen", 40)  # auto-detected from the content
        assert (source["size"], source["digest"]) == (path.stat().st_size, blake3.blake3(path.read_bytes()).hexdigest())
    # A directory lists them all; a JSON array compressed is told from its content too.
    array = compressed(folder / "array.json.gz", json.dumps(records[:10], indent=1).encode())
    ref = stage(DataConfig(source=str(folder), max_length=64), tmp_path / "s", tiny_model)
    manifest, _ = read_manifest(Location(ref.url), "tandem.dataset/1")
    assert [Path(s["url"]).name for s in manifest["sources"]] == [array.name, *(f"d.jsonl{s}" for s in sorted(CODECS))]
    assert manifest["records"]["read"] == 10 + 40 * len(CODECS)


def test_a_bad_record_or_a_corrupt_file_names_the_compressed_file(tmp_path, tiny_model) -> None:
    lines = [json.dumps(r) for r in arithmetic(5)] + [json.dumps(qwen(("user", "hi"), ("assistant", 3)))]
    path = compressed(tmp_path / "d.jsonl.xz", "\n".join(lines).encode())
    with pytest.raises(UserError) as info:
        stage(DataConfig(source=str(path)), tmp_path / "s", tiny_model)
    assert str(info.value) == (
        f"{path}:6: conversations[1].value: expected a string, got int "
        "(or set data.on_invalid=skip to skip invalid records)"
    )
    corrupt = tmp_path / "c.jsonl.gz"
    corrupt.write_bytes(gzip.compress(b"\n".join(line.encode() for line in lines))[:-20])  # cut short
    with pytest.raises(
        UserError,
        match=rf"^{corrupt}: not a readable gzip file \(.+\); check the file or its "
        r"extension$",
    ):
        stage(DataConfig(source=str(corrupt)), tmp_path / "s", tiny_model)
    assert not list((tmp_path / "s").glob("datasets/ds-*"))
