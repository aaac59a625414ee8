"""Write the resolved spec.json that every node and rank reads."""

from __future__ import annotations

from prefect import get_run_logger, task

from config.schema import FinetuneConfig
from pipeline.plan import build_spec, record_model
from storage.spec import DatasetRef, WrittenSpec, publish_spec


@task(name="write-spec")
def write_run_spec(cfg: FinetuneConfig, run_id: str, model_path: str, dataset: DatasetRef) -> WrittenSpec:
    """Record the base model ({run}/base_model.json) and write {run}/spec.json; returns the spec with its URL and
    sha256."""
    logger = get_run_logger()
    model_digest = record_model(cfg, run_id, model_path)
    logger.info("run %s: base model %s recorded (base_model.json sha256 %s)", run_id, model_path, model_digest[:12])
    written = publish_spec(build_spec(cfg, run_id, model_path, dataset, model_digest))
    logger.info("run %s: spec %s (sha256 %s)", run_id, written.url, written.digest[:12])
    return written
