"""The spool: records written once as lines (location, canonical JSON), cut into chunks of about a size, and read back
chunk by chunk in any process, the same records in the same order."""

from __future__ import annotations

import orjson

from staging.spool import SpoolWriter, read_chunk, spool_line


def test_records_come_back_chunk_by_chunk_in_order(tmp_path) -> None:
    records = [(f"data.jsonl:{i}", {"messages": [{"role": "user", "content": "x" * i}]}) for i in range(1, 41)]
    lines = [spool_line(location, orjson.dumps(record)) for location, record in records]
    writer = SpoolWriter(tmp_path / "spool", chunk_bytes=400)
    writer.add_lines(b"".join(lines[:25]), [len(line) for line in lines[:25]])
    writer.add_lines(b"".join(lines[25:]), [len(line) for line in lines[25:]])
    chunks = writer.close()
    assert len(chunks) > 3 and chunks[0].start == 0 and chunks[-1].end == sum(map(len, lines))
    assert [c.first for c in chunks] == [sum(c.count for c in chunks[:i]) for i in range(len(chunks))]
    assert all(c.end - c.start >= 400 for c in chunks[:-1])  # cut once a chunk reached the size
    assert [item for chunk in chunks for item in read_chunk(tmp_path / "spool", chunk)] == records


def test_a_location_with_a_tab_stays_one_line() -> None:
    line = spool_line("dir\twith tab/data.jsonl:3", b'{"text":"a"}')
    assert line.count(b"\n") == 1 and line.split(b"\t", 1)[0] == b'"dir\\twith tab/data.jsonl:3"'
