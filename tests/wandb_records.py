"""Read a W&B run file (`run-*.wandb`, what `WANDB_MODE=offline` leaves) back: W&B's `Record` protobufs in
LevelDB's log format (a 7-byte file header, 32 KiB blocks, each record as chunks of checksum, length, type), as
W&B's own data store writes it. Only for the tests: W&B's Python package no longer ships a reader."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path

HEADER = 7  # b":W&B", magic 0xBEE1, version
BLOCK = 32 * 1024
CHUNK = 7  # crc32 (4), length (2), type (1)
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: Path) -> Iterator:
    """Every `Record` in a .wandb file, in order."""
    from wandb.proto.wandb_internal_pb2 import Record

    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path}: not a W&B run file"
    pos, pending = HEADER, b""
    while pos + CHUNK <= len(data):
        left = BLOCK - pos % BLOCK
        if left < CHUNK:  # the block's tail is padding
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + CHUNK])
        if kind == 0 and length == 0:
            pos += left
            continue
        payload = data[pos + CHUNK : pos + CHUNK + length]
        pos += CHUNK + length
        if kind in (FULL, FIRST):
            pending = payload
        else:
            pending += payload
        if kind in (FULL, LAST):
            record = Record()
            record.ParseFromString(pending)
            yield record


def finished(path: Path, timeout_s: float = 60.0) -> list:
    """The file's records once they end with the run's exit record: W&B's service writes the file after `finish()`
    returns (a moment later, longer on a loaded machine), so a reader right after it may find only the header."""
    import time

    deadline = time.monotonic() + timeout_s
    while True:
        found = list(records(path)) if path.stat().st_size > HEADER else []
        if any(record.WhichOneof("record_type") == "exit" for record in found) or time.monotonic() > deadline:
            return found
        time.sleep(0.2)


def history(path: Path) -> list[dict]:
    """The logged rows: {"_step": step, key: value, ...} per `run.log` call, once the run's file is finished."""
    import json

    rows = []
    for record in finished(path):
        if record.WhichOneof("record_type") == "history":
            rows.append(
                {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
            )
    return rows
