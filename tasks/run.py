"""Write the resolved spec.json that every node and rank reads."""

from __future__ import annotations

from prefect import get_run_logger, task

from config.schema import FinetuneConfig
from pipeline.plan import build_spec
from storage.spec import DatasetRef, WrittenSpec, publish_spec


@task(name="write-spec")
def write_run_spec(cfg: FinetuneConfig, run_id: str, model_path: str, dataset: DatasetRef) -> WrittenSpec:
    """Write {run}/spec.json; returns the spec with its URL and sha256."""
    written = publish_spec(build_spec(cfg, run_id, model_path, dataset))
    get_run_logger().info("run %s: spec %s (sha256 %s)", run_id, written.url, written.digest[:12])
    return written
