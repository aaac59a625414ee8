"""Writing the run's spec: the base model recorded in {run}/base_model.json first, then spec.json, whose digest is the
one the spec carries to every node."""

from __future__ import annotations

import hashlib
import json

from prefect.logging import disable_run_logger

from config.loader import load_config
from storage.spec import DatasetRef, load_spec
from tasks.run import write_run_spec


def test_the_spec_names_the_recorded_base_model(tmp_path, tiny_model) -> None:
    cfg = load_config(None, [f"run.storage={tmp_path}", f"model.name_or_path={tiny_model}", "train.max_steps=5"])
    dataset = DatasetRef(dataset_id="ds-1", url=str(tmp_path / "d"), manifest_digest="m", split_records={"train": 40})
    with disable_run_logger():
        written = write_run_spec.fn(cfg, "r1", tiny_model, dataset)
    run = tmp_path / "runs" / "r1"
    base_model = (run / "base_model.json").read_bytes()
    assert written.spec.model_manifest_digest == hashlib.sha256(base_model).hexdigest()
    assert {f["path"] for f in json.loads(base_model)["files"]} >= {"config.json", "tokenizer.json"}
    spec, digest = load_spec(written.url)
    assert digest == written.digest == hashlib.sha256((run / "spec.json").read_bytes()).hexdigest()
    assert (spec.run_id, spec.total_steps, spec.model_path) == ("r1", 5, tiny_model)
