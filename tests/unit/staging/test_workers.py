"""Tokenizing the spool's chunks: as many processes as the work is worth, results in spool order however the workers
finish, and each chunk's rejects and dropped records named by their locations."""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor

import orjson

from staging.spool import SpoolWriter, spool_line
from staging.tokenize import EncoderSettings
from staging.workers import MIN_CHUNKS_PER_WORKER, encode_chunks, in_order, worker_count


def test_workers_are_num_proc_or_the_cores_but_never_more_than_the_work_is_worth() -> None:
    cores = len(os.sched_getaffinity(0))
    assert worker_count(8, 8 * MIN_CHUNKS_PER_WORKER) == 8
    assert worker_count(8, 2 * MIN_CHUNKS_PER_WORKER) == 2
    assert worker_count(0, 1000 * MIN_CHUNKS_PER_WORKER) == cores
    assert worker_count(4, 1) == 1


def test_results_come_in_the_order_of_the_calls_whoever_finishes_first() -> None:
    def slow_first(index: int) -> int:
        time.sleep(0.05 * (5 - index % 5))  # the earlier a call, the later it finishes
        return index

    with ThreadPoolExecutor(3) as pool:
        assert list(in_order(pool, 3, slow_first, ((i,) for i in range(12)))) == list(range(12))


def test_a_chunks_rejects_and_dropped_records_keep_their_locations(tiny_model, tmp_path) -> None:
    def chat(answer: str) -> dict:
        return {"messages": [{"role": "user", "content": "Say it."}, {"role": "assistant", "content": answer}]}

    records = [("a.jsonl:1", chat("short")), ("a.jsonl:2", chat("long " * 200)), ("a.jsonl:3", chat("ok"))]
    lines = [spool_line(location, orjson.dumps(record)) for location, record in records]
    writer = SpoolWriter(tmp_path / "spool", chunk_bytes=10**6)
    writer.add_lines(b"".join(lines), [len(line) for line in lines])
    [chunk] = writer.close()
    settings = EncoderSettings(tiny_model, max_length=64, excess_length="drop")
    [result] = list(encode_chunks(tmp_path / "spool", [chunk], settings, workers=1))
    assert result.batch.kept.tolist() == [0, 2] and result.rejects == []
    [(index, dropped)] = result.dropped
    assert index == 1 and dropped.location == "a.jsonl:2" and "longer than data.max_length=64" in dropped.reason
