"""Scenario 3, corruption: one flipped bit in a staged data shard, in a checkpoint file (a shard, its manifest
or its COMPLETE marker), or in a registry entry. Each must be detected before the bytes are used, with a
message naming the file, and nothing may be overwritten: the damaged file stays as it is (or is moved aside,
for a checkpoint) for inspection.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from torch.testing import assert_close

from core.errors import UserError
from storage import layout
from storage.location import Location, local_path
from storage.registry import entry_url, read_entry, register_version, resolve
from storage.spec import DatasetRef
from tests.chaos.runs import flip_byte, run_processes
from tests.distributed.harness import Run, Staged, train
from tests.registry_helpers import entry


def test_a_flipped_bit_in_a_staged_data_shard(
    staged: Staged, chaos_run: int, chaos_rng, chaos_record, tmp_path
) -> None:
    storage = tmp_path / "storage"
    copy = storage / "datasets" / staged.dataset.dataset_id
    shutil.copytree(staged.dataset.url, copy)
    manifest = json.loads((copy / layout.MANIFEST).read_text())
    victim = copy / chaos_rng.choice(manifest["files"])["path"]
    _, damaged = flip_byte(victim, chaos_rng)
    mine = Staged(
        storage,
        staged.model_path,
        DatasetRef(dataset_id=staged.dataset.dataset_id, url=str(copy), manifest_digest=staged.dataset.manifest_digest),
    )
    name = f"data-corrupt-{chaos_run}"
    with pytest.raises(UserError) as info:
        train(mine, name, ["launch.nnodes=2"])
    run_dir = storage / "runs" / name
    untouched = victim.read_bytes() == damaged and json.loads((copy / layout.MANIFEST).read_text()) == manifest
    chaos_record("corruption: staged data shard", data_lost=not untouched, file=str(victim.relative_to(copy)))
    assert str(info.value).startswith(f"node 0: {victim}: blake3 digest mismatch: expected ")
    assert not (run_dir / layout.METRICS).exists() and not (run_dir / "checkpoints").exists()  # before training
    assert not run_processes(name)
    assert untouched


def test_a_flipped_bit_in_a_checkpoint_shard(
    staged: Staged, chaos_reference: Run, chaos_run: int, chaos_rng, chaos_record
) -> None:
    name = f"ckpt-corrupt-{chaos_run}"
    run_dir = Path(staged.storage) / "runs" / name
    (run_dir / "checkpoints").mkdir(parents=True)
    for step in (8, 12):  # the reference's newest two checkpoints and its trajectory up to them
        source = chaos_reference.checkpoint(step)
        shutil.copytree(source, run_dir / "checkpoints" / source.name, symlinks=True)
    shutil.copy(chaos_reference.run_dir / layout.METRICS, run_dir / layout.METRICS)
    newest = run_dir / "checkpoints" / "step-00000012"
    manifest = json.loads((newest / layout.MANIFEST).read_text())
    relpath = chaos_rng.choice([f["path"] for f in manifest["files"]] + [layout.MANIFEST, layout.COMPLETE])
    _, damaged = flip_byte(newest / relpath, chaos_rng)

    resumed = train(staged, name, ["launch.nnodes=2"])
    log = (run_dir / "nodes" / "0" / "log.txt").read_text()
    aside = [p for p in (run_dir / "checkpoints").iterdir() if p.name.startswith("corrupt-step-00000012-")]
    kept = len(aside) == 1 and (aside[0] / relpath).read_bytes() == damaged
    chaos_record("corruption: checkpoint file", data_lost=not kept, file=relpath)
    refusals = [line for line in log.splitlines() if "not resuming from step 12: " in line]
    assert refusals and all(str(newest / relpath) in line for line in refusals), refusals
    assert "resumed from step 8 " in log and "resumed from step 12 " not in log
    assert_close(resumed.losses(), chaos_reference.losses(), rtol=1e-9, atol=1e-9)  # steps 9-12 trained again
    assert kept  # moved aside with its damage, for inspection; never overwritten in place


def test_a_flipped_bit_in_a_registry_entry(chaos_run: int, chaos_rng, chaos_record, tmp_path) -> None:
    storage, model = Location(str(tmp_path)), "chaos-model"
    version, url = register_version(storage, model, entry(2.5, f"writer-{chaos_run}"))
    offset, damaged = flip_byte(Path(local_path(url)), chaos_rng)
    with pytest.raises(UserError) as by_version:
        read_entry(storage, model, version)
    with pytest.raises(UserError) as by_name:
        resolve(storage, model)  # the newest version, as `python -m flows.registry show MODEL` reads it
    following, _ = register_version(storage, model, entry(2.4, "next"))
    untouched = Path(local_path(url)).read_bytes() == damaged
    chaos_record("corruption: registry entry", data_lost=not untouched, offset=offset)
    for info in (by_version, by_name):
        assert str(info.value).startswith(f"{url}: ") and "the registry file is corrupt" in str(info.value)
    assert following == version + 1 and read_entry(storage, model, following)["writer"] == "next"
    assert untouched and entry_url(storage, model, version) == url
