"""The estimate preflight's space check relies on (config/footprint.py), held against the reference run's real
checkpoint and export: parameters x bytes per trained parameter, within 5%."""

from __future__ import annotations

import json
from pathlib import Path

from config.footprint import estimate
from storage import layout
from storage.checkpoints import latest_complete
from storage.fs import find_sizes


def test_the_estimate_matches_the_reference_checkpoint_and_export(reference) -> None:
    spec = reference.spec
    model = json.loads((Path(spec.model_path) / "config.json").read_text())
    footprint = estimate(spec.config, model, spec.total_steps, spec.world_size, bf16=False)  # CPU ranks train in fp32
    assert footprint is not None
    newest = latest_complete(spec.run)
    assert newest is not None
    saved = sum(entry["size"] for entry in newest.manifest["files"])
    # an upper bound (the space check must not pass a run that cannot fit), at most 10% above
    assert saved <= footprint.checkpoint < 1.1 * saved, (footprint.checkpoint, saved)
    weights = sum(
        size for path, size in find_sizes(layout.final_dir(spec.run)).items() if path.endswith(".safetensors")
    )
    assert abs(footprint.export - weights) / weights < 0.05, (footprint.export, weights)
    assert footprint.checkpoints_kept == 3  # keep_latest_k=2, + 1 while a new save completes
