"""A run's spec as the pipeline builds it (pipeline/plan.py `build_spec`), for tests that need one without staging data:
the default preset on a storage folder, a dataset reference with 100 train records, and a config's overrides."""

from __future__ import annotations

from config.loader import load_config
from pipeline.plan import build_spec
from storage.spec import DatasetRef, Spec


def spec_for(tmp_path, overrides: list[str], model: str | None = None) -> Spec:
    """The spec of run `r` on `tmp_path`: a global batch of 12 in micro-batches of 2, 8 steps, then `overrides`; the
    model at `model` (a directory: the `tiny_model` fixture's), else `tmp_path` itself."""
    cfg = load_config(
        None,
        [
            f"run.storage={tmp_path}",
            "train.global_batch_size=12",
            "train.micro_batch_size=2",
            "train.max_steps=8",
            *overrides,
        ],
    )
    return build_spec(
        cfg,
        "r",
        model or str(tmp_path),
        DatasetRef(dataset_id="d", url=str(tmp_path), manifest_digest="x", split_records={"train": 100}),
    )
