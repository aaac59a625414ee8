"""The per-record work of pass one (parse, validate, normalize, canonical form, digest) in `data.num_proc`
processes, with the results put back in file order: the spool, the digests and the rejects are the bytes one
process writes.

JSON Lines files are cut at line ends into blocks of about BLOCK_BYTES; this process only reads (large ranged
reads, retried each) and counts each block's newlines, so a worker knows the number of its first line and
locations stay `path:line`. A worker parses and checks its block and returns the spool lines of the records it
kept, their digests (as the records hash takes them) and splits, and its rejects. JSON arrays and Parquet files (one document, row groups) are read here and
their records digested in this process.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field

import blake3
import orjson

from storage.fs import read_range
from tasks.data.identity import in_eval
from tasks.data.records import DataFile, Record, Reject, to_item
from tasks.data.sources import ByteCounter, file_kind, parse_line
from tasks.data.spool import spool_line
from tasks.data.workers import in_order

BLOCK_BYTES = 1024 * 1024  # a worker's unit of work
READ_BYTES = 8 * 1024 * 1024  # one ranged read
ITEMS_PER_BATCH = 4096  # records of a JSON array or Parquet file digested at a time
EVAL, TRAIN = 1, 0


@dataclass(frozen=True)
class Origin:
    """What a record's digest and split depend on besides its content: the source's role (`s`: data.source,
    `e`: data.eval_source) and the split settings."""

    role: bytes
    eval_ratio: float
    explicit_eval: bool  # data.eval_source is set: data.source all trains

    def split(self, digest: bytes) -> int:
        """EVAL or TRAIN for a record of this origin."""
        if self.role == b"e":
            return EVAL
        return EVAL if not self.explicit_eval and in_eval(digest, self.eval_ratio) else TRAIN


@dataclass
class Digested:
    """Records made ready for the spool, in order: their spool lines (one blob) and each line's size, the
    records hash's input (role + digest of each), each one's split, and the rejects among them. Blobs, so that a
    worker's result crosses the process bound in a few large pieces."""

    lines: bytes = b""
    sizes: list[int] = field(default_factory=list)
    keys: bytes = b""
    splits: bytes = b""
    rejects: list[Reject] = field(default_factory=list)

    @property
    def count(self) -> int:
        """Records kept."""
        return len(self.sizes)


@dataclass(frozen=True)
class Block:
    """Whole lines of a JSON Lines file, the first of them line `first_line`, in format `fmt`."""

    url: str
    fmt: str
    data: bytes
    first_line: int
    origin: Origin


def canonical(record: Record) -> bytes:
    """The bytes a record's digest is taken of: its normalized form as sorted-key JSON."""
    return orjson.dumps(record.conversation, option=orjson.OPT_SORT_KEYS)


def digest_items(items: Iterable[Record | Reject], origin: Origin) -> Digested:
    """Canonical form, digest, split and spool line of every record; rejects kept apart, in order."""
    out = Digested()
    lines, keys, splits = bytearray(), bytearray(), bytearray()
    for item in items:
        if isinstance(item, Reject):
            out.rejects.append(item)
            continue
        body = canonical(item)
        line = spool_line(item.location, body)
        lines += line
        out.sizes.append(len(line))
        digest = blake3.blake3(body).digest()
        keys += origin.role + digest
        splits.append(origin.split(digest))
    out.lines, out.keys, out.splits = bytes(lines), bytes(keys), bytes(splits)
    return out


def scan_block(block: Block) -> Digested:
    """Parse, validate and digest one block of lines (in a worker)."""
    lines = block.data.split(b"\n")
    if block.data.endswith(b"\n"):
        lines.pop()
    parsed = (parse_line(block.url, number, line) for number, line in enumerate(lines, start=block.first_line))
    return digest_items((to_item(location, value, block.fmt) for location, value in filter(None, parsed)),
                        block.origin)


def blocks(url: str, fmt: str, origin: Origin, on_bytes: ByteCounter) -> Iterator[Block]:
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
            yield Block(url, fmt, data[start:stop], line, origin)
            line += data.count(b"\n", start, stop)
            start = stop
    if rest:
        yield Block(url, fmt, rest, line, origin)


def splittable(url: str) -> bool:
    """Whether a file is read in blocks by the workers: JSON Lines (a record per line)."""
    return file_kind(url) == "jsonl"


def digest_file(data_file: DataFile, origin: Origin, on_bytes: ByteCounter, pool: ProcessPoolExecutor | None,
                workers: int) -> Iterator[Digested]:
    """A data file's records digested, in order: JSON Lines block by block (by the pool's workers when there is
    a pool), other files' records in batches in this process."""
    if splittable(data_file.url):
        calls = ((block,) for block in blocks(data_file.url, data_file.format, origin, on_bytes))
        return in_order(pool, workers, scan_block, calls) if pool else (scan_block(*call) for call in calls)
    items = iter(data_file.items)
    return (digest_items(batch, origin) for batch in iter(lambda: list(itertools.islice(items, ITEMS_PER_BATCH)), []))
