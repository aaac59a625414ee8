"""A local spool of normalized records, written while reading and read back in chunks by the tokenizer
processes: the records are parsed and validated once, and nothing but byte ranges crosses process bounds.

One line per record: the JSON-encoded location, a tab, and the record's canonical JSON (the bytes its
digest is taken of). JSON escapes tabs and newlines inside strings, so both separators are unambiguous.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import orjson

from staging.formats import Conversation

CHUNK_BYTES = 1024 * 1024


@dataclass(frozen=True)
class Chunk:
    """Records [first, first + count) of the spool, stored in bytes [start, end)."""

    start: int
    end: int
    first: int
    count: int


def spool_line(location: str, canonical: bytes) -> bytes:
    """One record's line of the spool."""
    return orjson.dumps(location) + b"\t" + canonical + b"\n"


class SpoolWriter:
    """Appends records to a spool file and cuts it into chunks of about `chunk_bytes`."""

    def __init__(self, path: Path, chunk_bytes: int | None = None) -> None:
        self.path = path
        self.chunk_bytes = chunk_bytes or CHUNK_BYTES
        self.chunks: list[Chunk] = []
        self._handle = open(path, "wb")  # noqa: SIM115 - closed by close()
        self._offset = self._chunk_start = 0
        self._records = self._chunk_first = 0

    def add_lines(self, lines: bytes, sizes: list[int]) -> None:
        """Append records already made into spool lines (spool_line; `sizes`: each one's bytes), cut into the same
        chunks as one by one."""
        self._handle.write(lines)
        for size in sizes:
            self._offset += size
            self._records += 1
            if self._offset - self._chunk_start >= self.chunk_bytes:
                self._cut()

    def _cut(self) -> None:
        if self._records > self._chunk_first:
            self.chunks.append(
                Chunk(self._chunk_start, self._offset, self._chunk_first, self._records - self._chunk_first)
            )
        self._chunk_start, self._chunk_first = self._offset, self._records

    def close(self) -> list[Chunk]:
        """Finish the file; returns its chunks."""
        self._cut()
        self._handle.close()
        return self.chunks


def read_chunk(path: Path, chunk: Chunk) -> list[tuple[str, Conversation]]:
    """(location, conversation) of every record in a chunk."""
    with open(path, "rb") as handle:
        handle.seek(chunk.start)
        data = handle.read(chunk.end - chunk.start)
    out = []
    for line in data.splitlines():
        location, _, body = line.partition(b"\t")
        out.append((orjson.loads(location), orjson.loads(body)))
    assert len(out) == chunk.count, "spool chunk does not hold the records it was cut for"
    return out
