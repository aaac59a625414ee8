"""A run directory written by an earlier version (tests/fixtures/compat-run, see make_compat_run.py) still
evaluates to the same numbers, registers, and resumes with the code of this checkout."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from config.loader import load_config
from launch.job import EVAL, TRAIN
from launch.phase import run_phase
from pipeline.lineage import registry_entry
from pipeline.plan import build_spec
from storage import layout
from storage.checkpoints import latest_complete
from storage.fs import read_json
from storage.location import Location, join
from storage.manifest import read_manifest
from storage.registry import read_entry, register_version
from storage.spec import DatasetRef, WrittenSpec, load_spec, write_spec
from tests.fixtures.make_compat_run import FIXTURE, OVERRIDES, PLACEHOLDER, REPO_PLACEHOLDER, ROOT, RUN, rewrite_text


def materialize(storage: Path) -> None:
    """Copy the fixture to `storage` with the placeholders replaced by real paths."""
    shutil.copytree(FIXTURE, storage)
    rewrite_text(storage, [(PLACEHOLDER, str(storage)), (REPO_PLACEHOLDER, str(ROOT))])


@pytest.mark.multirun  # an evaluation, a registration and a resumed run: about 30 s
def test_old_run_directory_evaluates_registers_and_resumes(tmp_path: Path) -> None:
    storage = tmp_path / "storage"
    materialize(storage)
    run_url = Location(str(storage / "runs" / RUN))  # the fixture's place, read through its spec.json
    old_eval = json.loads((storage / "runs" / RUN / layout.EVAL).read_text())
    spec, spec_digest = load_spec(join(run_url, layout.SPEC))
    assert spec.run == run_url  # its run_url, read as the run's location
    manifest, manifest_digest = read_manifest(spec.dataset_dir, layout.DATASET_SCHEMA)
    dataset = DatasetRef(dataset_id=manifest["dataset_id"], url=spec.dataset.url, manifest_digest=manifest_digest)
    spec = spec.model_copy(update={"dataset": dataset})
    spec_digest = write_spec(spec)
    spec_url = join(run_url, layout.SPEC)

    # Evaluate the old checkpoint: the same all-reduced sums as the code that wrote it.
    checkpoint = latest_complete(run_url)
    assert checkpoint is not None and checkpoint.step == 4
    run_phase(WrittenSpec(spec, spec_url, spec_digest), EVAL, lambda _: None, model=checkpoint.url)
    metrics = read_json(join(run_url, layout.EVAL))
    assert metrics["schema"] == layout.EVAL_SCHEMA
    for key in ("target_tokens", "correct_tokens", "examples", "world_size"):
        assert metrics[key] == old_eval[key], key
    assert metrics["loss_sum"] == pytest.approx(old_eval["loss_sum"], rel=1e-6)

    # Register it: the registry entry names the old checkpoint's manifest digest.
    entry = registry_entry(spec, spec_digest, checkpoint, layout.final_dir(run_url), metrics)
    version, _ = register_version(Location(str(storage)), spec.config.register.model_name, entry)
    doc = read_entry(Location(str(storage)), spec.config.register.model_name, version)
    assert doc["lineage"]["checkpoint_manifest_digest"] == checkpoint.manifest_digest
    assert doc["lineage"]["dataset_manifest_digest"] == manifest_digest

    # Resume: two more steps continue from step 4; retention (keep_latest_k=1) then drops step 4.
    cfg = load_config(
        None,
        [
            f"run.storage={storage}",
            f"run.name={RUN}",
            f"model.name_or_path={spec.model_path}",
            f"data.source={storage / 'sources' / 'conversations.json'}",
            *[o.replace("train.max_steps=4", "train.max_steps=6") for o in OVERRIDES],
        ],
    )
    resumed = build_spec(cfg, RUN, spec.model_path, dataset)
    digest = write_spec(resumed)
    run_phase(WrittenSpec(resumed, spec_url, digest), TRAIN, lambda _: None)
    lines = [json.loads(line) for line in (storage / "runs" / RUN / layout.METRICS).read_text().splitlines()]
    steps = [r["step"] for r in lines if "event" not in r]
    assert steps == [1, 2, 3, 4, 5, 6]
    final = latest_complete(run_url)
    assert final is not None and final.step == 6
    assert [p.name for p in (storage / "runs" / RUN / "checkpoints").iterdir()] == ["step-00000006"]
