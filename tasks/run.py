"""Run identity and the resolved spec.json that every node and rank reads."""

from __future__ import annotations

import secrets
from datetime import UTC, datetime

from prefect import get_run_logger, task

from storage import layout
from config.chat_template import resolve_chat_template
from config.deepspeed import read_deepspeed_json, resolve_from_train
from config.schema import FinetuneConfig
from storage.manifest import read_manifest
from storage.shards import split_rows
from storage.spec import DatasetRef, Spec, WrittenSpec, publish_spec, total_steps
from config.version import code_version


def new_run_id(cfg: FinetuneConfig) -> str:
    """run.name when set (re-running it continues that run), else time + a short random suffix."""
    if cfg.run.name:
        return cfg.run.name
    return datetime.now(UTC).strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(3)


def build_spec(cfg: FinetuneConfig, run_id: str, model_path: str, dataset: DatasetRef) -> Spec:
    """Resolve the config once: world size, DeepSpeed "auto" values, absolute locations."""
    ds = resolve_from_train(read_deepspeed_json(cfg.deepspeed.config), cfg.train, cfg.world_size)
    train_records = dataset.records("train")
    if train_records is None:  # a reference read back from spec.json carries no counts
        train_records = split_rows(read_manifest(dataset.url, layout.DATASET_SCHEMA)[0]["splits"]["train"])
    steps = total_steps(cfg.train, train_records, cfg.world_size)
    return Spec(
        run_id=run_id,
        run_url=layout.run_dir(cfg.run.storage, run_id),
        config=cfg,
        deepspeed=ds,
        world_size=cfg.world_size,
        total_steps=steps,
        model_path=model_path,
        dataset=dataset,
        code_version=code_version(),
        chat_template=resolve_chat_template(cfg.model.chat_template),
    )


@task(name="write-spec")
def write_run_spec(cfg: FinetuneConfig, run_id: str, model_path: str, dataset: DatasetRef) -> WrittenSpec:
    """Write {run}/spec.json; returns the spec with its URL and sha256."""
    written = publish_spec(build_spec(cfg, run_id, model_path, dataset))
    get_run_logger().info("run %s: spec %s (sha256 %s)", run_id, written.url, written.digest[:12])
    return written
