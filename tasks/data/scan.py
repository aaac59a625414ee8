"""Pass one of staging: read every source file, normalize and validate its records, digest each one,
decide its split, and spool it for the tokenizer. Nothing is dropped silently: every record is either
spooled or a `Reject` with its location and reason (`on_invalid: fail` stops at the first one).
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import blake3
import orjson

from config.errors import UserError
from config.schema import DataConfig
from tasks.data.identity import SourceFile, in_eval
from tasks.data.progress import Reporter
from tasks.data.records import Record, Reject, open_file
from tasks.data.spool import Chunk, SpoolWriter

EVAL, TRAIN = 1, 0
MAX_FILE_LINES = 50  # one log line per source file up to this many files, a summary beyond


@dataclass
class Scan:
    """The spooled records (in chunks), each one's split, the rejects and per-source counts."""

    chunks: list[Chunk]
    splits: bytearray  # EVAL or TRAIN per spooled record
    records_digest: str
    rejects: list[Reject] = field(default_factory=list)
    sources: list[dict[str, Any]] = field(default_factory=list)

    @property
    def spooled(self) -> int:
        """Records that passed validation."""
        return len(self.splits)


def canonical(record: Record) -> bytes:
    """The bytes a record's digest is taken of: its normalized form as sorted-key JSON."""
    return orjson.dumps(record.conversation, option=orjson.OPT_SORT_KEYS)


def scan_sources(files: list[SourceFile], data: DataConfig, spool: Path, reporter: Reporter) -> Scan:
    """Read, validate, digest and spool every record of every file, in order."""
    writer = SpoolWriter(spool)
    splits = bytearray()
    records_hash = blake3.blake3()
    rejects: list[Reject] = []
    sources: list[dict[str, Any]] = []
    with reporter.phase("reading", sum(f.size for f in files), "B") as phase:
        for source in files:
            data_file = open_file(source.url, data.format, phase.update)
            role = b"e" if source.key == "data.eval_source" else b"s"
            kept = rejected = 0
            for item in data_file.items:
                if isinstance(item, Reject):
                    if data.on_invalid == "fail":
                        raise item.error()
                    rejects.append(item)
                    rejected += 1
                    continue
                body = canonical(item)
                digest = blake3.blake3(body).digest()
                records_hash.update(role + digest)
                splits.append(EVAL if role == b"e" or (not data.eval_source and in_eval(digest, data.eval_ratio))
                              else TRAIN)
                writer.add(item.location, body)
                kept += 1
            if len(files) <= MAX_FILE_LINES:
                reporter.info(f"{source.url}: {data_file.format} ({data_file.reason}), {kept} records"
                              + (f", {rejected} rejected" if rejected else ""))
            sources.append({"url": source.url, "size": source.size, "digest": source.digest,
                            "format": data_file.format, "key": source.key, "records": kept, "rejected": rejected})
    if len(files) > MAX_FILE_LINES:
        formats = collections.Counter(s["format"] for s in sources)
        reporter.info(f"{len(files)} files: " + ", ".join(f"{n} {fmt}" for fmt, n in sorted(formats.items())))
    scan = Scan(writer.close(), splits, records_hash.hexdigest(), rejects, sources)
    check_splits(scan, data)
    return scan


def check_splits(scan: Scan, data: DataConfig) -> None:
    """An empty result, or an empty split that the settings ask for, is an error that says what to change."""
    if not scan.spooled:
        first = f"; the first: {scan.rejects[0].location}: {scan.rejects[0].reason}" if scan.rejects else ""
        raise UserError(f"data.source {data.source}: no usable records ({len(scan.rejects)} rejected{first})")
    evals = sum(scan.splits)
    if evals == scan.spooled:
        why = "it has no usable records" if data.eval_source else f"all {scan.spooled} records fell into eval"
        raise UserError(f"data.source {data.source}: the train split is empty ({why}); add records or lower "
                        "data.eval_ratio")
    if not evals and (data.eval_source or data.eval_ratio > 0):
        where = "data.eval_source has no usable records" if data.eval_source else (
            f"no record fell into eval with data.eval_ratio={data.eval_ratio} ({scan.spooled} records)")
        raise UserError(f"data.source {data.source}: the eval split is empty: {where}; add records, raise "
                        "data.eval_ratio, or set it to 0 to train without eval")
