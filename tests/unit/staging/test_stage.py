"""Staging: what the staged directory holds, when it is reused, what names a new dataset, rejects, splits,
interruption and the verification every node runs."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from pathlib import Path

import blake3
import orjson
import pyarrow as pa
import pytest

from config.sections.run_data import DataConfig
from core.errors import UserError
from staging import spool, workers
from staging.stage import length_warning, stage_dataset
from storage import shards
from storage.location import Location
from storage.manifest import read_manifest, verify_dataset, verify_files
from tests.datafiles import SAMPLE, arithmetic, qwen, write_json, write_jsonl

SCHEMA = "tandem.dataset/1"


def stage(data: DataConfig, storage: Path, model: str, messages: list[str] | None = None):
    return stage_dataset(
        data,
        Location(str(storage)),
        model,
        progress=(messages.append if messages is not None else lambda _: None),
        bars=False,
    )


def examples(url: str, split: str) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """(input_ids, labels) of every example of a split, in order."""
    manifest, _ = read_manifest(Location(url), SCHEMA)
    out = []
    for entry in manifest["files"]:
        if entry["path"].startswith(f"{split}/"):
            table = pa.ipc.open_file(Path(url) / entry["path"]).read_all()
            out += [
                (tuple(i), tuple(la))
                for i, la in zip(table.column("input_ids").to_pylist(), table.column("labels").to_pylist(), strict=True)
            ]
    return out


def test_staged_directory_holds_verified_shards_and_counts(tmp_path, tiny_model) -> None:
    data = DataConfig(source=str(SAMPLE), max_length=128, shard_rows=100)
    ref = stage(data, tmp_path / "s", tiny_model)
    manifest, digest = read_manifest(Location(ref.url), SCHEMA)
    assert digest == ref.manifest_digest and manifest["dataset_id"] == ref.dataset_id
    assert [f["path"] for f in manifest["files"]] == [
        "train/shard-00000.arrow",
        "train/shard-00001.arrow",
        "train/shard-00002.arrow",
        "eval/shard-00000.arrow",
    ]
    verify_files(Location(ref.url), manifest, mode="full")
    for split, counts in manifest["splits"].items():
        rows = examples(ref.url, split)
        assert counts["records"] == len(rows) > 0
        assert counts["tokens"] == sum(len(ids) for ids, _ in rows)
        assert counts["target_tokens"] == sum(sum(1 for label in labels[1:] if label != -100) for _, labels in rows)
    assert manifest["records"] == {"read": 240, "staged": 240, "rejected": 0, "dropped": 0, "undesirable": 0}
    assert manifest["rejects"] is None
    [source] = manifest["sources"]
    assert (source["url"], source["format"], source["records"]) == (str(SAMPLE), "qwen", 240)
    assert source["digest"] == blake3.blake3(SAMPLE.read_bytes()).hexdigest()
    table = pa.ipc.open_file(Path(ref.url) / "train/shard-00000.arrow").read_all()
    assert table.column("length").to_pylist() == [len(ids) for ids in table.column("input_ids").to_pylist()]


def test_unchanged_input_is_already_staged_without_reading_a_record(tmp_path, tiny_model) -> None:
    data = DataConfig(source=str(SAMPLE), max_length=128)
    first = stage(data, tmp_path, tiny_model)
    messages: list[str] = []
    assert stage(data, tmp_path, tiny_model, messages) == first
    assert any(m == f"dataset {first.dataset_id} already staged at {first.url}" for m in messages)
    assert not any(m.startswith(("reading", "tokenizing")) for m in messages)
    # Without the by-source index (another machine, or an older Tandem), the records are read, not tokenized.
    shutil.rmtree(tmp_path / "datasets" / "by-source")
    messages.clear()
    assert stage(data, tmp_path, tiny_model, messages) == first
    assert any(m.startswith("reading") for m in messages) and not any(m.startswith("tokenizing") for m in messages)


def test_dataset_id_follows_what_shapes_the_bytes_and_nothing_else(tmp_path, tiny_model) -> None:
    records = json.loads(SAMPLE.read_text())[:60]
    source = write_json(tmp_path / "a.json", records)
    base = DataConfig(source=source, max_length=128, eval_ratio=0.2)
    reference = stage(base, tmp_path / "s", tiny_model).dataset_id
    template = tmp_path / "tok"
    shutil.copytree(tiny_model, template)
    (template / "chat_template.jinja").write_text((template / "chat_template.jinja").read_text() + "{# v2 #}")
    edited = [dict(r) for r in records]
    edited[7] = {
        **edited[7],
        "conversations": [
            *edited[7]["conversations"][:-1],
            {"from": "assistant", "value": edited[7]["conversations"][-1]["value"] + "!"},
        ],
    }
    changed = {
        "a record": (base.model_copy(update={"source": write_json(tmp_path / "b.json", edited)}), tiny_model),
        "the template": (base, str(template)),
        "max_length": (base.model_copy(update={"max_length": 127}), tiny_model),
        "eval_ratio": (base.model_copy(update={"eval_ratio": 0.3}), tiny_model),
        "shard_rows": (base.model_copy(update={"shard_rows": 7}), tiny_model),
        "digest_algorithm": (base.model_copy(update={"digest_algorithm": "sha256"}), tiny_model),
    }
    for what, (data, model) in changed.items():
        assert stage(data, tmp_path / "s", model).dataset_id != reference, what
    moved = tmp_path / "moved"
    moved.mkdir()
    # The same records as JSON Lines, without their 'id' field, in another directory: the same dataset.
    same = {
        "the file's format and place": base.model_copy(
            update={"source": write_jsonl(moved / "c.jsonl", [{"conversations": r["conversations"]} for r in records])}
        ),
        "num_proc and on_invalid": base.model_copy(update={"num_proc": 2, "on_invalid": "skip"}),
    }
    for what, data in same.items():
        assert stage(data, tmp_path / "s", tiny_model).dataset_id == reference, what


def test_split_is_decided_by_each_record_alone(tmp_path, tiny_model) -> None:
    a, b = arithmetic(300), arithmetic(300, start=1000)
    data = DataConfig(source=write_jsonl(tmp_path / "a.jsonl", a), max_length=64, eval_ratio=0.2)
    alone = stage(data, tmp_path / "s", tiny_model)
    mixed_source = write_jsonl(tmp_path / "ab.jsonl", [*b[:150], *reversed(a), *b[150:]])
    mixed = stage(data.model_copy(update={"source": mixed_source}), tmp_path / "s", tiny_model)
    eval_alone, eval_mixed = set(examples(alone.url, "eval")), set(examples(mixed.url, "eval"))
    train_alone = set(examples(alone.url, "train"))
    assert eval_alone and eval_alone <= eval_mixed and not train_alone & eval_mixed
    assert 0.15 < len(eval_mixed) / 600 < 0.25


def test_the_eval_split_is_capped_by_the_records_lowest_digests(tmp_path, tiny_model) -> None:
    a = arithmetic(300)
    data = DataConfig(source=write_jsonl(tmp_path / "a.jsonl", a), max_length=64, eval_ratio=0.3)
    whole = stage(data.model_copy(update={"eval_max_records": None}), tmp_path / "s", tiny_model)
    messages: list[str] = []
    capped = stage(data.model_copy(update={"eval_max_records": 20}), tmp_path / "s", tiny_model, messages)
    held = len(examples(whole.url, "eval"))
    manifest, _ = read_manifest(Location(capped.url), SCHEMA)
    assert manifest["split"] == {"eval_ratio": 0.3, "eval_max_records": 20, "eval_capped": held - 20}
    assert (manifest["splits"]["eval"]["records"], manifest["splits"]["train"]["records"]) == (20, 280)
    assert f"eval split capped at data.eval_max_records=20: {held - 20} more records of the {held}" in "".join(messages)
    from pipeline.model_card import split_row  # the model card says how the eval split was made

    moved = f"`data.eval_ratio` 0.3, at most `data.eval_max_records` 20 ({held - 20} more records train)"
    assert split_row(manifest["split"]) == ("held out", moved)
    assert split_row(read_manifest(Location(whole.url), SCHEMA)[0]["split"]) == (
        "held out",
        "`data.eval_ratio` 0.3, no cap",
    )
    # The records that stay held out are those whose digests are lowest: the same whatever the order of the file.
    reordered = stage(
        data.model_copy(update={"source": write_jsonl(tmp_path / "r.jsonl", a[::-1]), "eval_max_records": 20}),
        tmp_path / "s",
        tiny_model,
    )
    assert set(examples(capped.url, "eval")) == set(examples(reordered.url, "eval")) < set(examples(whole.url, "eval"))
    assert capped.dataset_id != whole.dataset_id and set(examples(capped.url, "train")) > set(
        examples(whole.url, "train")
    )


def test_eval_source_is_the_eval_split(tmp_path, tiny_model) -> None:
    train, held_out = arithmetic(50), arithmetic(10, start=500)
    data = DataConfig(
        source=write_jsonl(tmp_path / "t.jsonl", train),
        eval_ratio=0.5,
        eval_source=write_json(tmp_path / "e.json", held_out),
        max_length=64,
    )
    ref = stage(data, tmp_path / "s", tiny_model)
    manifest, _ = read_manifest(Location(ref.url), SCHEMA)
    assert (manifest["splits"]["train"]["records"], manifest["splits"]["eval"]["records"]) == (50, 10)
    assert [s["key"] for s in manifest["sources"]] == ["data.source", "data.eval_source"]
    assert manifest["split"] == {"eval_source": data.eval_source}


def test_skip_puts_every_rejected_record_in_rejects_jsonl(tmp_path, tiny_model) -> None:
    path = tmp_path / "d.jsonl"
    good = arithmetic(30)
    lines = (
        [json.dumps(r) for r in good[:10]]
        + [
            "{broken",
            json.dumps(qwen(("user", "no answer"))),
            json.dumps(qwen(("user", "x"), ("assistant", ""))),
            json.dumps(qwen(("user", "word " * 100), ("assistant", "too late"))),
        ]
        + [json.dumps(r) for r in good[10:]]
    )
    path.write_text("\n".join(lines) + "\n")
    data = DataConfig(source=str(path), max_length=64, on_invalid="skip", eval_ratio=0.2)
    ref = stage(data, tmp_path / "s", tiny_model)
    manifest, _ = read_manifest(Location(ref.url), SCHEMA)
    rejects = [orjson.loads(line) for line in (Path(ref.url) / "rejects.jsonl").read_bytes().splitlines()]
    assert [(r["location"], r["reason"].split(" (")[0]) for r in rejects] == [
        (f"{path}:11", "malformed JSON"),
        (f"{path}:12", "no assistant turn"),
        (f"{path}:13", "conversations[1].value: empty text"),
    ]
    # The over-long record (line 14) is not invalid: data.excess_length (truncate) keeps its prompt's end.
    assert manifest["records"] == {"read": 34, "staged": 31, "rejected": 3, "dropped": 0, "undesirable": 0}
    assert manifest["rejects"] == "rejects.jsonl" and manifest["sources"][0]["rejected"] == 3
    assert sum(counts["truncated"] for counts in manifest["splits"].values()) == 1
    assert "rejects.jsonl" in {f["path"] for f in manifest["files"]}
    verify_files(Location(ref.url), manifest, mode="full")
    with pytest.raises(UserError) as info:
        stage(data.model_copy(update={"on_invalid": "fail"}), tmp_path / "s", tiny_model)
    assert str(info.value).startswith(f"{path}:11: malformed JSON (")
    assert str(info.value).endswith("(or set data.on_invalid=skip to skip invalid records)")


def test_over_long_records_are_truncated_dropped_or_stop_staging(tmp_path, tiny_model) -> None:
    long_answer, long_prompt = (
        qwen(("user", "hi"), ("assistant", "word " * 80)),
        qwen(("user", "word " * 80), ("assistant", "ok")),
    )
    path = write_jsonl(tmp_path / "d.jsonl", [*arithmetic(20), long_answer, long_prompt])
    data = DataConfig(source=path, max_length=64, eval_ratio=0)
    said: list[str] = []
    truncated = stage(data, tmp_path / "s", tiny_model, said)
    manifest, _ = read_manifest(Location(truncated.url), SCHEMA)
    assert manifest["splits"]["train"]["truncated"] == 2 and manifest["splits"]["train"]["dropped"] == 0
    assert manifest["records"] == {"read": 22, "staged": 22, "rejected": 0, "dropped": 0, "undesirable": 0}
    assert all(len(ids) <= 64 and set(labels) != {-100} for ids, labels in examples(truncated.url, "train"))

    dropped = stage(data.model_copy(update={"excess_length": "drop"}), tmp_path / "s", tiny_model, said)
    manifest, _ = read_manifest(Location(dropped.url), SCHEMA)
    assert dropped.dataset_id != truncated.dataset_id
    assert (manifest["splits"]["train"]["dropped"], manifest["splits"]["eval"]["dropped"]) == (2, 0)
    assert manifest["records"] == {"read": 22, "staged": 20, "rejected": 0, "dropped": 2, "undesirable": 0}
    rejects = [orjson.loads(line) for line in (Path(dropped.url) / "rejects.jsonl").read_bytes().splitlines()]
    assert [r["location"] for r in rejects] == [f"{path}:21", f"{path}:22"]
    assert all(
        re.fullmatch(r"\d+ tokens, longer than data.max_length=64 \(data.excess_length=drop\)", r["reason"])
        for r in rejects
    )
    longest = max(int(r["reason"].split()[0]) for r in rejects)  # more than 5% cut: one warning line says so
    warning = (
        "warning: 2 of 22 records (9%) are longer than data.max_length=64 tokens and were {} (the longest: "
        f"{longest} tokens); raise data.max_length (to {longest} to keep every record whole)"
    )
    assert [line for line in said if line.startswith("warning:")] == [
        warning.format("truncated"),
        warning.format("dropped"),
    ]
    quiet: list[str] = []
    stage(DataConfig(source=path, max_length=1024, eval_ratio=0), tmp_path / "whole", tiny_model, quiet)
    assert not [line for line in quiet if line.startswith("warning:")]

    with pytest.raises(UserError) as info:
        stage(data.model_copy(update={"excess_length": "fail"}), tmp_path / "s", tiny_model)
    assert re.fullmatch(
        rf"{re.escape(path)}:21: \d+ tokens, longer than data.max_length=64; raise "
        r"data.max_length, or set data.excess_length=truncate \(or drop\)",
        str(info.value),
    )
    assert len(list((tmp_path / "s").glob("datasets/ds-*"))) == 2  # nothing left of the failed staging
    only_long = write_jsonl(tmp_path / "long.jsonl", [long_answer, long_prompt])
    with pytest.raises(UserError) as info:
        stage(
            DataConfig(source=only_long, max_length=64, eval_ratio=0, excess_length="drop"), tmp_path / "s", tiny_model
        )
    assert str(info.value) == (
        f"data.source {only_long}: no record of the train split could be tokenized; 2 dropped "
        "as longer than data.max_length=64 (data.excess_length=drop); raise data.max_length or set "
        "data.excess_length=truncate"
    )


def test_the_length_warning_says_why_the_setting_may_be_too_small_and_stays_quiet_at_5_percent() -> None:
    """The note of a real model at the default preset's length (pipeline.models.toy_length_note) ends the one line."""
    data = DataConfig(max_length=256)
    many = {
        "train": {"records": 90, "truncated": 9, "dropped": 0},
        "eval": {"records": 10, "truncated": 1, "dropped": 0},
    }
    note = "data.max_length=256 is the tiny-cpu preset's, sized for its built-in tiny model"
    assert length_warning(many, 912, data, note) == (
        "warning: 10 of 100 records (10%) are longer than data.max_length=256 tokens and were truncated (the longest: "
        f"912 tokens); raise data.max_length (to 912 to keep every record whole); {note}"
    )
    assert length_warning(many, 912, data, None) == length_warning(many, 912, data, note).removesuffix(f"; {note}")
    five = {"train": {"records": 100, "truncated": 5, "dropped": 0}}
    assert length_warning(five, 912, data, note) is None  # more than 5%, not 5% itself


def test_an_empty_result_is_an_error(tmp_path, tiny_model) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", [qwen(("user", "a")), qwen(("user", "b"))])
    with pytest.raises(UserError) as info:
        stage(DataConfig(source=path, on_invalid="skip"), tmp_path / "s", tiny_model)
    assert str(info.value) == (
        f"data.source {path}: no usable records (2 rejected; the first: {path}:1: no assistant turn)"
    )
    one = write_jsonl(tmp_path / "one.jsonl", arithmetic(1))
    with pytest.raises(
        UserError,
        match=r"the eval split is empty: no record fell into eval with "
        r"data.eval_ratio=0.1 \(1 records\)",
    ):
        stage(DataConfig(source=one), tmp_path / "s", tiny_model)
    assert not list((tmp_path / "s").glob("datasets/ds-*"))


def test_an_interrupted_staging_leaves_no_manifest_and_is_staged_again_cleanly(tmp_path, tiny_model, monkeypatch):
    data = DataConfig(source=str(SAMPLE), max_length=128, shard_rows=50)
    clean = stage(data, tmp_path / "clean", tiny_model)
    real_write = shards.write_bytes_atomic
    calls = []

    def crash_on_second_shard(url: str, body: bytes) -> None:
        calls.append(url)
        if len(calls) == 2:
            raise KeyboardInterrupt  # as if the process were stopped half way
        real_write(url, body)

    monkeypatch.setattr(shards, "write_bytes_atomic", crash_on_second_shard)
    with pytest.raises(KeyboardInterrupt):
        stage(data, tmp_path / "s", tiny_model)
    monkeypatch.undo()
    partial = tmp_path / "s" / "datasets" / clean.dataset_id
    assert (partial / "train" / "shard-00000.arrow").exists() and not (partial / "manifest.json").exists()
    (partial / "train" / "stray.arrow").write_bytes(b"left over")
    again = stage(data, tmp_path / "s", tiny_model)
    assert again.dataset_id == clean.dataset_id and not (partial / "train" / "stray.arrow").exists()
    assert (
        read_manifest(Location(again.url), SCHEMA)[0]["files"] == read_manifest(Location(clean.url), SCHEMA)[0]["files"]
    )


def test_a_damaged_staged_dataset_is_staged_again(tmp_path, tiny_model) -> None:
    data = DataConfig(source=str(SAMPLE), max_length=128)
    ref = stage(data, tmp_path, tiny_model)
    shard = Path(ref.url) / "eval" / "shard-00000.arrow"
    body = shard.read_bytes()
    shard.unlink()
    messages: list[str] = []
    stage(data, tmp_path, tiny_model, messages)
    assert any(m.startswith(f"dataset {ref.dataset_id} is damaged ({shard}: missing") for m in messages)
    assert shard.read_bytes() == body


def test_more_processes_stage_the_same_bytes(tmp_path, tiny_model, monkeypatch) -> None:
    monkeypatch.setattr(spool, "CHUNK_BYTES", 4096)  # many small chunks: enough work for real worker processes
    monkeypatch.setattr(workers, "MIN_CHUNKS_PER_WORKER", 1)
    data = DataConfig(source=str(SAMPLE), max_length=128, num_proc=1)
    one = stage(data, tmp_path / "one", tiny_model)
    messages: list[str] = []
    two = stage(data.model_copy(update={"num_proc": 2}), tmp_path / "two", tiny_model, messages)
    assert "tokenizing 240 records in 2 processes" in messages
    assert one.dataset_id == two.dataset_id
    assert read_manifest(Location(one.url), SCHEMA)[0]["files"] == read_manifest(Location(two.url), SCHEMA)[0]["files"]


def test_sha256_is_selectable(tmp_path, tiny_model) -> None:
    ref = stage(DataConfig(source=str(SAMPLE), digest_algorithm="sha256"), tmp_path, tiny_model)
    manifest, digest = read_manifest(Location(ref.url), SCHEMA)
    assert manifest["digest_algorithm"] == "sha256"
    assert digest == hashlib.sha256((Path(ref.url) / "manifest.json").read_bytes()).hexdigest()
    for entry in manifest["files"]:
        assert entry["digest"] == hashlib.sha256((Path(ref.url) / entry["path"]).read_bytes()).hexdigest()


def test_verification_names_the_file_and_the_digests(tmp_path, tiny_model) -> None:
    ref = stage(DataConfig(source=str(SAMPLE), max_length=128), tmp_path, tiny_model)
    manifest = verify_dataset(Location(ref.url), "full", ref.manifest_digest)
    entry = manifest["files"][0]
    shard = Path(ref.url) / entry["path"]
    body = bytearray(shard.read_bytes())
    body[100] ^= 0xFF
    shard.write_bytes(bytes(body))
    verify_dataset(Location(ref.url), "size")  # same size: the quick check cannot see it
    actual = blake3.blake3(bytes(body)).hexdigest()
    with pytest.raises(UserError) as info:
        verify_dataset(Location(ref.url), "full")
    assert str(info.value) == (
        f"{shard}: blake3 digest mismatch: expected {entry['digest']}, got {actual}; "
        "the file is corrupt or was modified, re-stage it"
    )
    shard.write_bytes(bytes(body) + b"x")
    with pytest.raises(UserError, match=rf"^{shard}: size {entry['size'] + 1} != expected {entry['size']}"):
        verify_dataset(Location(ref.url), "size")
    shard.unlink()
    with pytest.raises(UserError, match=rf"^{shard}: missing \(listed in manifest.json\)"):
        verify_dataset(Location(ref.url), "size")
    with pytest.raises(UserError, match=r"manifest.json: digest mismatch: expected 00ff, got "):
        verify_dataset(Location(ref.url), "size", manifest_digest="00ff")
