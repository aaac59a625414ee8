"""Prepare: resolve the base model (building a built-in one), then stage the dataset."""

from __future__ import annotations

from typing import Any

from prefect import get_run_logger, task
from prefect.context import TaskRunContext

from config.chat_template import resolve_chat_template
from config.schema import FinetuneConfig
from pipeline.models import resolve_model, toy_length_note
from staging.stage import stage_dataset, staged_state
from storage import layout
from storage.full import full_storage_is_one_line
from storage.spec import DatasetRef


@task(name="prepare-model")
def prepare_model(cfg: FinetuneConfig) -> str:
    """Resolve the base model to a local directory."""
    with full_storage_is_one_line(fallback=layout.root(cfg.run)):
        path = resolve_model(cfg)
    get_run_logger().info("base model: %s", path)
    return path


def dataset_cache_key(context: TaskRunContext, parameters: dict[str, Any]) -> str | None:
    """Cache key of the staging task: the source digests, the settings and the tokenizer, plus the staged
    manifest and the files present, so that deleting or restaging the dataset misses. None (no caching)
    when nothing complete is staged for these inputs yet."""
    cfg: FinetuneConfig = parameters["cfg"]
    try:
        return staged_state(
            cfg.data, layout.root(cfg.run), parameters["model_path"], resolve_chat_template(cfg.model.chat_template)
        )
    except Exception:  # noqa: BLE001 - the task itself runs next and reports the problem with its message
        return None


@task(name="stage-dataset", cache_key_fn=dataset_cache_key, persist_result=True)
def prepare_dataset(cfg: FinetuneConfig, model_path: str) -> DatasetRef:
    """Validate, tokenize and stage data.source with a manifest (or find it already staged)."""
    logger = get_run_logger()
    # Staging writes through pyarrow and its own spool files as well as storage/fs.py: a full disk anywhere is one line.
    # The storage is the Location of run.storage with run.storage_options: a bare URL would lose the options.
    storage = layout.root(cfg.run)
    with full_storage_is_one_line(fallback=storage):
        return stage_dataset(
            cfg.data,
            storage,
            model_path,
            progress=logger.info,
            chat_template=resolve_chat_template(cfg.model.chat_template),
            length_note=toy_length_note(cfg),
            trust_remote_code=cfg.model.trust_remote_code,
        )
