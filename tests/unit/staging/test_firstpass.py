"""Pass one (parse, validate, digest) in data.num_proc processes stages the same bytes as in one, and keeps every
bad record's `file:line`: a JSON Lines file is cut into blocks of whole lines, each numbered as the file."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import blake3

from config.sections.run_data import DataConfig
from staging import firstpass, workers
from staging.stage import stage_dataset
from storage.location import Location
from storage.manifest import read_manifest
from tests.datafiles import SAMPLE, write_json


def stage_in_one_and_two_processes(data: DataConfig, tmp_path: Path, model: str) -> tuple[dict, dict]:
    """The datasets staged with data.num_proc 1 and 2, and what each said, by number of processes."""
    staged, said = {}, {}
    for processes in (1, 2):
        said[processes] = []
        staged[processes] = stage_dataset(
            data.model_copy(update={"num_proc": processes}),
            Location(str(tmp_path / f"s{processes}")),
            model,
            progress=said[processes].append,
            bars=False,
        )
    return staged, said


def test_one_and_two_processes_stage_the_same_bytes(tmp_path, tiny_model, monkeypatch) -> None:
    # Blocks of 2 KB read 8 KB at a time: many blocks, cut inside reads and across them, for real worker processes.
    monkeypatch.setattr(firstpass, "BLOCK_BYTES", 2048)
    monkeypatch.setattr(firstpass, "READ_BYTES", 8192)
    monkeypatch.setattr(workers, "MIN_CHUNKS_PER_WORKER", 1)
    records = json.loads(SAMPLE.read_text())
    lines = [json.dumps(r) for r in records[:200]]
    lines[40:40] = ["", "{not json"]  # lines 41 (blank) and 42
    lines[120:120] = [json.dumps({"conversations": [{"from": "user", "value": "no answer"}]})]  # line 121
    source = tmp_path / "data"
    source.mkdir()
    (source / "a.jsonl").write_bytes(b"\xef\xbb\xbf" + "\n".join(lines).encode())  # a BOM, no final newline
    write_json(source / "b.json", records[200:])  # a JSON array beside it: read in this process
    data = DataConfig(source=str(source), max_length=128, on_invalid="skip", num_proc=1)
    staged, said = stage_in_one_and_two_processes(data, tmp_path, tiny_model)
    assert "reading 2 files in 1 process" in said[1] and "reading 2 files in 2 processes" in said[2]
    one, two = staged[1], staged[2]
    assert one.dataset_id == two.dataset_id
    manifest = read_manifest(Location(one.url), "tandem.dataset/1")[0]
    assert manifest["files"] == read_manifest(Location(two.url), "tandem.dataset/1")[0]["files"]
    assert manifest["records"] == {"read": 242, "staged": 240, "rejected": 2, "dropped": 0, "undesirable": 0}
    rejects = [json.loads(line) for line in (Path(one.url) / "rejects.jsonl").read_text().splitlines()]
    assert [r["location"] for r in rejects] == [f"{source / 'a.jsonl'}:42", f"{source / 'a.jsonl'}:121"]
    assert (Path(one.url) / "rejects.jsonl").read_bytes() == (Path(two.url) / "rejects.jsonl").read_bytes()


def test_mapped_compressed_and_mixed_sources_stage_the_same_bytes_in_two_processes(
    tmp_path, tiny_model, monkeypatch
) -> None:
    # Workers map columns and tags as one process does, and name the user's keys in the same file:line rejects; a
    # compressed file is read as one stream (never cut into blocks) and digested as stored.
    monkeypatch.setattr(firstpass, "BLOCK_BYTES", 2048)
    monkeypatch.setattr(firstpass, "READ_BYTES", 8192)
    monkeypatch.setattr(workers, "MIN_CHUNKS_PER_WORKER", 1)
    qa = [{"question": f"{i} + {i}?", "answer": str(2 * i)} for i in range(150)]
    qa[70]["answer"] = 7  # line 71: not a string
    chats = [
        {"conversations": [{"role": "user", "content": f"say {i}"}, {"role": "bot", "content": str(i)}]}
        for i in range(400)
    ]
    chats[30]["conversations"][1]["role"] = "robot"  # line 31: an unknown role
    (tmp_path / "qa.jsonl").write_text("".join(json.dumps(r) + "\n" for r in qa))
    (tmp_path / "chats.jsonl").write_text("".join(json.dumps(r) + "\n" for r in chats))
    plain = "".join(json.dumps(r) + "\n" for r in json.loads(SAMPLE.read_text())[:120]).encode()
    half = len(plain) // 2
    (tmp_path / "sample.jsonl.gz").write_bytes(gzip.compress(plain[:half]) + gzip.compress(plain[half:]))
    assert not firstpass.splittable(Location(str(tmp_path / "sample.jsonl.gz")))
    assert firstpass.splittable(Location(str(tmp_path / "qa.jsonl")))
    data = DataConfig(
        sources=[
            {
                "source": str(tmp_path / "qa.jsonl"),
                "format": "alpaca",
                "columns": {"prompt": "question", "response": "answer"},
            },
            {
                "source": str(tmp_path / "chats.jsonl"),
                "format": "sharegpt",
                "weight": 2,
                "max_records": 350,
                "tags": {"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "bot"},
            },
            {"source": str(tmp_path / "sample.jsonl.gz"), "weight": 0.5},
        ],
        mix="interleave",
        max_length=128,
        on_invalid="skip",
    )
    staged, said = stage_in_one_and_two_processes(data, tmp_path, tiny_model)
    assert "reading 3 files in 2 processes" in said[2]
    one, two = staged[1], staged[2]
    assert one.dataset_id == two.dataset_id
    manifest = read_manifest(Location(one.url), "tandem.dataset/1")[0]
    assert manifest["files"] == read_manifest(Location(two.url), "tandem.dataset/1")[0]["files"]
    assert manifest["mix"] == read_manifest(Location(two.url), "tandem.dataset/1")[0]["mix"]
    rejects = [json.loads(line) for line in (Path(one.url) / "rejects.jsonl").read_text().splitlines()]
    assert [r["location"] for r in rejects] == [f"{tmp_path / 'chats.jsonl'}:31", f"{tmp_path / 'qa.jsonl'}:71"]
    assert "answer (column response)" in rejects[1]["reason"]
    assert (Path(one.url) / "rejects.jsonl").read_bytes() == (Path(two.url) / "rejects.jsonl").read_bytes()
    gz = next(s for s in manifest["sources"] if s["url"].endswith(".gz"))
    assert gz["digest"] == blake3.blake3((tmp_path / "sample.jsonl.gz").read_bytes()).hexdigest()


def test_a_jsonl_file_is_cut_into_blocks_of_whole_lines_numbered_as_the_file(tmp_path, monkeypatch) -> None:
    from staging import firstpass
    from staging.mapping import Mapping
    from staging.records import Reading, Record, Reject
    from storage.location import Location

    lines = [json.dumps({"text": f"line {n} " + "x" * (n % 7)}) for n in range(1, 201)]
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(lines))  # no newline after the last line
    monkeypatch.setattr(firstpass, "BLOCK_BYTES", 300)
    monkeypatch.setattr(firstpass, "READ_BYTES", 1000)
    reading = Reading("text", Mapping("text"), "refuse")
    read: list[int] = []
    blocks = list(firstpass.blocks(Location(str(path)), reading, read.append))
    assert len(blocks) > 10 and sum(read) == path.stat().st_size
    assert b"".join(block.data for block in blocks) == path.read_bytes()
    for block in blocks:
        assert block.data.startswith(b'{"text": "line ' + str(block.first_line).encode() + b" ")
    parts = firstpass.scan_block(blocks[0])
    assert parts.count == blocks[1].first_line - 1 and not parts.rejects
    broken = firstpass.Block(Location(str(path)), reading, b'{"text": "a"}\nnot json\n{"text": "b"}\n', 41)
    runs = list(firstpass.scan_block(broken).runs())
    assert [type(run).__name__ for run in runs] == ["Digested", "Reject", "Digested"]
    assert isinstance(runs[1], Reject) and runs[1].location == f"{path}:42"
    assert not isinstance(runs[0], Record) and runs[0].count == runs[2].count == 1
