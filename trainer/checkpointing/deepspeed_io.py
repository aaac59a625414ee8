"""What a rank does with a checkpoint: the part of its save that training waits for, its DeepSpeed shard loaded,
DeepSpeed's directory layout rebuilt from a checkpoint's manifest, and a finished local directory published with its
manifest (docs/architecture.md, "On storage" and "The save protocol"). The writing, digesting, uploading and the
commit of a save are trainer/checkpointing/writer.py's; the manifest, COMPLETE, deletion and retention are
storage/checkpoints.py's; when to save, resume and export is trainer/checkpointing/policy.py's.

Each rank saves its own DeepSpeed shard into `rank-{r:05d}/` (DeepSpeed's tag is the rank directory,
so no file ever needs to be sorted by owner), digests it, and rank 0 writes manifest.json, checks
that every listed file is there with its size, and only then writes COMPLETE with the manifest's
digest. A directory without COMPLETE does not exist for any reader. LoRA/Q-LoRA checkpoints leave
out the frozen base (DeepSpeed's exclude_frozen_parameters): it is in model.name_or_path already.
"""

from __future__ import annotations

import io
import logging
import os
import random
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from core.errors import UserError
from storage import layout
from storage.checkpoints import (
    CompleteCheckpoint,
    commit,
    read_complete,
    remove_dir,
)
from storage.digest import digest_url
from storage.fs import filesystem, get_file, read_bytes
from storage.location import Location, is_local, join, local_path
from storage.retry import with_retries
from trainer.checkpointing.snapshot import Pending, Snapshot, SnapshotEngine
from trainer.checkpointing.writer import SaveJob
from trainer.parallel.distributed import Dist, barrier
from trainer.watch.faults import NO_FAULTS, Faults

log = logging.getLogger(__name__)
TRAINER_STATE = "trainer_state.pt"
DS_TAG = "ckpt"  # the tag of a checkpoint rebuilt in DeepSpeed's layout


def rng_state() -> dict[str, Any]:
    """Every RNG this process uses, for exact resume."""
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what rng_state() captured."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _rank_files(root: str, rank_dir: str, with_root_files: bool) -> list[str]:
    """Files under root/rank_dir (plus, for rank 0, DeepSpeed's scripts at the root), relative to root."""
    out = []
    if with_root_files:  # DeepSpeed's rank 0 drops zero_to_fp32.py next to the tags; list it too
        out += [n for n in os.listdir(root) if os.path.isfile(os.path.join(root, n)) and not n.startswith(".")]
    for dirpath, _, names in os.walk(os.path.join(root, rank_dir)):
        for name in names:
            out.append(os.path.relpath(os.path.join(dirpath, name), root))
    return sorted(out)


@dataclass(frozen=True)
class Saving:
    """What every save of a run is made with: the run's directory, this rank's place, the digest algorithm, whether
    frozen weights are left out (adapters), the manifest's `meta`, the host-memory snapshots of a background save (None:
    written to disk at once), the faults a test injects into the writer, and the objective's own state (every rank's
    trainer state holds the same; a resume reads rank 0's, on any world size)."""

    run_url: Location
    dist: Dist
    algorithm: str
    exclude_frozen: bool
    meta: dict[str, Any]
    snapshots: SnapshotEngine | None
    faults: Faults = NO_FAULTS
    objective: dict[str, Any] | None = None  # what the objective keeps beside the engine (GRPO's window of rollouts)


def begin_save(engine: Any, step: int, saving: Saving) -> SaveJob:
    """The part of saving step `step` that training waits for: DeepSpeed's save (its collectives) with this rank's
    state copied to host memory by the snapshots (or, without, written to disk at once); returns what the writer
    (trainer/checkpointing/writer.py) does next."""
    run_url, dist, snapshots = saving.run_url, saving.dist, saving.snapshots
    url = layout.checkpoint_dir(run_url, step)
    if read_complete(url) is not None:
        raise UserError(f"{url} is already complete; refusing to overwrite a checkpoint (use a new run.name)")
    rank_dir = layout.rank_dir_name(dist.rank)
    remote = not is_local(url)
    root = tempfile.mkdtemp(prefix="tandem-ckpt-") if remote else local_path(url)
    if dist.is_main:
        remove_dir(url)  # leftovers of a save that never reached COMPLETE
    barrier()
    default_engine = engine.checkpoint_engine
    if snapshots is not None:
        engine.checkpoint_engine = snapshots
    started = time.perf_counter()
    try:
        engine.save_checkpoint(
            root,
            tag=rank_dir,
            client_state={"step": step},
            save_latest=False,
            exclude_frozen_parameters=saving.exclude_frozen,
        )
    finally:
        engine.checkpoint_engine = default_engine
    snapshot = snapshots.take() if snapshots is not None else Snapshot()
    if snapshots is not None:
        log.info(
            "checkpoint step %d: %.2f GB copied to host memory, %d file(s) written to local disk, in %.2f s",
            step,
            snapshot.host_bytes / 1e9,
            sum(f.state is None for f in snapshot.files),
            time.perf_counter() - started,
        )
    state = {"step": step, "rank": dist.rank, "rng": rng_state()}  # fresh objects: no copy needed
    if saving.objective is not None:
        state["objective"] = saving.objective  # never changed after it is taken: the next window is a new object
    snapshot.files.append(Pending(os.path.join(root, rank_dir, TRAINER_STATE), state, 0))
    pending = {os.path.relpath(f.path, root) for f in snapshot.files}
    extra = [rel for rel in _rank_files(root, rank_dir, with_root_files=dist.is_main) if rel not in pending]
    return SaveJob(url, root, remote, step, saving.meta, saving.algorithm, snapshot, extra, saving.faults)


def publish_dir(
    staging: str, url: Location, algorithm: str, manifest_for: Callable[[list[dict[str, Any]]], dict[str, Any]]
) -> int:
    """Move a finished local directory to `url`, then write manifest.json (`manifest_for` its files) and COMPLETE
    (the commit); returns the bytes published."""
    files: list[dict[str, Any]] = []
    for dirpath, _, names in os.walk(staging):
        for name in names:
            rel = os.path.relpath(os.path.join(dirpath, name), staging)
            digest, size = digest_url(Location(os.path.join(dirpath, name)), algorithm)
            files.append({"path": rel, "size": size, "digest": digest})
    remove_dir(url)  # an older export (COMPLETE removed first) or an interrupted one
    if is_local(url):
        os.makedirs(os.path.dirname(local_path(url)), exist_ok=True)
        shutil.move(staging, local_path(url))
    else:
        fs, remote = filesystem(url)
        with_retries("upload", url, lambda: fs.put(staging, remote, recursive=True))
        shutil.rmtree(staging, ignore_errors=True)
    commit(url, manifest_for(files))
    return sum(f["size"] for f in files)


def deepspeed_layout(ckpt: CompleteCheckpoint, tag: str, wanted: Callable[[str], bool], *, flatten: bool = True) -> str:
    """A local directory in DeepSpeed's layout ({dir}/{tag}/files) with the checkpoint's files that `wanted`
    accepts (by path in the manifest): links to local files, copies of remote ones. `flatten`: the rank files of a
    checkpoint, side by side; else every file at its own relative path (a universal form). The caller removes it."""
    root = tempfile.mkdtemp(prefix="tandem-ds-")
    tag_dir = os.path.join(root, tag)
    os.makedirs(tag_dir)
    for entry in ckpt.manifest["files"]:
        path = entry["path"]
        if (flatten and not path.startswith("rank-")) or not wanted(path):
            continue
        source = join(ckpt.url, path)
        target = os.path.join(tag_dir, os.path.basename(path) if flatten else path)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        if is_local(source):
            os.symlink(local_path(source), target)
        else:
            get_file(source, target)
    return root


def objective_state(ckpt: CompleteCheckpoint) -> dict[str, Any] | None:
    """What the objective kept in a checkpoint (rank 0's trainer state: the same on every rank), or None."""
    url = join(ckpt.url, layout.rank_dir_name(0), TRAINER_STATE)
    state = torch.load(io.BytesIO(read_bytes(url)), weights_only=False)  # our own, digest-verified
    kept = state.get("objective")
    return kept if isinstance(kept, dict) else None


def load_checkpoint(engine: Any, ckpt: CompleteCheckpoint, dist: Dist, *, frozen_excluded: bool) -> int:
    """Load model, optimizer, scheduler and this rank's RNG state; returns the step to continue from."""
    root = deepspeed_layout(ckpt, DS_TAG, lambda path: not path.endswith(TRAINER_STATE))
    try:
        path, _ = engine.load_checkpoint(
            root,
            tag=DS_TAG,
            load_module_strict=not frozen_excluded,
            load_optimizer_states=True,
            load_lr_scheduler_states=True,
        )
        if path is None:
            raise UserError(f"{ckpt.url}: DeepSpeed could not load it; see the log above")
        state_url = join(ckpt.url, layout.rank_dir_name(dist.rank), TRAINER_STATE)
        state = torch.load(io.BytesIO(read_bytes(state_url)), weights_only=False)  # our own, digest-verified
    finally:
        shutil.rmtree(root, ignore_errors=True)
    set_rng_state(state["rng"])
    log.info("resumed from step %d (%s)", state["step"], ckpt.url)
    return int(state["step"])
