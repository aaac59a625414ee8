"""Whole-or-nothing sharded checkpoints and the exported model (DESIGN.md "Storage contracts").

Each rank saves its own DeepSpeed shard into `rank-{r:05d}/` (DeepSpeed's tag is the rank directory,
so no file ever needs to be sorted by owner), digests it, and rank 0 writes manifest.json, checks
that every listed file is there with its size, and only then writes COMPLETE with the manifest's
digest. A directory without COMPLETE does not exist for any reader.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import shutil
import tempfile
from typing import Any

import numpy as np
import torch

from config import layout
from config.digest import digest_bytes, digest_url
from config.errors import UserError
from config.manifest import verify_files
from config.storage import exists, filesystem, is_local, join, local_path, write_bytes_atomic, write_json_atomic
from trainer.distributed import Dist, barrier, gather_objects

log = logging.getLogger(__name__)
TRAINER_STATE = "trainer_state.pt"


def rng_state() -> dict[str, Any]:
    """Every RNG this process uses, for exact resume."""
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _rank_files(root: str, rank_dir: str, with_root_files: bool) -> list[str]:
    """Files under root/rank_dir (plus, for rank 0, DeepSpeed's scripts at the root), relative to root."""
    out = []
    if with_root_files:  # DeepSpeed's rank 0 drops zero_to_fp32.py next to the tags; list it too
        out += [n for n in os.listdir(root) if os.path.isfile(os.path.join(root, n)) and not n.startswith(".")]
    for dirpath, _, names in os.walk(os.path.join(root, rank_dir)):
        for name in names:
            out.append(os.path.relpath(os.path.join(dirpath, name), root))
    return sorted(out)


def save_checkpoint(engine: Any, *, run_url: str, step: int, meta: dict[str, Any], dist: Dist, algorithm: str) -> str:
    """Save step `step` under checkpoints/step-N with manifest and COMPLETE; returns its URL."""
    url = layout.checkpoint_dir(run_url, step)
    if exists(join(url, layout.COMPLETE)):
        raise UserError(f"{url} is already complete; refusing to overwrite a checkpoint (use a new run.name)")
    rank_dir = layout.rank_dir_name(dist.rank)
    local = is_local(url)
    root = local_path(url) if local else tempfile.mkdtemp(prefix="tandem-ckpt-")
    if dist.is_main and local and os.path.isdir(root):
        shutil.rmtree(root)  # leftovers of a save that never reached COMPLETE
    barrier()
    engine.save_checkpoint(root, tag=rank_dir, client_state={"step": step}, save_latest=False)
    torch.save({"step": step, "rank": dist.rank, "rng": rng_state(), **meta}, os.path.join(root, rank_dir, TRAINER_STATE))
    mine = _rank_files(root, rank_dir, with_root_files=dist.is_main)
    if not local:
        fs, _ = filesystem(url)
        for rel in mine:
            fs.put_file(os.path.join(root, rel), filesystem(join(url, rel))[1])
    entries = []
    for rel in mine:
        digest, size = digest_url(join(url, rel), algorithm)
        entries.append({"path": rel, "size": size, "digest": digest, "rank": dist.rank, "host": dist.host})
    all_entries = [e for per_rank in gather_objects(entries, dist) for e in per_rank]
    if dist.is_main:
        manifest = {
            "schema": layout.CHECKPOINT_SCHEMA,
            **meta,
            "step": step,
            "world_size": dist.world_size,
            "digest_algorithm": algorithm,
            "files": all_entries,
        }
        raw = write_json_atomic(join(url, layout.MANIFEST), manifest)
        verify_files(url, manifest, mode="size")
        write_bytes_atomic(join(url, layout.COMPLETE), (digest_bytes(raw, algorithm) + "\n").encode())
        log.info("checkpoint step %d complete: %d files at %s", step, len(all_entries), url)
    if not local:
        shutil.rmtree(root, ignore_errors=True)
    barrier()
    return url


def export_final(engine: Any, *, run_url: str, model_path: str, zero_stage: int, dist: Dist) -> str:
    """Write the trained model to {run}/final in Hugging Face format (adapter or full), COMPLETE last."""
    from transformers import AutoTokenizer

    url = layout.final_dir(run_url)
    model = engine.module
    params = list(model.parameters())
    if zero_stage == 3:
        import deepspeed

        gather = deepspeed.zero.GatheredParameters(params, modifier_rank=None)
    else:
        gather = contextlib.nullcontext()
    with gather:
        if dist.is_main:
            if exists(join(url, layout.COMPLETE)):
                raise UserError(f"{url} already holds a complete export; refusing to overwrite it")
            staging = tempfile.mkdtemp(prefix="tandem-final-")
            model.save_pretrained(staging, safe_serialization=True)
            AutoTokenizer.from_pretrained(model_path).save_pretrained(staging)
            _publish_dir(staging, url)
    barrier()
    return url


def _publish_dir(staging: str, url: str, algorithm: str = "blake3") -> None:
    """Move a finished local directory to `url`, then write manifest.json and COMPLETE (the commit)."""
    files = []
    for dirpath, _, names in os.walk(staging):
        for name in sorted(names):
            rel = os.path.relpath(os.path.join(dirpath, name), staging)
            digest, size = digest_url(os.path.join(dirpath, name), algorithm)
            files.append({"path": rel, "size": size, "digest": digest})
    manifest = {"schema": layout.MODEL_SCHEMA, "digest_algorithm": algorithm, "files": sorted(files, key=lambda f: f["path"])}
    if is_local(url):
        target = local_path(url)
        if os.path.exists(target):
            shutil.rmtree(target)  # no COMPLETE (checked by the caller): an interrupted export
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.move(staging, target)
    else:
        fs, remote = filesystem(url)
        fs.put(staging, remote, recursive=True)
        shutil.rmtree(staging, ignore_errors=True)
    raw = write_json_atomic(join(url, layout.MANIFEST), manifest)
    write_bytes_atomic(join(url, layout.COMPLETE), (digest_bytes(raw, algorithm) + "\n").encode())


