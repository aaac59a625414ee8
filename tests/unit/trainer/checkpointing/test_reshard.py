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
from trainer.distributed import Dist

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


def test_another_world_size_into_sequence_groups_is_refused_in_one_line() -> None:
    """DeepSpeed's universal loader cannot take Ulysses' groups: refused before any conversion, naming the fix; the
    same world size, or no sequence parallelism, passes."""
    two = Dist(0, 0, 2, 0, "host", torch.device("cpu"), 2, 2)
    with pytest.raises(UserError) as info:
        check_sequence_groups(1, two)
    assert str(info.value) == (
        "train.sequence_parallel_size=2: the checkpoint was written by 1 ranks and this run has 2; DeepSpeed cannot "
        "load a checkpoint of another world size into sequence-parallel groups: resume it on 1 ranks (any "
        "sequence-parallel size), or with train.sequence_parallel_size=1"
    )
    check_sequence_groups(2, two)
    check_sequence_groups(2, Dist(0, 0, 1, 0, "host", torch.device("cpu"), 1))
