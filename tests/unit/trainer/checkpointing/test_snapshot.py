"""The host copy a background save takes: values frozen at the copy, storage sharing kept (a tied embedding is
written once, as torch.save writes the original), the same file content once loaded, and the buffers of one save
reused by the next."""

from __future__ import annotations

import io
from collections import OrderedDict

import torch
from deepspeed.runtime.checkpoint_engine.checkpoint_engine import CheckpointCommitInfo

from trainer.checkpointing.snapshot import SnapshotEngine, host_copy, state_bytes


def state() -> dict:
    embed = torch.randn(64, 8)
    flat = torch.randn(100)
    return {
        "module": OrderedDict([("embed", embed), ("lm_head", embed), ("a", flat[:40].view(5, 8)), ("b", flat[40:])]),
        "optimizer": {"state": {0: {"exp_avg": torch.zeros(3), "step": 7}}, "param_groups": [{"lr": 0.1}]},
        "rng": (1, [2, 3]),
    }


def saved(obj: object) -> dict:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=False)


def test_the_copy_keeps_the_values_of_its_moment_and_the_sharing_of_the_original() -> None:
    original = state()
    copied = host_copy(original)
    expected = saved(original)
    original["module"]["embed"].add_(1.0)  # the next optimizer step, in place
    original["module"]["b"].zero_()
    original["optimizer"]["state"][0]["exp_avg"].fill_(5)
    loaded = saved(copied)
    for key in ("embed", "lm_head", "a", "b"):
        assert torch.equal(loaded["module"][key], expected["module"][key]), key
    assert loaded["optimizer"]["state"][0]["exp_avg"].eq(0).all() and loaded["rng"] == (1, [2, 3])
    module = copied["module"]
    assert module["embed"].untyped_storage().data_ptr() == module["lm_head"].untyped_storage().data_ptr()
    assert module["a"].untyped_storage().data_ptr() == module["b"].untyped_storage().data_ptr()
    assert state_bytes(copied) == state_bytes(original) == (64 * 8 + 100 + 3) * 4
    assert type(copied["module"]) is OrderedDict


def test_a_second_save_reuses_the_first_saves_buffers() -> None:
    engine = SnapshotEngine(local_world=1)
    info = CheckpointCommitInfo(tag="t", save_dir="/nonexistent", save_latest=False)
    pointers = []
    for _ in range(2):
        engine.create(info)
        engine.save(state(), "/nonexistent/model.pt")
        snapshot = engine.take()
        assert [f.state is not None for f in snapshot.files] == [True]  # copied to host, not written
        pointers.append(sorted(b.data_ptr() for b in engine.in_use))
    assert pointers[0] == pointers[1] and len(pointers[0]) == 3  # embed, the flat buffer, exp_avg
    engine.release()
    assert not engine.in_use and not engine.spare
