"""The per-record work of pass one (parse, map, validate, normalize, canonical form, digest) in `data.num_proc`
processes, with the results put back in file order: the spool, the digests and the rejects are the bytes one
process writes.

Plain (uncompressed) JSON Lines files are cut at line ends into blocks of about BLOCK_BYTES; this process only
reads (large ranged reads, retried each) and counts each block's newlines, so a worker knows the number of its
first line and locations stay `path:line`. A worker parses its block, renames each record by the source's column
and tag mapping, checks it, and returns the spool lines of the records it kept with their digests, and its
rejects (the same `file:line` reasons as in one process). Compressed files (read as one decompressed stream),
JSON arrays and Parquet files are read here and their records digested in this process, in batches.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field

import blake3
import orjson

from staging.records import DataFile, Reading, Record, Reject, to_item
from staging.sources import ByteCounter, compression, file_kind, parse_line
from staging.spool import spool_line
from staging.workers import in_order
from storage.fs import read_range
from storage.location import Location

BLOCK_BYTES = 1024 * 1024  # a worker's unit of work
READ_BYTES = 8 * 1024 * 1024  # one ranged read
ITEMS_PER_BATCH = 4096  # records of a file read in this process digested at a time
DIGEST_BYTES = 32


@dataclass
class Digested:
    """Records made ready for the spool, in order: their spool lines (one blob) and each line's size, their
    digests (one blob), and the rejects among them, each with the number of records kept before it. Blobs, so that
    a worker's result crosses the process bound, and goes to the spool, in a few large pieces."""

    lines: bytes = b""
    sizes: list[int] = field(default_factory=list)
    digests: bytes = b""
    rejects: list[tuple[int, Reject]] = field(default_factory=list)
    images: dict[str, Location] = field(default_factory=dict)  # the images the records name: where each was read
    named: list[tuple[str, ...]] = field(default_factory=list)  # each record's image names

    @property
    def count(self) -> int:
        """Records kept."""
        return len(self.sizes)

    def digest_list(self) -> list[bytes]:
        """Each record's digest, in order."""
        return [self.digests[i : i + DIGEST_BYTES] for i in range(0, len(self.digests), DIGEST_BYTES)]

    def runs(self) -> Iterator[Digested | Reject]:
        """The records in runs between the rejects, and the rejects, in file order."""
        offsets = list(itertools.accumulate(self.sizes, initial=0))
        first = 0
        for position, reject in self.rejects:
            if position > first:
                yield self._part(offsets, first, position)
            yield reject
            first = position
        if first < self.count:
            yield self._part(offsets, first, self.count)

    def singles(self) -> Iterator[Digested]:
        """Each record alone (a run without rejects), for what counts records one by one (caps, interleave)."""
        offsets = list(itertools.accumulate(self.sizes, initial=0))
        return (self._part(offsets, index, index + 1) for index in range(self.count))

    def _part(self, offsets: list[int], first: int, stop: int) -> Digested:
        named = self.named[first:stop] if self.named else []
        return Digested(
            self.lines[offsets[first] : offsets[stop]],
            self.sizes[first:stop],
            self.digests[first * DIGEST_BYTES : stop * DIGEST_BYTES],
            images={name: self.images[name] for names in named for name in names},
            named=named,
        )


@dataclass(frozen=True)
class Block:
    """Whole lines of a JSON Lines file, the first of them line `first_line`, read as the file is (its format, the
    source's mapping, data.preference)."""

    url: Location
    reading: Reading
    data: bytes
    first_line: int


def canonical(record: Record) -> bytes:
    """The bytes a record's digest is taken of: its normalized form as sorted-key JSON."""
    return orjson.dumps(record.conversation, option=orjson.OPT_SORT_KEYS)


def digest_items(items: Iterable[Record | Reject]) -> Digested:
    """Canonical form, digest and spool line of every record; rejects kept apart, with their places."""
    out = Digested()
    lines, digests = bytearray(), bytearray()
    for item in items:
        if isinstance(item, Reject):
            out.rejects.append((len(out.sizes), item))
            continue
        body = canonical(item)
        out.images.update(item.images)
        out.named.append(tuple(item.images))
        line = spool_line(item.location, body)
        lines += line
        out.sizes.append(len(line))
        digests += blake3.blake3(body).digest()
    out.lines, out.digests = bytes(lines), bytes(digests)
    return out


def scan_block(block: Block) -> Digested:
    """Parse, map, validate and digest one block of lines (in a worker)."""
    lines = block.data.split(b"\n")
    if block.data.endswith(b"\n"):
        lines.pop()
    parsed = (parse_line(block.url, number, line) for number, line in enumerate(lines, start=block.first_line))
    return digest_items(to_item(location, value, block.reading) for location, value in filter(None, parsed))


def blocks(url: Location, reading: Reading, on_bytes: ByteCounter) -> Iterator[Block]:
    """A JSON Lines file as blocks of whole lines, in order, each with the number of its first line."""
    rest, offset, line = b"", 0, 1
    while data := read_range(url, offset, offset + READ_BYTES):
        offset += len(data)
        on_bytes(len(data))
        data = rest + data
        end = data.rfind(b"\n") + 1
        rest, start = data[end:], 0
        while start < end:
            stop = data.find(b"\n", min(start + BLOCK_BYTES, end) - 1) + 1
            yield Block(url, reading, data[start:stop], line)
            line += data.count(b"\n", start, stop)
            start = stop
    if rest:
        yield Block(url, reading, rest, line)


def splittable(url: Location) -> bool:
    """Whether a file is read in blocks by the workers: uncompressed JSON Lines (a record per line). A compressed
    file's bytes cannot be cut at line ends without decompressing it, so it is read as one stream here."""
    return file_kind(url) == "jsonl" and compression(url.url) is None


def digest_file(
    data_file: DataFile, on_bytes: ByteCounter, pool: ProcessPoolExecutor | None, workers: int
) -> Iterator[Digested | Reject]:
    """A data file's records made ready for the spool, in runs between its rejects, and the rejects, in order:
    JSON Lines block by block (by the pool's workers when there is a pool), other files' records in batches in
    this process."""
    if splittable(data_file.url) and data_file.reason != "empty file":
        calls = ((block,) for block in blocks(data_file.url, data_file.reading, on_bytes))
        parts = in_order(pool, workers, scan_block, calls) if pool else (scan_block(*call) for call in calls)
    else:
        items = iter(data_file.items)
        parts = (digest_items(batch) for batch in iter(lambda: list(itertools.islice(items, ITEMS_PER_BATCH)), []))
    for part in parts:
        yield from part.runs()
