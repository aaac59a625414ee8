"""Pass one (parse, validate, digest) in data.num_proc processes stages the same bytes as in one, and keeps every
bad record's `file:line`."""

from __future__ import annotations

import json
from pathlib import Path

from config.schema import DataConfig
from storage.manifest import read_manifest
from tasks.data import firstpass, workers
from tasks.data.stage import stage_dataset
from tests.datafiles import write_json

SAMPLE = Path(__file__).resolve().parents[2] / "data" / "sample" / "conversations.json"


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
    staged, said = {}, {}
    for processes in (1, 2):
        said[processes] = []
        staged[processes] = stage_dataset(data.model_copy(update={"num_proc": processes}),
                                          str(tmp_path / f"s{processes}"), tiny_model,
                                          progress=said[processes].append, bars=False)
    assert "reading 2 files in 1 process" in said[1] and "reading 2 files in 2 processes" in said[2]
    one, two = staged[1], staged[2]
    assert one.dataset_id == two.dataset_id
    manifest = read_manifest(one.url, "tandem.dataset/1")[0]
    assert manifest["files"] == read_manifest(two.url, "tandem.dataset/1")[0]["files"]
    assert manifest["records"] == {"read": 242, "staged": 240, "rejected": 2}
    rejects = [json.loads(line) for line in (Path(one.url) / "rejects.jsonl").read_text().splitlines()]
    assert [r["location"] for r in rejects] == [f"{source / 'a.jsonl'}:42", f"{source / 'a.jsonl'}:121"]
    assert (Path(one.url) / "rejects.jsonl").read_bytes() == (Path(two.url) / "rejects.jsonl").read_bytes()
