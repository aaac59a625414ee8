"""Pass one of staging: read every source file, normalize and validate its records, digest each one,
decide its split, and spool it for the tokenizer. Nothing is dropped silently: every record is either
spooled or a `Reject` with its location and reason (`on_invalid: fail` stops at the first one).
"""

from __future__ import annotations

import collections
import contextlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import blake3

from config.errors import UserError
from config.schema import DataConfig
from tasks.data import firstpass
from tasks.data.firstpass import EVAL, Origin
from tasks.data.identity import SourceFile
from tasks.data.progress import Reporter
from tasks.data.records import Reject, open_file
from tasks.data.spool import Chunk, SpoolWriter
from tasks.data.workers import pool_of, worker_count

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


def scan_sources(files: list[SourceFile], data: DataConfig, spool: Path, reporter: Reporter) -> Scan:
    """Read, validate, digest and spool every record of every file, in order (the per-record work of JSON Lines
    files in data.num_proc processes, tasks/data/firstpass.py)."""
    writer = SpoolWriter(spool)
    splits = bytearray()
    records_hash = blake3.blake3()
    rejects: list[Reject] = []
    sources: list[dict[str, Any]] = []
    blocks = sum(-(-f.size // firstpass.BLOCK_BYTES) for f in files if firstpass.splittable(f.url))
    processes = worker_count(data.num_proc, blocks)
    reporter.info(f"reading {len(files)} file{'s' if len(files) > 1 else ''} in {processes} "
                  f"process{'es' if processes > 1 else ''}")
    with reporter.phase("reading", sum(f.size for f in files), "B") as phase, \
            (pool_of(processes) if processes > 1 else contextlib.nullcontext()) as pool:
        for source in files:
            # Blocks of JSON Lines count their own bytes; the format is decided from the first records.
            counter = (lambda _: None) if firstpass.splittable(source.url) else phase.update
            data_file = open_file(source.url, data.format, counter)
            origin = Origin(b"e" if source.key == "data.eval_source" else b"s", data.eval_ratio,
                            data.eval_source is not None)
            kept = rejected = 0
            for part in firstpass.digest_file(data_file, origin, phase.update, pool, processes):
                if part.rejects and data.on_invalid == "fail":
                    raise part.rejects[0].error()
                rejects += part.rejects
                rejected += len(part.rejects)
                records_hash.update(part.keys)
                splits += part.splits
                writer.add_lines(part.lines, part.sizes)
                kept += part.count
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
