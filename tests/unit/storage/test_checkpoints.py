"""Checkpoint directories on storage: a directory exists for readers only when its COMPLETE matches its manifest and
every file has its size; the newest such one is resumed; retention deletes beyond the newest k and never the newest
complete; an export's step is trusted only after a full read."""

from __future__ import annotations

from pathlib import Path

from storage import layout
from storage.checkpoints import (
    apply_retention,
    commit,
    complete_checkpoints,
    inspect,
    latest_complete,
    model_manifest,
    read_complete,
    retention_doomed,
    step_of,
    verified_export_step,
)
from storage.digest import digest_bytes
from storage.location import Location
from tests.checkpoints import save_checkpoint, shard_path


def test_only_sealed_checkpoints_exist_and_the_newest_is_found(tmp_path) -> None:
    save_checkpoint(tmp_path, 10)
    save_checkpoint(tmp_path, 20)
    save_checkpoint(tmp_path, 30, seal=False)  # a save that died before COMPLETE
    newest = latest_complete(Location(str(tmp_path)))
    assert newest is not None and newest.step == 20 and newest.manifest["files"][0]["path"] == shard_path(0)
    assert [c.step for c in complete_checkpoints(Location(str(tmp_path)))] == [20, 10]
    assert inspect(layout.checkpoint_dir(Location(str(tmp_path)), 30)).endswith(
        "COMPLETE: missing (the save did not finish)"
    )
    assert (step_of("step-00000020"), step_of("step-x"), step_of("universal")) == (20, None, None)


def test_a_changed_manifest_or_a_truncated_file_unmakes_a_checkpoint(tmp_path) -> None:
    url = save_checkpoint(tmp_path, 10)
    folder = Path(str(url))
    (folder / layout.MANIFEST).write_text((folder / layout.MANIFEST).read_text().replace('"step": 10', '"step": 11'))
    reason = inspect(url)
    assert isinstance(reason, str) and "manifest or its marker changed after the save" in reason
    url = save_checkpoint(tmp_path, 20)
    (Path(str(url)) / shard_path(0)).write_bytes(b"we")
    assert read_complete(url) is None
    assert "size 2 != expected 8" in str(inspect(url))
    assert latest_complete(Location(str(tmp_path))) is None


def test_retention_keeps_the_newest_k_and_drops_older_incomplete_ones(tmp_path) -> None:
    run = Location(str(tmp_path))
    for step in (10, 20, 30, 40):
        save_checkpoint(tmp_path, step)
    save_checkpoint(tmp_path, 25, seal=False)  # incomplete, older than the newest complete: retention's too
    save_checkpoint(tmp_path, 50, seal=False)  # incomplete and newest: a save in flight, left alone
    assert retention_doomed(run, None) == [25]
    assert apply_retention(run, 2) == [10, 20, 25]
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == [
        "step-00000030",
        "step-00000040",
        "step-00000050",
    ]
    assert [c.step for c in complete_checkpoints(run)] == [40, 30]


def test_an_exports_step_is_trusted_only_when_every_byte_matches(tmp_path) -> None:
    final = layout.final_dir(Location(str(tmp_path)))
    Path(str(final)).mkdir(parents=True)
    body = b"safetensors bytes"
    (Path(str(final)) / "model.safetensors").write_bytes(body)
    files = [{"path": "model.safetensors", "size": len(body), "digest": digest_bytes(body, "blake3")}]
    assert verified_export_step(final) is None  # not committed yet
    commit(final, model_manifest(12, "blake3", files))
    assert verified_export_step(final) == 12
    (Path(str(final)) / "model.safetensors").write_bytes(body.upper())  # same size, other bytes
    assert verified_export_step(final) is None
