"""Pass one of staging: read every source file (the sources mixed as data.mix says), normalize and validate its
records, digest each one, decide its split, and spool it for the tokenizer. Nothing is dropped silently: every
record read is either spooled or a `Reject` with its location and reason (`on_invalid: fail` stops at the first
one; a KTO record labelled false under data.preference=chosen is an `Undesirable`, counted apart and never an
error); what a cap or data.mix=interleave leaves unread is said per file and per source. The per-record work of
plain JSON Lines files runs in data.num_proc processes (staging/firstpass.py), which give the records back in
file order, so the mix, the caps, the spool and the rejects do not depend on the number of processes.
"""

from __future__ import annotations

import array
import collections
import contextlib
import itertools
import math
import posixpath
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import blake3
import numpy as np

from config.sections.run_data import DataConfig
from core.errors import UserError
from staging import firstpass
from staging.firstpass import Digested
from staging.identity import Inputs, eval_key, in_eval
from staging.progress import Reporter
from staging.records import DataFile, Images, Reject, Undesirable, open_file
from staging.sources import ByteCounter
from staging.spool import Chunk, SpoolWriter
from staging.streams import Stream, capped, interleave, label
from staging.workers import pool_of, worker_count
from storage.location import Location

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
    streams: list[dict[str, Any]] = field(default_factory=list)  # per configured source: how read, what it gave
    eval_capped: int = 0  # records data.eval_ratio held out beyond data.eval_max_records: they train
    images: dict[str, Location] = field(default_factory=dict)  # each image the records name: where it was read

    @property
    def spooled(self) -> int:
        """Records that passed validation."""
        return len(self.splits)


@dataclass
class Spooler:
    """Pass one's sink: each valid record digested and spooled with its split, each reject kept (or raised with
    `on_invalid: fail`), counted per file."""

    data: DataConfig
    writer: SpoolWriter
    counts: list[list[int]]  # per file: valid records, rejected, undesirable (data.preference=chosen)
    splits: bytearray = field(default_factory=bytearray)
    rejects: list[Reject] = field(default_factory=list)
    records_hash: Any = field(default_factory=blake3.blake3)
    # The records data.eval_ratio held out: their place in `splits` and their eval_key (data.eval_max_records).
    held_at: array.array[int] = field(default_factory=lambda: array.array("q"))
    held_keys: array.array[int] = field(default_factory=lambda: array.array("Q"))
    splittable: int = 0  # records of the training sources, the ones data.eval_ratio splits
    images: dict[str, Location] = field(default_factory=dict)  # the images of the spooled records
    nearest: tuple[int, int] | None = None  # (eval_key, place) of the training record nearest to eval

    def take(self, index: int, key: str, item: Digested | Reject) -> None:
        """One run of records (or a reject) of file `index`, from the stream `key`."""
        if isinstance(item, Undesirable):  # left out by data.preference, not invalid
            self.rejects.append(item)
            self.counts[index][2] += 1
            return
        if isinstance(item, Reject):
            if self.data.on_invalid == "fail":
                raise item.error()
            self.rejects.append(item)
            self.counts[index][1] += 1
            return
        role = b"e" if key == "data.eval_source" else b"s"
        digests = item.digest_list()
        self.records_hash.update(b"".join(role + digest for digest in digests))
        if role == b"e":
            self.splits += bytes([EVAL]) * len(digests)
        else:
            self.hold_out(digests)
        self.writer.add_lines(item.lines, item.sizes)
        self.images.update(item.images)
        self.counts[index][0] += item.count

    def hold_out(self, digests: list[bytes]) -> None:
        """Each training source record's split by its digest (data.eval_ratio); the held out ones are remembered
        for data.eval_max_records."""
        if self.data.eval_source:
            self.splits += bytes([TRAIN]) * len(digests)
            return
        for digest in digests:
            key, place = eval_key(digest), len(self.splits)
            self.splittable += 1
            held = in_eval(digest, self.data.eval_ratio)
            if held:
                self.held_at.append(place)
                self.held_keys.append(key)
            elif self.nearest is None or key < self.nearest[0]:
                self.nearest = (key, place)
            self.splits.append(EVAL if held else TRAIN)

    def fill_eval(self) -> bool:
        """A small dataset whose digests put no record into eval holds out the one nearest to it (the lowest key),
        so a ratio > 0 of at least 2 records always gives an eval split; returns whether it did."""
        if self.held_at or self.nearest is None or self.splittable < 2 or self.data.eval_ratio <= 0:
            return False
        key, place = self.nearest
        self.held_at.append(place)
        self.held_keys.append(key)
        self.splits[place] = EVAL
        return True

    def cap_eval(self) -> int:
        """Keep at most eval_limit(...) held out records, those with the lowest keys (ties: the earlier record), in
        eval, and train on the others; returns how many moved to train."""
        cap = eval_limit(self.data, self.splittable)
        if cap is None or len(self.held_at) <= cap:
            return 0
        at, keys = np.frombuffer(self.held_at, dtype=np.int64), np.frombuffer(self.held_keys, dtype=np.uint64)
        moved = at[np.lexsort((at, keys))[cap:]]
        np.frombuffer(self.splits, dtype=np.uint8)[moved] = TRAIN
        return len(moved)


def eval_limit(data: DataConfig, records: int) -> int | None:
    """The most records data.eval_ratio holds out of `records`: the ratio rounded up (as a newcomer's
    train_test_split counts it), and no more than data.eval_max_records."""
    # round() first: 0.1 x 30 is 3.0000000000000004 in floating point, which must not round up to 4.
    by_ratio = math.ceil(round(data.eval_ratio * records, 9))
    return by_ratio if data.eval_max_records is None else min(by_ratio, data.eval_max_records)


def scan_sources(inputs: Inputs, data: DataConfig, spool: Path, reporter: Reporter) -> Scan:
    """Read, validate, digest and spool every record of every stream, mixed as data.mix says (the per-record work
    of plain JSON Lines files in data.num_proc processes, staging/firstpass.py)."""
    files = inputs.files
    sink = Spooler(data, SpoolWriter(spool), [[0, 0, 0] for _ in files])
    blocks = sum(-(-f.size // firstpass.BLOCK_BYTES) for f in files if firstpass.splittable(f.url))
    processes = worker_count(data.num_proc, blocks)
    reporter.info(
        f"reading {len(files)} file{'s' if len(files) > 1 else ''} in {processes} "
        f"process{'es' if processes > 1 else ''}"
    )
    with (
        reporter.phase("reading", sum(f.size for f in files), "B") as phase,
        pool_of(processes) if processes > 1 else contextlib.nullcontext() as pool,
    ):
        reader = Reader(
            inputs,
            data.mix,
            data.preference_mode,
            phase.update,
            pool,
            processes,
            data.digest_algorithm,
            bool(data.require_answer),
        )
        for index, item in reader.mixed():
            sink.take(index, files[index].key, item)
    sources = source_rows(inputs, reader.opened, sink.counts)
    report(sources, reader.opened, inputs.streams, data, reporter)
    capped = settle_eval(sink, data, reporter)
    scan = Scan(
        sink.writer.close(),
        sink.splits,
        sink.records_hash.hexdigest(),
        sink.rejects,
        sources,
        mix(sources, inputs.streams),
        capped,
        sink.images,
    )
    check_splits(scan, data)
    return scan


def settle_eval(sink: Spooler, data: DataConfig, reporter: Reporter) -> int:
    """Bring the eval split that the digests gave to at least one record and at most the ratio rounded up (and
    data.eval_max_records), saying what moved; returns how many records data.eval_max_records moved to train."""
    if sink.fill_eval():
        reporter.info(
            f"no record's digest fell into eval with data.eval_ratio={data.eval_ratio} ({sink.splittable} records): "
            "the one nearest to it is held out"
        )
    moved = sink.cap_eval()
    if not moved:
        return 0
    if data.eval_max_records is not None and eval_limit(data, sink.splittable) == data.eval_max_records:
        reporter.info(
            f"eval split capped at data.eval_max_records={data.eval_max_records}: {moved} more records of the "
            f"{len(sink.held_at)} data.eval_ratio={data.eval_ratio} held out train"
        )
        return moved
    reporter.info(
        f"eval split held to data.eval_ratio={data.eval_ratio} of {sink.splittable} records rounded up "
        f"({eval_limit(data, sink.splittable)}): {moved} more records whose digests fell into eval train"
    )
    return 0


@dataclass
class Reader:
    """The records of every stream in the order data.mix gives them, each file opened as the mix reaches it."""

    inputs: Inputs
    strategy: str  # data.mix
    preference: str  # data.preference
    progress: ByteCounter
    pool: ProcessPoolExecutor | None
    processes: int
    algorithm: str  # data.digest_algorithm: what names the images
    require_answer: bool = False  # data.require_answer: a prompt record needs its reference answer
    opened: dict[int, DataFile] = field(default_factory=dict)

    def mixed(self) -> Iterator[tuple[int, Digested | Reject]]:
        """(file index, a run of records or a reject): the train streams mixed, then the eval streams, each capped."""
        streams = self.inputs.streams
        interleaving = self.strategy == "interleave" and sum(not s.is_eval for s in streams) > 1
        train = [capped(self.items_of(s, interleaving), s.max_records) for s in streams if not s.is_eval]
        weights = [s.weight for s in streams if not s.is_eval]
        mixed = interleave(train, weights) if interleaving else itertools.chain(*train)
        evals = [capped(self.items_of(s, interleaving), s.max_records) for s in streams if s.is_eval]
        for _, item in itertools.chain(mixed, *evals):
            yield item

    def items_of(self, stream: Stream, interleaving: bool) -> Iterator[tuple[bool, tuple[int, Digested | Reject]]]:
        """(counts toward a cap, (file index, item)) of one stream's files in order."""
        # Runs of records as the files give them; one record at a time where a cap or interleave counts them.
        one_by_one = stream.max_records is not None or (interleaving and not stream.is_eval)
        for index, source in enumerate(self.inputs.files):
            if source.key != stream.key:
                continue
            # Blocks of JSON Lines count their own bytes; the format is decided from the first records.
            counter = (lambda _: None) if firstpass.splittable(source.url) else self.progress
            images = Images(folder(source.url), self.algorithm, None if self.inputs.vision else self.inputs.model)
            self.opened[index] = open_file(
                source.url, stream.mapping, self.preference, counter, images, self.require_answer
            )
            items = firstpass.digest_file(self.opened[index], self.progress, self.pool, self.processes)
            for item in items:
                if isinstance(item, Reject):
                    yield False, (index, item)
                else:
                    yield from ((True, (index, run)) for run in (item.singles() if one_by_one else (item,)))


def folder(url: Location) -> Location:
    """The folder of a data file: its records' image paths are relative to it."""
    return url.with_url(posixpath.dirname(url.url))


def source_rows(inputs: Inputs, opened: dict[int, DataFile], counts: list[list[int]]) -> list[dict[str, Any]]:
    """One row per source file for the manifest's `sources`: where, what, and the records it gave."""
    return [
        {
            "url": str(f.url),
            "size": f.size,
            "digest": f.digest,
            "key": f.key,
            "format": opened[i].format if i in opened else None,
            "preference": form.name if i in opened and (form := opened[i].reading.form) else None,
            "records": kept,
            "rejected": rejected,
            "undesirable": undesirable,
        }
        for i, (f, (kept, rejected, undesirable)) in enumerate(zip(inputs.files, counts, strict=True))
    ]


def mix(sources: list[dict[str, Any]], streams: list[Stream]) -> list[dict[str, Any]]:
    """Each stream with how it is read and the records it gave (the manifest's `mix.sources`)."""
    out = []
    for stream in streams:
        mine = [s for s in sources if s["key"] == stream.key]
        out.append(
            {
                **stream.describe(),
                "files": len(mine),
                "records": sum(s["records"] for s in mine),
                "rejected": sum(s["rejected"] for s in mine),
                "undesirable": sum(s["undesirable"] for s in mine),
            }
        )
    return out


def report(
    sources: list[dict[str, Any]],
    opened: dict[int, DataFile],
    streams: list[Stream],
    data: DataConfig,
    reporter: Reporter,
) -> None:
    """One line per file (a summary beyond MAX_FILE_LINES files), then one per stream when there are several."""
    if len(sources) <= MAX_FILE_LINES:
        for index, source in enumerate(sources):
            if index not in opened:
                reporter.info(
                    f"{source['url']}: not read (data.mix=interleave stopped when the first source ran out)"
                    if data.mix == "interleave"
                    else f"{source['url']}: not read (its source's cap reached)"
                )
                continue
            reporter.info(
                f"{source['url']}: {source['format']} ({opened[index].reason}), {source['records']} records"
                + (f", {source['rejected']} rejected" if source["rejected"] else "")
                + (f", {source['undesirable']} undesirable left out" if source["undesirable"] else "")
            )
    else:
        formats = collections.Counter(s["format"] for s in sources if s["format"])
        reporter.info(f"{len(sources)} files: " + ", ".join(f"{n} {fmt}" for fmt, n in sorted(formats.items())))
    if len(streams) > 1:
        for entry in mix(sources, streams):
            cap = f", at most {entry['max_records']}" if entry["max_records"] else ""
            mixed = data.mix == "interleave" and entry["key"] != "data.eval_source"
            weight = f", weight {entry['weight']:g}" if mixed else ""
            reporter.info(
                f"{entry['key']} ({entry['entry'] or entry['source']}): {entry['records']} records{weight}{cap}"
            )


def check_splits(scan: Scan, data: DataConfig) -> None:
    """An empty result, or an empty split that the settings ask for, is an error that says what to change."""
    if not scan.spooled:
        first = f"; the first: {scan.rejects[0].location}: {scan.rejects[0].reason}" if scan.rejects else ""
        undesirable = sum(isinstance(reject, Undesirable) for reject in scan.rejects)
        left = f", {undesirable} labelled undesirable" if undesirable else ""
        raise UserError(f"{label(data)}: no usable records ({len(scan.rejects) - undesirable} rejected{left}{first})")
    evals = sum(scan.splits)
    if evals == scan.spooled:
        why = "it has no usable records" if data.eval_source else f"all {scan.spooled} records fell into eval"
        raise UserError(f"{label(data)}: the train split is empty ({why}); add records or lower data.eval_ratio")
    if not evals and (data.eval_source or data.eval_ratio > 0):
        where = (
            "data.eval_source has no usable records"
            if data.eval_source
            else (f"no record fell into eval with data.eval_ratio={data.eval_ratio} ({scan.spooled} records)")
        )
        raise UserError(
            f"{label(data)}: the eval split is empty: {where}; add records, raise "
            "data.eval_ratio, or set it to 0 to train without eval"
        )
