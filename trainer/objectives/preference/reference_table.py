"""The reference of DPO and IPO under full fine-tuning: the base model's log-probabilities of every pair's answers,
computed once, before the first optimizer step, and kept in the run directory.

With LoRA the reference is the policy with its adapters disabled (reference.py). A fully fine-tuned
policy has no such switch, and a second, frozen copy of the model would cost every rank a model's memory (under
ZeRO-3 a second partitioned engine). What DPO and IPO need of the reference is a number per answer, which never
changes: so the loaded base computes it for the train and eval splits in one pass without gradients (each rank a
share) before the run resumes any checkpoint, and rank 0 writes {run}/reference/{split}.npy (rows x 2, float64: the
chosen then the rejected answer's summed log-probability). A retry or a resume, on any world size, reads it instead of
computing it again; the evaluate stage reads the eval split's. KTO is not covered: its reference point pairs each
answer with another prompt's answer, and which one depends on the batch.

What a rank holds does not grow with the split (16 bytes a pair would be 16 GB for a billion, on every rank of a
node): the ranks send rank 0 their rows as float64 blocks of a fixed size, which rank 0 writes straight into the
file (a memory-mapped .npy, never a Python list), and every rank then maps the written table read-only from a file on
its node, so that the node's ranks share one copy in the page cache and a lookup reads the rows it takes. A table on
an object store is copied once per node into the node cache (storage/node_cache.py, `reference/`) to be mapped.
"""

from __future__ import annotations

import logging
import math
import os
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from core.errors import RetryableError, UserError
from storage.digest import digest_bytes
from storage.fs import filesystem, get_file, put_file
from storage.full import full_storage_is_one_line, removed_on_error
from storage.location import Location, is_local, join, local_path
from storage.node_cache import REFERENCE, cache_root, filling
from storage.retry import with_retries
from storage.split_reader import Split
from trainer.loss.chunked import LossHead
from trainer.objectives.preference.batching import collate_preference
from trainer.parallel.distributed import Dist, barrier, dist_sum, gather_to_main

log = logging.getLogger(__name__)

REFERENCE_DIR = "reference"
# Rows all ranks together send rank 0 in one gather (index, chosen, rejected: 24 bytes each), 1.5 MB whatever the
# world size and the split: large enough that a million pairs take a few dozen gathers, small enough to hold anywhere.
GATHER_ROWS = 1 << 16
EMPTY_SLOT = -1.0  # a block's index column where a rank had no row to send
WRITTEN_WAIT_S = 90.0  # how long a rank looks for the table rank 0 wrote (NFS's attribute cache: acdirmax 60 s)


def table_url(run: Location, split: str) -> Location:
    """{run}/reference/{split}.npy."""
    return join(run, REFERENCE_DIR, f"{split}.npy")


@dataclass(frozen=True)
class ReferenceTable:
    """The reference log-probabilities of a split's pairs: row i's (chosen, rejected)."""

    values: np.ndarray  # (rows, 2) float64, mapped read-only from a file on this node (np.memmap)

    def logps(self, indices: tuple[int, ...], device: torch.device) -> torch.Tensor:
        """The chosen answers' then the rejected answers' log-probabilities of rows `indices` (a micro-batch's
        sequences in their order)."""
        if not indices:
            raise RuntimeError("a preference micro-batch without its row indices: the reference table needs them")
        picked = self.values[list(indices)]  # a copy of these rows alone, read from the map
        return torch.tensor(np.concatenate([picked[:, 0], picked[:, 1]]), dtype=torch.float32, device=device)


def pass_count(rows: int, world: int, batch_size: int) -> int:
    """Forward passes of the rank with the most rows: every rank goes through as many (blocks are gathered after the
    same passes on every rank, and under ZeRO-3 every forward pass is collective)."""
    return math.ceil(math.ceil(rows / world) / batch_size)


@torch.no_grad()
def rank_logps(
    model: Any, rows: Split, dist: Dist, *, batch_size: int, pad_id: int, lockstep: bool, head: LossHead
) -> Iterator[tuple[range, np.ndarray]]:
    """(this rank's rows, their (n, 2) log-probabilities) of each pass: row i on rank i % world, in micro-batches,
    through the loss `head` (trainer/loss/chunked.py). `lockstep` (ZeRO-3): a rank out of rows runs a throw-away pass
    over row 0; otherwise it yields no rows."""
    mine = range(dist.rank, len(rows), dist.world_size)
    for k in range(pass_count(len(rows), dist.world_size, batch_size)):
        group = mine[k * batch_size : (k + 1) * batch_size]
        if not group and not lockstep:
            yield group, np.empty((0, 2))
            continue
        taken = list(group) or [0]
        batch = collate_preference([rows[i] for i in taken], [rows.feedback(i) for i in taken], pad_id)
        out = model(**batch.sequences.model_inputs(dist.device), **head.forward_kwargs(dist.device))
        values, _ = head.sequence_logps(out, batch.sequences.labels)
        logps = values.double().cpu().numpy()
        n = len(taken)
        yield group, np.stack([logps[:n], logps[n : 2 * n]], axis=1)[: len(group)]


def collect(
    parts: Iterable[tuple[Sequence[int], np.ndarray]], out: np.ndarray | None, dist: Dist, *, rows_per_pass: int
) -> int:
    """Send every rank's rows (each item of `parts`: at most `rows_per_pass` row indices and their (n, 2) values) to
    rank 0, which writes row i into out[i]; returns the rows rank 0 wrote (0 elsewhere). Every rank must yield as many
    parts: the blocks are gathered after the same parts everywhere. A rank holds one block (GATHER_ROWS / world rows),
    rank 0 one per rank, whatever the split's size: no Python object per row is ever built or pickled."""
    per_block = max(1, GATHER_ROWS // (dist.world_size * rows_per_pass))
    blocks = Blocks(per_block * rows_per_pass, dist)
    used = written = done = 0
    for done, (indices, values) in enumerate(parts, 1):
        blocks.mine[used : used + len(indices), 0] = indices
        blocks.mine[used : used + len(indices), 1:] = values
        used += len(indices)
        if done % per_block == 0:
            written, used = written + blocks.flush(out), 0
    if done % per_block:
        written += blocks.flush(out)
    return written


class Blocks:
    """This rank's block of rows (index, chosen, rejected; EMPTY_SLOT past its rows) and, on rank 0, the buffers
    every rank's block arrives in and is read from: allocated once and reused by every gather (buffers allocated per
    gather fragment the heap, and rank 0's memory then grows with the table: 12 MB more at 4 million pairs)."""

    def __init__(self, rows: int, dist: Dist) -> None:
        self.dist = dist
        self.mine = np.full((rows, 3), EMPTY_SLOT)
        receiving = dist.is_main and dist.world_size > 1
        buffers = dist.world_size if receiving else 0
        self.received = [torch.empty((rows, 3), dtype=torch.float64, device=dist.device) for _ in range(buffers)]
        self.host = np.empty((rows, 3)) if receiving and dist.device.type != "cpu" else None  # a device block, copied

    def flush(self, out: np.ndarray | None) -> int:
        """Gather every rank's block on rank 0 and write their rows into `out`; empties this rank's block."""
        written = 0
        for part in gather_to_main(torch.from_numpy(self.mine), self.dist, self.received or None) or []:
            found = part.numpy() if self.host is None else self.host
            if self.host is not None:
                torch.from_numpy(self.host).copy_(part)
            n = int(np.count_nonzero(found[:, 0] != EMPTY_SLOT))  # a rank fills its block from the start
            if out is not None:
                out[found[:n, 0].astype(np.int64)] = found[:n, 1:]
            written += n
        self.mine[:, 0] = EMPTY_SLOT  # after the rows are read: with one rank the gathered block is this very array
        return written


def compute(model: Any, rows: Split, dist: Dist, out: np.ndarray | None, **batching: Any) -> None:
    """Every row's reference log-probabilities, written into rank 0's `out` ((rows, 2) float64; None on the other
    ranks), each rank computing its share (`batching`: batch_size, pad_id, lockstep, head: see rank_logps)."""
    parts = rank_logps(model, rows, dist, **batching)
    written = collect(parts, out, dist, rows_per_pass=batching["batch_size"])
    if dist.is_main and written != len(rows):
        raise RuntimeError(
            f"the reference table got {written} rows of the split's {len(rows)}: every row is one rank's"
        )


def load(run: Location, split: str, rows: int, cache: Path | None = None) -> ReferenceTable | None:
    """The split's table if the run has it (None if not), mapped from a file on this node (a table on an object store
    through its node cache copy, under `cache`: the node cache's root, cache_root() by default), and checked
    against the split's row count."""
    url = table_url(run, split)
    path = local_table(url, cache or cache_root())
    if path is None:
        return None
    values = mapped(path, url)
    if values.shape[0] != rows:
        raise UserError(
            f"{url}: {values.shape[0]} rows of reference log-probabilities, the {split} split has {rows}; it belongs "
            "to another dataset: delete it (it is computed again from the base model) or train as a new run.name"
        )
    return ReferenceTable(values)


def mapped(path: str, url: Location) -> np.ndarray:
    """A table file mapped read-only: its pages are the page cache's, shared by every rank of the node that maps it,
    and read as rows are looked up. A file that is no rows x 2 float64 .npy is named in one line."""
    try:
        values = np.load(path, mmap_mode="r", allow_pickle=False)
        if values.ndim != 2 or values.shape[1] != 2 or values.dtype != np.float64:
            raise ValueError(f"{values.dtype} of shape {values.shape}, not rows x 2 float64")
    except (OSError, ValueError, EOFError) as exc:
        reason = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise UserError(
            f"{url}: not a readable reference table ({reason}); delete it (it is computed again from the base model)"
        ) from None
    return values


def local_table(url: Location, cache: Path) -> str | None:
    """The local file to map of a table (None when there is none): the table itself on a local or NFS path, else its
    copy in the node cache, fetched when the node has none of this version."""
    if is_local(url):
        path = local_path(url)
        return path if os.path.exists(path) else None
    version = remote_version(url)
    if version is None:
        return None
    size, tag = version
    copy = cached_copy(url, tag, cache)
    if not has_size(copy, size):
        with filling(copy):  # one rank of the node fetches; the others wait, then find the copy whole
            if not has_size(copy, size):
                fetch(url, copy, size)
    return str(copy)


def remote_version(url: Location) -> tuple[int, str] | None:
    """(size, version) of a table on an object store (the version changes with the object: S3's ETag), or None."""
    fs, path = filesystem(url)

    def stat() -> tuple[int, str] | None:
        fs.invalidate_cache(path)  # rank 0 may have written it since this process last listed the directory
        try:
            return int(fs.size(path)), str(fs.checksum(path))
        except FileNotFoundError:
            return None

    return with_retries("stat", url, stat)


def cached_copy(url: Location, tag: str, cache: Path) -> Path:
    """Where the node cache keeps a version of a remote table: named by its URL and version, so that a table computed
    again is fetched again, never read from the copy of the one it replaced."""
    key = digest_bytes(f"{url}\0{tag}".encode(), "blake3")[:40]
    return cache / REFERENCE / f"{key}.npy"


def has_size(path: Path, size: int) -> bool:
    """Whether a local file is there with `size` bytes."""
    try:
        return path.stat().st_size == size
    except OSError:
        return False


def fetch(url: Location, copy: Path, size: int) -> None:
    """Download a remote table into the node cache under a temporary name, then rename it: a crash never leaves part
    of a table under the name that is mapped."""
    tmp = copy.with_name(f".tmp-{uuid.uuid4().hex}-{copy.name}")
    with full_storage_is_one_line(file=str(copy), needed=size), removed_on_error(str(tmp)):
        get_file(url, str(tmp))
        if (got := os.path.getsize(tmp)) != size:
            raise RetryableError(f"{url}: fetched {got} of its {size} bytes into {tmp}; a retry fetches it again")
        os.replace(tmp, copy)


def write(run: Location, split: str, rows: int, dist: Dist, cache: Path, fill: Callable[[Any], None]) -> None:
    """Rank 0 writes the split's table: `fill` writes the values into a (rows, 2) float64 .npy file mapped under a
    temporary name (the other ranks call fill(None): they send, rank 0 writes), which is then published under its name
    in the run directory (renamed there, or uploaded and kept as this node's cache copy)."""
    if not dist.is_main:
        fill(None)
        return
    url = table_url(run, split)
    folder = Path(local_path(url)).parent if is_local(url) else cache / REFERENCE
    tmp = folder / f".tmp-{uuid.uuid4().hex}-{split}.npy"
    with full_storage_is_one_line(Location(str(folder)), file=str(url), needed=rows * 16), removed_on_error(str(tmp)):
        folder.mkdir(parents=True, exist_ok=True)
        out = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.float64, shape=(rows, 2))
        with open(tmp, "r+b") as handle:
            # Blocks reserved now: a full disk is one line here, not a SIGBUS when a mapped page is first written.
            os.posix_fallocate(handle.fileno(), 0, os.path.getsize(tmp))
            fill(out)
            out.flush()
            del out
            os.fsync(handle.fileno())
        publish(tmp, url, cache)


def publish(tmp: Path, url: Location, cache: Path) -> None:
    """A finished table under its name: renamed into place on a local path; uploaded (one PUT: whole or absent) to
    an object store, the local file becoming this node's cache copy of the version uploaded."""
    if is_local(url):
        os.replace(tmp, local_path(url))
        return
    put_file(str(tmp), url)
    version = remote_version(url)
    if version is None:  # not listed yet (an eventually consistent store): the ranks fetch it when it is
        tmp.unlink(missing_ok=True)
    else:
        os.replace(tmp, cached_copy(url, version[1], cache))


def written_table(run: Location, split: str, rows: int, cache: Path) -> ReferenceTable:
    """The table rank 0 has just written, mapped; looked for again for a while where this node does not see it yet
    (NFS caches a directory's attributes, names absent a moment ago included, for up to a minute)."""
    deadline = time.monotonic() + WRITTEN_WAIT_S
    while (table := load(run, split, rows, cache)) is None:
        if time.monotonic() > deadline:
            raise RetryableError(
                f"{table_url(run, split)}: written by rank 0 but not seen on this node after {WRITTEN_WAIT_S:.0f} s; "
                "a retry reads it"
            )
        time.sleep(1.0)
    return table


def load_or_compute(
    model: Any, run: Location, split: str, rows: Split, dist: Dist, cache: Path | None = None, /, **batching: Any
) -> ReferenceTable:
    """The split's table: read from the run directory, or computed by the model as it is now (the base: called
    before any checkpoint is resumed), written by rank 0 and then mapped by every rank. `cache`: the node cache's
    root (cache_root() by default), where a table on an object store is copied to be mapped; positional, so that the
    callers' **batching (compute's batch_size, pad_id, lockstep) can never be taken for it."""
    root = cache or cache_root()
    table = load(run, split, len(rows), root)
    # Every rank must take the same branch (computing gathers from all of them): a table one rank cannot read yet is
    # computed again by all.
    (readable,) = dist_sum([float(table is not None)], dist)
    if table is not None and readable == dist.world_size:
        log.info("reference log-probabilities of the %s split: %s (computed before)", split, table_url(run, split))
        return table
    started = time.perf_counter()
    write(run, split, len(rows), dist, root, lambda out: compute(model, rows, dist, out, **batching))
    barrier()  # the table is whole under its name before any rank maps it
    table = written_table(run, split, len(rows), root)
    log.info(
        "reference log-probabilities of %d %s pairs computed by the base model in %.1f s: %s",
        len(rows),
        split,
        time.perf_counter() - started,
        table_url(run, split),
    )
    return table
