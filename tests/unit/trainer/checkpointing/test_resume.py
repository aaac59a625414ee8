"""Which checkpoint a run resumes from (train.resume auto, never or a URL): the newest one whose every file matches its
digest; a corrupt one or a damaged committed one moved aside with a warning naming the file and the next one taken; an
explicit checkpoint that fails is an error; another ZeRO stage or method refused with what differs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from config.methods import FULL, LORA
from core.errors import UserError
from storage import layout
from storage.checkpoints import read_complete
from storage.location import Location
from tests.checkpoints import save_checkpoint, shard_path
from trainer.checkpointing.resume import check_compatible, choose_checkpoint, verify_shared
from trainer.parallel.distributed import Dist

ONE = Dist(0, 0, 1, 0, "host", torch.device("cpu"))


def test_auto_takes_the_newest_verified_and_moves_corrupt_and_damaged_ones_aside(tmp_path, caplog) -> None:
    run = Location(str(tmp_path))
    for step in (10, 20, 30):
        save_checkpoint(tmp_path, step, ranks=2)
    save_checkpoint(tmp_path, 40, seal=False)  # unfinished: reported, left for its save to redo
    shard = tmp_path / "checkpoints" / "step-00000030" / shard_path(1)
    shard.write_bytes(shard.read_bytes().upper())  # same size: only the full read sees it
    manifest = tmp_path / "checkpoints" / "step-00000020" / layout.MANIFEST
    with caplog.at_level("WARNING", logger="trainer.checkpointing.resume"):
        chosen = choose_checkpoint("auto", run, ONE)
    assert chosen is not None and chosen.step == 20
    assert "not resuming from step 40: " in caplog.text and "COMPLETE: missing" in caplog.text
    assert f"not resuming from step 30: {shard}: blake3 digest" in caplog.text
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir() if p.name.startswith("corrupt-step-00000030-"))
    manifest.write_text(manifest.read_text().replace('"step": 20', '"step": 21'))  # committed once, damaged now
    with caplog.at_level("WARNING", logger="trainer.checkpointing.resume"):
        again = choose_checkpoint("auto", run, ONE)
    assert again is not None and again.step == 10 and "moved the damaged checkpoint to " in caplog.text
    assert not (tmp_path / "checkpoints" / "step-00000020").exists()
    assert choose_checkpoint("never", run, ONE) is None


def test_an_explicit_checkpoint_must_be_complete_and_whole(tmp_path) -> None:
    run = Location(str(tmp_path))
    url = save_checkpoint(tmp_path, 10)
    chosen = choose_checkpoint(str(url), run, ONE)
    assert chosen is not None and chosen.step == 10 and verify_shared(chosen, ONE) is None
    (Path(str(url)) / shard_path(0)).unlink()
    with pytest.raises(UserError, match=rf"^train.resume={url}: not a complete checkpoint"):
        choose_checkpoint(str(url), run, ONE)
    other = save_checkpoint(tmp_path, 20)
    (Path(str(other)) / shard_path(0)).write_bytes(b"WEIGHTS\0")
    with pytest.raises(UserError, match=r"blake3 digest .* in its manifest; the checkpoint is corrupt, pick another"):
        choose_checkpoint(str(other), run, ONE)


def test_another_zero_stage_or_method_is_refused_with_what_differs(tmp_path) -> None:
    ckpt = read_complete(save_checkpoint(tmp_path, 10, zero_stage=3))
    assert ckpt is not None
    check_compatible(ckpt, zero_stage=3, method=LORA)
    with pytest.raises(UserError) as info:
        check_compatible(ckpt, zero_stage=2, method=FULL)
    assert "its ZeRO stage 3 (this run: 2) and train.method lora (this run: full) differ" in str(info.value)
    assert "set train.resume=never to start over" in str(info.value)


def test_a_checkpoint_of_another_stage_or_method_is_refused_naming_what_differs() -> None:
    from storage.checkpoints import CompleteCheckpoint
    from trainer.checkpointing.resume import check_compatible

    ckpt = CompleteCheckpoint(
        "/runs/r/checkpoints/step-00000008", 8, "d", {"world_size": 2, "zero_stage": 2, "method": "lora"}
    )
    check_compatible(ckpt, zero_stage=2, method=LORA)  # another world size is converted, not refused
    with pytest.raises(UserError) as info:
        check_compatible(ckpt, zero_stage=3, method=FULL)
    assert str(info.value) == (
        "/runs/r/checkpoints/step-00000008 cannot resume this run: its ZeRO stage 2 (this run: 3) and train.method "
        "lora (this run: full) differ; resume with the same DeepSpeed stage and train.method, or set "
        "train.resume=never to start over"
    )
