"""Run identity and the resolved spec.json that every node and rank reads."""

from __future__ import annotations

import secrets
from datetime import UTC, datetime

from prefect import get_run_logger, task

from config.schema import FinetuneConfig
from storage.spec import DatasetRef, WrittenSpec, build_spec, publish_spec

__all__ = ["build_spec", "new_run_id", "write_run_spec"]


def new_run_id(cfg: FinetuneConfig) -> str:
    """run.name when set (re-running it continues that run), else time + a short random suffix."""
    if cfg.run.name:
        return cfg.run.name
    return datetime.now(UTC).strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(3)


@task(name="write-spec")
def write_run_spec(cfg: FinetuneConfig, run_id: str, model_path: str, dataset: DatasetRef) -> WrittenSpec:
    """Write {run}/spec.json; returns the spec with its URL and sha256."""
    written = publish_spec(build_spec(cfg, run_id, model_path, dataset))
    get_run_logger().info("run %s: spec %s (sha256 %s)", run_id, written.url, written.digest[:12])
    return written
