"""Whole-or-nothing sharded checkpoints, retention, and the exported model (DESIGN.md "Storage contracts").

Each rank saves its own DeepSpeed shard into `rank-{r:05d}/` (DeepSpeed's tag is the rank directory,
so no file ever needs to be sorted by owner), digests it, and rank 0 writes manifest.json, checks
that every listed file is there with its size, and only then writes COMPLETE with the manifest's
digest. A directory without COMPLETE does not exist for any reader. LoRA/Q-LoRA checkpoints leave
out the frozen base (DeepSpeed's exclude_frozen_parameters): it is in model.name_or_path already.
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

from storage import layout
from storage.checkpoints import complete_checkpoints, read_complete, step_dirs
from storage.digest import digest_bytes, digest_url
from config.errors import UserError
from storage.manifest import verify_files
from storage.fs import (exists, filesystem, is_local, join, local_path, put_file, read_json, remove,
                            with_retries, write_bytes_atomic, write_json_atomic)
from trainer import faults
from trainer.distributed import Dist, barrier, gather_objects

log = logging.getLogger(__name__)
TRAINER_STATE = "trainer_state.pt"


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


def save_checkpoint(engine: Any, *, run_url: str, step: int, meta: dict[str, Any], dist: Dist, algorithm: str,
                    exclude_frozen: bool) -> tuple[str, int]:
    """Save step `step` under checkpoints/step-N with manifest and COMPLETE; returns (URL, bytes written)."""
    url = layout.checkpoint_dir(run_url, step)
    if read_complete(url) is not None:
        raise UserError(f"{url} is already complete; refusing to overwrite a checkpoint (use a new run.name)")
    rank_dir = layout.rank_dir_name(dist.rank)
    local = is_local(url)
    root = local_path(url) if local else tempfile.mkdtemp(prefix="tandem-ckpt-")
    if dist.is_main:
        _remove(url)  # leftovers of a save that never reached COMPLETE
    barrier()
    engine.save_checkpoint(root, tag=rank_dir, client_state={"step": step}, save_latest=False,
                           exclude_frozen_parameters=exclude_frozen)
    torch.save({"step": step, "rank": dist.rank, "rng": rng_state()}, os.path.join(root, rank_dir, TRAINER_STATE))
    mine = _rank_files(root, rank_dir, with_root_files=dist.is_main)
    if not local:
        for rel in mine:
            put_file(os.path.join(root, rel), join(url, rel))
    faults.in_save(dist.rank, step, "after_shard")
    entries = []
    for rel in mine:
        digest, size = digest_url(join(url, rel), algorithm)
        entries.append({"path": rel, "size": size, "digest": digest, "rank": dist.rank, "host": dist.host})
    all_entries = [e for per_rank in gather_objects(entries, dist) for e in per_rank]
    if dist.is_main:
        manifest = {"schema": layout.CHECKPOINT_SCHEMA, **meta, "step": step, "world_size": dist.world_size,
                    "digest_algorithm": algorithm, "files": all_entries}
        raw = write_json_atomic(join(url, layout.MANIFEST), manifest)
        verify_files(url, manifest, mode="size")
        faults.in_save(dist.rank, step, "before_complete")
        write_bytes_atomic(join(url, layout.COMPLETE), (digest_bytes(raw, algorithm) + "\n").encode())
        log.info("checkpoint step %d complete: %d files at %s", step, len(all_entries), url)
    if not local:
        shutil.rmtree(root, ignore_errors=True)
    barrier()
    return url, sum(e["size"] for e in all_entries)


def _remove(url: str) -> None:
    """Delete a checkpoint directory, COMPLETE first, so a crash half way leaves an incomplete one."""
    if not exists(url):
        return
    remove(join(url, layout.COMPLETE))
    remove(url, recursive=True)


def apply_retention(run_url: str, keep_latest_k: int | None) -> list[int]:
    """Delete complete checkpoints beyond the newest k, and incomplete ones older than the newest
    complete; never the newest complete one. Returns the deleted steps."""
    complete = complete_checkpoints(run_url)
    if not complete:
        return []
    newest = complete[0].step
    doomed = [c.step for c in complete[keep_latest_k:]] if keep_latest_k else []
    complete_steps = {c.step for c in complete}
    doomed += [step for step, _ in step_dirs(run_url) if step < newest and step not in complete_steps]
    for step in sorted(doomed):
        _remove(layout.checkpoint_dir(run_url, step))
    if doomed:
        log.info("retention (keep_latest_k=%s): deleted steps %s", keep_latest_k, sorted(doomed))
    return sorted(doomed)


def export_final(engine: Any, *, run_url: str, model_path: str, step: int, zero_stage: int, merged: bool,
                 dist: Dist) -> str:
    """Write the trained model to {run}/final in Hugging Face format (adapter or full), COMPLETE last."""
    url = layout.final_dir(run_url)
    if exists(join(url, layout.COMPLETE)) and read_json(join(url, layout.MANIFEST)).get("step") == step:
        log.info("final model for step %d already exported at %s", step, url)
        return url
    model = engine.module
    gather: Any = contextlib.nullcontext()
    if zero_stage == 3:  # parameters are partitioned: gather them whole before saving
        import deepspeed

        gather = deepspeed.zero.GatheredParameters(list(model.parameters()), modifier_rank=None)
    staging = tempfile.mkdtemp(prefix="tandem-final-") if dist.is_main else ""
    with gather:
        if dist.is_main:
            model.save_pretrained(staging, safe_serialization=True)
    if dist.is_main:
        from transformers import AutoTokenizer

        AutoTokenizer.from_pretrained(model_path).save_pretrained(staging)
        if merged and os.path.exists(os.path.join(staging, "adapter_config.json")):
            _merge_adapter(model_path, staging, os.path.join(staging, "merged"))
        _publish_dir(staging, url, step)
    barrier()
    return url


def _merge_adapter(model_path: str, adapter_dir: str, out: str) -> None:
    """Base (full precision, even for Q-LoRA) + adapter merged into plain weights, saved to `out`."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base = AutoModelForCausalLM.from_pretrained(model_path)
    merged = PeftModel.from_pretrained(base, adapter_dir).merge_and_unload()
    merged.save_pretrained(out, safe_serialization=True)
    AutoTokenizer.from_pretrained(model_path).save_pretrained(out)


def _publish_dir(staging: str, url: str, step: int, algorithm: str = "blake3") -> None:
    """Move a finished local directory to `url`, then write manifest.json and COMPLETE (the commit)."""
    files = []
    for dirpath, _, names in os.walk(staging):
        for name in names:
            rel = os.path.relpath(os.path.join(dirpath, name), staging)
            digest, size = digest_url(os.path.join(dirpath, name), algorithm)
            files.append({"path": rel, "size": size, "digest": digest})
    manifest = {"schema": layout.MODEL_SCHEMA, "step": step, "digest_algorithm": algorithm,
                "files": sorted(files, key=lambda f: f["path"])}
    _remove(url)  # an older export (COMPLETE removed first) or an interrupted one
    if is_local(url):
        os.makedirs(os.path.dirname(local_path(url)), exist_ok=True)
        shutil.move(staging, local_path(url))
    else:
        fs, remote = filesystem(url)
        with_retries("upload", url, lambda: fs.put(staging, remote, recursive=True))
        shutil.rmtree(staging, ignore_errors=True)
    raw = write_json_atomic(join(url, layout.MANIFEST), manifest)
    write_bytes_atomic(join(url, layout.COMPLETE), (digest_bytes(raw, algorithm) + "\n").encode())
