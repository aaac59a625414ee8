"""The background half of a save: one thread per save writes this rank's snapshot (trainer/checkpointing/snapshot.py),
digesting each file as its bytes go out (never by reading an upload back), uploads it when the run is on an object
store, then trades its file list with every other rank's writer over a group of their own; rank 0's writer writes
manifest.json and COMPLETE (docs/architecture.md, "The save protocol").

At most one save is in flight: the checkpointer waits for it before starting the next. A writer's error is kept
and raised by the main thread at its next step boundary, exactly as it would have been raised by a synchronous
save; the other ranks' writers learn that this save failed and leave it without COMPLETE.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, Any, cast

import torch

from storage.checkpoints import checkpoint_manifest, commit
from storage.digest import CHUNK, hasher
from storage.fs import put_file, size
from storage.full import full_storage_is_one_line, removed_on_error
from storage.location import Location, join
from trainer.checkpointing.snapshot import Snapshot
from trainer.parallel.distributed import Dist, gather_objects
from trainer.watch.faults import NO_FAULTS, Faults, SavePoint

log = logging.getLogger(__name__)
WRITER_NICE = 10  # the writer thread's niceness (Linux: a thread's own)


class HashingFile:
    """A writable file that digests what is written through it (torch.save hands it memoryviews, so nothing is
    copied)."""

    def __init__(self, handle: Any, algorithm: str) -> None:
        self.handle, self.hash, self.size = handle, hasher(algorithm, parallel=False), 0
        self.error: OSError | None = None

    def write(self, data: Any) -> int:
        self.hash.update(data)
        self.size += len(data)
        try:
            return self.handle.write(data)
        except OSError as exc:  # torch's writer turns it into "unexpected pos": keep the cause (a full disk)
            self.error = exc
            raise

    def flush(self) -> None:
        self.handle.flush()


def write_state(state: Any, path: str, algorithm: str) -> tuple[str, int]:
    """torch.save `state` to `path`, digesting it on the way; returns (digest, size)."""
    with open(path, "wb") as handle:
        out = HashingFile(handle, algorithm)
        try:
            torch.save(state, cast(IO[bytes], out))  # it only calls write() and flush()
        except RuntimeError as exc:
            if out.error is not None:
                raise out.error from exc
            raise
    return out.hash.hexdigest(), out.size


def digest_local(path: str, algorithm: str) -> tuple[str, int]:
    """(digest, size) of a file on this node's disk."""
    h, total = hasher(algorithm, parallel=False), 0
    with open(path, "rb") as handle:
        while chunk := handle.read(CHUNK):
            h.update(chunk)
            total += len(chunk)
    return h.hexdigest(), total


@dataclass(frozen=True)
class SaveJob:
    """Everything one save's writer needs. `root`: the local directory DeepSpeed's layout was built in (the
    checkpoint itself on local storage, else a temporary directory that the writer uploads and removes);
    `extra`: files under `root` written already (DeepSpeed's scripts), relative to `root`."""

    url: Location
    root: str
    remote: bool
    step: int
    meta: dict[str, Any]
    algorithm: str
    snapshot: Snapshot
    extra: list[str]
    faults: Faults = NO_FAULTS  # what a test injects: a slow, held or dying writer


@dataclass
class SaveResult:
    step: int
    complete: bool  # False: a peer's writer failed, and the checkpoint was left without COMPLETE
    bytes: int
    finished_at: float  # time.perf_counter() when the writer finished (COMPLETE written, on every rank)


def run_save(job: SaveJob, dist: Dist, group: Any) -> SaveResult:
    """Write, digest, upload, trade file lists, and (rank 0) commit. This rank's own error is raised after the
    exchanges, so that no writer waits forever for a failed one; a peer's failure leaves the checkpoint without
    COMPLETE (`complete` False)."""
    entries: list[dict[str, Any]] = []
    error: BaseException | None = None
    try:
        entries = _write_files(job, dist)
        job.faults.in_save(dist.rank, job.step, SavePoint.AFTER_SHARD)
    except Exception as exc:  # noqa: BLE001 - traded below, then raised: every writer must reach the exchange
        error = exc
    mine = {"entries": entries, "error": None if error is None else f"{type(error).__name__}: {error}"}
    everyone = gather_objects(mine, dist, group)
    if error is not None:
        raise error
    failed = [(rank, got["error"]) for rank, got in enumerate(everyone) if got["error"]]
    if failed:  # a peer raises its own error; this rank only leaves the checkpoint without COMPLETE
        rank, message = failed[0]
        log.warning("checkpoint step %d left incomplete: rank %d's writer failed: %s", job.step, rank, message)
        return SaveResult(job.step, False, 0, time.perf_counter())
    all_entries = [e for got in everyone for e in got["entries"]]
    committed: str | None = None
    if dist.is_main:
        manifest = checkpoint_manifest(job.step, dist.world_size, job.meta, job.algorithm, all_entries)
        try:
            commit(
                job.url,
                manifest,
                verify=True,
                before_seal=lambda: job.faults.in_save(0, job.step, SavePoint.BEFORE_COMPLETE),
            )
            log.info("checkpoint step %d complete: %d files at %s", job.step, len(all_entries), job.url)
        except Exception as exc:  # noqa: BLE001 - traded below, then raised
            error, committed = exc, f"{type(exc).__name__}: {exc}"
    # Every writer returns only once COMPLETE is written (or failed): a rank that learns its save finished may act on
    # it (stop, die in a test), and rank 0's writer must not be cut short by that.
    (outcome, *_) = gather_objects(committed, dist, group)
    if error is not None:
        raise error
    if outcome is not None:
        log.warning("checkpoint step %d left incomplete: rank 0 could not commit it: %s", job.step, outcome)
        return SaveResult(job.step, False, 0, time.perf_counter())
    return SaveResult(job.step, True, sum(e["size"] for e in all_entries), time.perf_counter())


def _write_files(job: SaveJob, dist: Dist) -> list[dict[str, Any]]:
    """This rank's files written (and uploaded), each with its digest and size, in the manifest's form."""
    entries = []
    done: list[tuple[str, str, int]] = []
    files = job.snapshot.files
    while files:
        pending = files.pop(0)  # each host copy is freed as soon as its file is written
        rel = os.path.relpath(pending.path, job.root)
        if pending.state is None:
            digest, nbytes = digest_local(pending.path, job.algorithm)
        else:
            # A full disk is named here, with the file: the rank's crash report cannot tell which file a background
            # writer was writing while the step loop went on writing others. The partial file goes with it.
            with full_storage_is_one_line(file=pending.path, needed=pending.nbytes), removed_on_error(pending.path):
                digest, nbytes = write_state(pending.state, pending.path, job.algorithm)
        del pending
        done.append((rel, digest, nbytes))
    for rel in job.extra:
        done.append((rel, *digest_local(os.path.join(job.root, rel), job.algorithm)))
    for rel, digest, nbytes in sorted(done):
        if job.remote:
            put_file(os.path.join(job.root, rel), join(job.url, rel))
            uploaded = size(join(job.url, rel))
            if uploaded != nbytes:
                raise OSError(f"{join(job.url, rel)}: {uploaded} bytes on storage after the upload, {nbytes} written")
        entries.append({"path": rel, "size": nbytes, "digest": digest, "rank": dist.rank, "host": dist.host})
        if len(entries) == 1:
            job.faults.in_save(dist.rank, job.step, SavePoint.MID_UPLOAD)
    if job.remote:
        shutil.rmtree(job.root, ignore_errors=True)
    return entries


class BackgroundSave:
    """One save's writer thread. `done()` never blocks; `wait()` returns its result or raises its error."""

    def __init__(self, job: SaveJob, dist: Dist, group: Any, *, background: bool) -> None:
        self.job = job
        self.result: SaveResult | None = None
        self.error: BaseException | None = None
        self._thread: threading.Thread | None = None
        target = self._run(lambda: run_save(job, dist, group))
        if background:
            # A daemon: a rank that exits (an error, a stop past its grace) takes an unfinished save with it, and
            # that save has no COMPLETE, which is what a reader must see.
            self._thread = threading.Thread(target=target, name=f"checkpoint-{job.step}", daemon=True)
            self._thread.start()
        else:
            target()

    def _run(self, work: Callable[[], SaveResult]) -> Callable[[], None]:
        def run() -> None:
            if self._thread is not None:
                # Below the step loop's threads: where the cores are busy training (a CPU run), the writer takes
                # what they leave; on a GPU node, whose cores mostly wait on the device, that is nearly all of them.
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), WRITER_NICE)
            try:
                self.result = work()
            except BaseException as exc:  # noqa: BLE001 - kept for the main thread, which raises it
                self.error = exc

        return run

    @property
    def step(self) -> int:
        return self.job.step

    def done(self) -> bool:
        return self._thread is None or not self._thread.is_alive()

    def wait(self, timeout: float | None = None) -> SaveResult | None:
        """The result once the writer finished (None if `timeout` passed first); raises the writer's error."""
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                return None
        if self.error is not None:
            raise self.error
        return self.result
