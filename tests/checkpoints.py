"""A checkpoint directory as the trainer commits one (its rank files, then manifest.json, then COMPLETE), for the tests
of what reads, verifies, resumes or retains checkpoints without training a model."""

from __future__ import annotations

from pathlib import Path

from storage import layout
from storage.checkpoints import checkpoint_manifest, commit
from storage.digest import digest_bytes
from storage.location import Location


def shard_path(rank: int) -> str:
    """A rank's file in a checkpoint, named as DeepSpeed names it (relative to the checkpoint)."""
    return f"{layout.rank_dir_name(rank)}/zero_pp_rank_{rank}_mp_rank_00_optim_states.pt"


def save_checkpoint(
    run: Path, step: int, *, seal: bool = True, payload: bytes = b"weights", ranks: int = 1, zero_stage: int = 2
) -> Location:
    """A checkpoint of `step` under the run directory `run` with one file per rank; unsealed: a save that died
    before COMPLETE."""
    url = layout.checkpoint_dir(Location(str(run)), step)
    files = []
    for rank in range(ranks):
        path, body = shard_path(rank), payload + bytes([rank])
        (Path(str(url)) / path).parent.mkdir(parents=True)
        (Path(str(url)) / path).write_bytes(body)
        files.append({"path": path, "size": len(body), "digest": digest_bytes(body, "blake3")})
    manifest = checkpoint_manifest(step, ranks, {"zero_stage": zero_stage, "method": "lora"}, "blake3", files)
    if seal:
        commit(url, manifest, verify=True)
    else:
        (Path(str(url)) / layout.MANIFEST).write_text("{}")
    return url
