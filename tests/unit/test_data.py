"""Data staging: record validation with locations, label masking, deterministic ids and splits, manifests."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from config.errors import UserError
from config.loader import PROJECT_ROOT
from config.manifest import read_manifest, verify_files
from config.schema import DataConfig
from tasks.data.records import read_records
from tasks.data.stage import stage_dataset
from tasks.data.tokenize import IGNORE_INDEX, encode

SAMPLE = PROJECT_ROOT / "data" / "sample" / "conversations.json"


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> str:
    """The built-in tiny model, built through the same subprocess the pipeline uses."""
    out = tmp_path_factory.mktemp("model") / "tiny"
    subprocess.run([sys.executable, "-m", "trainer.tiny", "--out", str(out), "--corpus", str(SAMPLE)],
                   cwd=PROJECT_ROOT, check=True, capture_output=True)
    return str(out)


def write_jsonl(path: Path, records: list[object]) -> str:
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    return str(path)


def convo(*turns: tuple[str, str]) -> dict:
    return {"conversations": [{"from": role, "value": text} for role, text in turns]}


@pytest.mark.parametrize(
    ("record", "reason"),
    [
        (convo(("user", "hi")), "no assistant turn"),
        (convo(("assistant", "hi"), ("user", "x")), "roles out of order: turn 0 is 'assistant'"),
        (convo(("user", "hi"), ("assistant", "  ")), "conversations[1]: empty text"),
        (convo(("user", "hi"), ("robot", "x")), "'from' must be one of"),
        ({"conversations": [{"from": "user", "value": 3}]}, "'value' must be a string, got int"),
    ],
)
def test_invalid_records_name_file_line_and_reason(tmp_path, record, reason) -> None:
    good = convo(("user", "hi"), ("assistant", "hello"))
    path = write_jsonl(tmp_path / "d.jsonl", [good, good, record])
    with pytest.raises(UserError) as info:
        read_records(path, "auto")
    assert str(info.value).startswith(f"{path}:3")
    assert reason in str(info.value)


def test_malformed_json_names_the_line(tmp_path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps(convo(("user", "a"), ("assistant", "b"))) + "\n{not json\n")
    with pytest.raises(UserError, match=rf"{path}:2: malformed JSON"):
        read_records(str(path), "auto")


def test_json_array_locations_use_the_index(tmp_path) -> None:
    path = tmp_path / "d.json"
    path.write_text(json.dumps([convo(("user", "a"), ("assistant", "b")), convo(("user", "a"))]))
    with pytest.raises(UserError, match=rf"{path}\[1\]: no assistant turn"):
        read_records(str(path), "auto")


def test_labels_are_exactly_the_assistant_tokens(tiny_model) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Add 2 and 3."},
                {"role": "assistant", "content": "2 plus 3 is 5."}, {"role": "user", "content": "Times 4?"},
                {"role": "assistant", "content": "5 times 4 is 20."}]
    enc = encode(tok, messages, max_length=512, location="test")
    targets = [t for t, label in zip(enc.input_ids, enc.labels, strict=True) if label != IGNORE_INDEX]
    expected = tok("2 plus 3 is 5.<|im_end|>\n5 times 4 is 20.<|im_end|>\n", add_special_tokens=False)["input_ids"]
    assert tok.decode(targets) == tok.decode(expected) == "2 plus 3 is 5.<|im_end|>\n5 times 4 is 20.<|im_end|>\n"
    assert all(label in (IGNORE_INDEX, tid) for tid, label in zip(enc.input_ids, enc.labels, strict=True))
    masked = tok.decode([t for t, label in zip(enc.input_ids, enc.labels, strict=True) if label == IGNORE_INDEX])
    assert "Add 2 and 3." in masked and "Be brief." in masked and "5 times" not in masked


def test_truncation_is_counted(tiny_model) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model)
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "word " * 50}]
    enc = encode(tok, messages, max_length=16, location="t")
    assert enc.truncated and len(enc.input_ids) == len(enc.labels) == 16


def test_staging_is_deterministic_verified_and_reused(tmp_path, tiny_model) -> None:
    data = DataConfig(source=str(SAMPLE), max_length=128)
    first = stage_dataset(data, str(tmp_path / "s1"), tiny_model)
    second = stage_dataset(data, str(tmp_path / "s2"), tiny_model)
    manifest, _ = read_manifest(first.url, "tandem.dataset/1")
    other, _ = read_manifest(second.url, "tandem.dataset/1")
    assert first.dataset_id == second.dataset_id
    assert manifest["files"] == other["files"]  # same bytes; only created_at differs between the two
    verify_files(first.url, manifest, mode="full")
    counts = manifest["splits"]
    assert counts["train"]["records"] + counts["eval"]["records"] == 240
    eval_rows = pq.read_table(Path(first.url) / "eval" / "shard-00000.parquet").num_rows
    assert eval_rows == counts["eval"]["records"] > 0
    messages: list[str] = []
    again = stage_dataset(data, str(tmp_path / "s1"), tiny_model, progress=messages.append)
    assert again == first and any("already staged" in m for m in messages)
    changed = stage_dataset(DataConfig(source=str(SAMPLE), max_length=64), str(tmp_path / "s1"), tiny_model)
    assert changed.dataset_id != first.dataset_id


def test_corrupted_shard_is_named_with_both_digests(tmp_path, tiny_model) -> None:
    ref = stage_dataset(DataConfig(source=str(SAMPLE), max_length=128), str(tmp_path), tiny_model)
    manifest, _ = read_manifest(ref.url, "tandem.dataset/1")
    shard = Path(ref.url) / manifest["files"][0]["path"]
    raw = bytearray(shard.read_bytes())
    raw[100] ^= 0xFF
    shard.write_bytes(bytes(raw))
    with pytest.raises(UserError) as info:
        verify_files(ref.url, manifest, mode="full")
    assert str(shard) in str(info.value) and manifest["files"][0]["digest"] in str(info.value)
