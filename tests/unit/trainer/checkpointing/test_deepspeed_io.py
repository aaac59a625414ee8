"""What a rank does with checkpoint files besides DeepSpeed's own save and load (which need an engine: the distributed
tests): its random state captured and restored exactly, a finished directory published with its manifest and COMPLETE
last, and a checkpoint's files laid out as DeepSpeed reads them."""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path

import numpy as np
import torch

from storage.checkpoints import model_manifest, read_complete, verified_export_step
from storage.location import Location, join
from tests.checkpoints import save_checkpoint, shard_path
from trainer.checkpointing.deepspeed_io import deepspeed_layout, publish_dir, rng_state, set_rng_state


def draws() -> tuple:
    return random.random(), float(np.random.rand()), float(torch.rand(1))


def test_the_random_state_comes_back_exactly() -> None:
    state = rng_state()
    first = draws()
    draws()
    set_rng_state(state)
    assert draws() == first


def test_a_published_directory_is_committed_last(tmp_path, s3_bucket) -> None:
    for target in (Location(str(tmp_path / "run" / "final")), join(s3_bucket, "run/final")):
        staging = tmp_path / "staging"
        (staging / "sub").mkdir(parents=True)
        (staging / "model.safetensors").write_bytes(b"w" * 100)
        (staging / "sub" / "config.json").write_text("{}")
        published = publish_dir(str(staging), target, "blake3", lambda files: model_manifest(12, "blake3", files))
        assert published == 102 and not staging.exists()
        assert verified_export_step(target) == 12  # every file, by digest


def test_a_checkpoint_is_laid_out_as_deepspeed_reads_it(tmp_path) -> None:
    ckpt = read_complete(save_checkpoint(tmp_path, 10, ranks=2))
    assert ckpt is not None
    flat = Path(deepspeed_layout(ckpt, "merged", lambda path: not path.startswith("rank-00001/")))
    nested = Path(deepspeed_layout(ckpt, "universal", lambda path: True, flatten=False))
    try:
        assert sorted(os.listdir(flat / "merged")) == ["zero_pp_rank_0_mp_rank_00_optim_states.pt"]
        assert sorted(str(p.relative_to(nested)) for p in nested.rglob("*.pt")) == [
            f"universal/{shard_path(0)}",
            f"universal/{shard_path(1)}",
        ]
        linked = nested / "universal" / shard_path(1)
        assert linked.is_symlink() and linked.read_bytes() == b"weights\x01"  # linked, not copied, when local
    finally:
        shutil.rmtree(flat)
        shutil.rmtree(nested)
