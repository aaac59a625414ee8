"""Resuming on another world size through a checkpoint's universal form: a complete form converted from exactly this
checkpoint is reused, one that fails verification is removed with a retryable error (a retry converts again), and each
rank's random stream starts from (seed, rank, step). The conversion itself, on real DeepSpeed checkpoints, is the
elastic suite's (tests/distributed/test_elastic.py)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from core.errors import RetryableError, UserError
from storage import layout
from storage.checkpoints import read_complete, universal_manifest
from tests.checkpoints import save_checkpoint
from trainer.checkpointing.deepspeed_io import publish_dir
from trainer.checkpointing.reshard import check_sequence_groups, reseed, universal_form
from trainer.parallel.distributed import Dist

ONE = Dist(0, 0, 1, 0, "host", torch.device("cpu"))


def with_universal_form(tmp_path):
    ckpt = read_complete(save_checkpoint(tmp_path, 10, ranks=2))
    assert ckpt is not None
    staging = tmp_path / "staging"
    (staging / "zero" / "layer.0").mkdir(parents=True)
    (staging / "zero" / "layer.0" / "fp32.pt").write_bytes(b"fp32 weights")
    (staging / "mp_rank_00_model_states.pt").write_bytes(b"model states")
    publish_dir(str(staging), layout.universal_dir(ckpt.url), "blake3", lambda f: universal_manifest(ckpt, "blake3", f))
    return ckpt


def test_a_complete_universal_form_of_this_checkpoint_is_reused(tmp_path, caplog) -> None:
    ckpt = with_universal_form(tmp_path)
    with caplog.at_level("INFO", logger="trainer.checkpointing.reshard"):
        found = universal_form(ckpt, ONE, "blake3")
    assert "reusing the universal form of checkpoint step 10" in caplog.text
    assert found.manifest["source_manifest_digest"] == ckpt.manifest_digest and found.manifest["source_world_size"] == 2


def test_a_universal_form_that_fails_verification_is_removed_for_the_retry(tmp_path) -> None:
    ckpt = with_universal_form(tmp_path)
    weights = Path(str(layout.universal_dir(ckpt.url))) / "zero" / "layer.0" / "fp32.pt"
    weights.write_bytes(b"FP32 WEIGHTS")  # same size, other bytes
    with pytest.raises(RetryableError, match=r"/universal: .*fp32.pt: blake3 digest .*; it was removed, a retry conv"):
        universal_form(ckpt, ONE, "blake3")
    assert not Path(str(layout.universal_dir(ckpt.url))).exists()


def test_each_ranks_stream_starts_from_the_seed_its_rank_and_the_step() -> None:
    def stream(seed: int, rank: int, step: int) -> tuple[float, float]:
        reseed(seed, rank, step)
        return random.random(), float(torch.rand(1))

    assert stream(42, 1, 100) == stream(42, 1, 100)
    assert len({stream(42, 0, 100), stream(42, 1, 100), stream(42, 1, 101), stream(7, 1, 100)}) == 4


def manifest(world: int, size: int | None) -> dict:
    """A checkpoint manifest's layout fields (size None: written before the size was recorded)."""
    return {"step": 8, "world_size": world, **({} if size is None else {"sequence_parallel_size": size})}


def test_another_world_size_with_sequence_groups_on_either_side_is_refused_in_one_line() -> None:
    """DeepSpeed's conversion cannot merge a writer's sequence groups and its universal loader cannot take a
    reader's: refused before any conversion, naming both layouts and the fix; the same world size at any size, or
    size 1 on both sides (an old manifest counts as 1), passes."""
    two_split = Dist(0, 0, 2, 0, "host", torch.device("cpu"), 2, 2)
    one = Dist(0, 0, 1, 0, "host", torch.device("cpu"), 1)
    with pytest.raises(UserError) as info:
        check_sequence_groups(manifest(1, 1), two_split)
    assert str(info.value) == (
        "checkpoint step 8 was written by 1 ranks at train.sequence_parallel_size=1 and this run has 2 ranks at 2; "
        "DeepSpeed converts a checkpoint to another world size only without sequence parallelism on either side: "
        "resume it on 1 ranks (any train.sequence_parallel_size; one saved there at size 1 then resumes on any world "
        "size)"
    )
    with pytest.raises(UserError, match=r"written by 2 ranks at train\.sequence_parallel_size=2 and this run has 1 "):
        check_sequence_groups(manifest(2, 2), one)  # the gap: it used to fail inside ds_to_universal
    check_sequence_groups(manifest(2, 2), two_split)
    check_sequence_groups(manifest(2, 1), one)
    check_sequence_groups(manifest(2, None), one)
    check_sequence_groups(manifest(2, 2), Dist(0, 0, 2, 0, "host", torch.device("cpu"), 2))
