"""The dataset shards: the writer (tokenized examples -> Parquet shards of at most `shard_rows` examples, digested
from the bytes written) and the reader (`load_split`).

Columns: `input_ids` and `labels` (list<int32>, same length, -100 where a token is not a target) and
`length` (int32, for length-grouped batching). A shard is encoded in memory, digested, and written under
its final name atomically; the manifest that lists it is written after every shard (by the caller).
"""

from __future__ import annotations

import io
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from storage import layout
from storage.digest import digest_bytes
from storage.fs import join, read_bytes, write_bytes_atomic
from storage.manifest import read_manifest

IGNORE_INDEX = -100  # a label that is not a target (Hugging Face's convention)
Example = tuple[list[int], list[int]]

SHARD_SCHEMA = pa.schema([("input_ids", pa.list_(pa.int32())), ("labels", pa.list_(pa.int32())),
                          ("length", pa.int32())])
FileEntry = dict[str, Any]


class SplitWriter:
    """Collects one split's examples and writes them as shards, counting records, tokens and targets."""

    def __init__(self, base: str, split: str, shard_rows: int, algorithm: str,
                 on_write: Callable[[FileEntry], None]) -> None:
        self.base, self.split, self.shard_rows, self.algorithm = base, split, shard_rows, algorithm
        self.on_write = on_write
        self.files: list[FileEntry] = []
        self.counts = {"records": 0, "tokens": 0, "target_tokens": 0, "truncated": 0}
        self._ids: list[np.ndarray] = []
        self._labels: list[np.ndarray] = []
        self._lengths: list[np.ndarray] = []
        self._rows = 0
        self.seconds = 0.0  # spent encoding, digesting and writing shards

    def add(self, ids: np.ndarray, labels: np.ndarray, lengths: np.ndarray, truncated: np.ndarray) -> None:
        """Append examples (flat ids and labels, one length per example)."""
        if not len(lengths):
            return
        self._ids.append(ids)
        self._labels.append(labels)
        self._lengths.append(lengths)
        self._rows += len(lengths)
        starts = np.concatenate(([0], np.cumsum(lengths[:-1], dtype=np.int64)))
        targets = labels != IGNORE_INDEX
        # Predicted positions: labels after the shift, so an example's first label never counts.
        self.counts["target_tokens"] += int(targets.sum()) - int(targets[starts].sum())
        self.counts["records"] += len(lengths)
        self.counts["tokens"] += int(lengths.sum())
        self.counts["truncated"] += int(truncated.sum())
        while self._rows >= self.shard_rows:
            self._flush(self.shard_rows)

    def close(self) -> list[FileEntry]:
        """Write what is left; returns the entries of every shard written."""
        if self._rows:
            self._flush(self._rows)
        return self.files

    def _flush(self, rows: int) -> None:
        ids, labels, lengths = (np.concatenate(parts) for parts in (self._ids, self._labels, self._lengths))
        tokens = int(lengths[:rows].sum())
        self._write(ids[:tokens], labels[:tokens], lengths[:rows])
        rest = rows < len(lengths)
        self._ids, self._labels, self._lengths = ([ids[tokens:]], [labels[tokens:]], [lengths[rows:]]) if rest \
            else ([], [], [])
        self._rows = len(lengths) - rows

    def _write(self, ids: np.ndarray, labels: np.ndarray, lengths: np.ndarray) -> None:
        started = time.monotonic()
        offsets = pa.array(np.concatenate(([0], np.cumsum(lengths, dtype=np.int64))).astype(np.int32))
        table = pa.Table.from_arrays(
            [pa.ListArray.from_arrays(offsets, pa.array(ids)), pa.ListArray.from_arrays(offsets, pa.array(labels)),
             pa.array(lengths)],
            schema=SHARD_SCHEMA,
        )
        buffer = io.BytesIO()
        pq.write_table(table, buffer, compression="zstd")
        data = buffer.getvalue()
        relpath = layout.shard_name(self.split, len(self.files))
        write_bytes_atomic(join(self.base, relpath), data)
        entry = {"path": relpath, "size": len(data), "digest": digest_bytes(data, self.algorithm)}
        self.files.append(entry)
        self.seconds += time.monotonic() - started
        self.on_write(entry)


def load_split(dataset_url: str, split: str) -> list[Example]:
    """Every (input_ids, labels) example of a split, in manifest order."""
    manifest, _ = read_manifest(dataset_url, layout.DATASET_SCHEMA)
    examples: list[Example] = []
    for entry in manifest["files"]:
        if not entry["path"].startswith(f"{split}/"):
            continue
        table = pq.read_table(pa.BufferReader(read_bytes(join(dataset_url, entry["path"]))))
        examples.extend(zip(table.column("input_ids").to_pylist(), table.column("labels").to_pylist(), strict=True))
    return examples
