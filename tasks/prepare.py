"""Prepare: materialize the base model when it is a built-in one (`tiny`, `tiny-qwen2.5`), then stage the dataset."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

from prefect import get_run_logger, task
from prefect.context import TaskRunContext

from storage import layout
from storage.digest import digest_bytes
from config.chat_template import TEMPLATE_DIR, resolve_chat_template
from config.loader import PROJECT_ROOT
from config.schema import BUILTIN_MODELS, FinetuneConfig
from config.errors import UserError
from storage.spec import DatasetRef
from storage.fs import exists, is_local, join, local_path
from tasks.data.stage import stage_dataset, staged_state

TINY_CORPUS = PROJECT_ROOT / "data" / "sample" / "conversations.json"


def tiny_model_url(storage: str, model: str = "tiny") -> str:
    """Where a built-in model lives: named by the digest of its recipe inputs, so it is built once.

    `from_pretrained` needs a local directory, so with object-store storage the model goes to a local
    cache; the build is deterministic, so every machine that builds it gets the same bytes.
    """
    sources = [PROJECT_ROOT / "trainer" / "tiny.py", PROJECT_ROOT / "trainer" / "tiny_qwen.py", TINY_CORPUS,
               TEMPLATE_DIR / "qwen2.5.jinja"]
    recipe = b"".join(path.read_bytes() for path in sources)
    name = f"{model}-{digest_bytes(recipe, 'blake3')[:12]}"
    if is_local(storage):
        return layout.model_dir(storage, name)
    return str(PROJECT_ROOT / ".tandem" / "models" / name)


def resolve_model(cfg: FinetuneConfig) -> str:
    """The base model's local directory; builds a built-in model in a subprocess (torch stays out of the flow)."""
    name = cfg.model.name_or_path
    if name not in BUILTIN_MODELS:
        return name
    url = tiny_model_url(cfg.run.storage, name)
    if not exists(join(url, layout.COMPLETE)):
        result = subprocess.run(
            [sys.executable, "-m", "trainer.tiny", "--out", local_path(url), "--corpus", str(TINY_CORPUS),
             "--model", name],
            cwd=PROJECT_ROOT, capture_output=True, text=True,
        )
        if result.returncode == 2:  # a UserError (e.g. Qwen's tokenizer package missing): its one line
            raise UserError(result.stderr.strip().splitlines()[-1])
        if result.returncode != 0:
            raise RuntimeError(f"building the {name} model failed:\n{result.stderr[-2000:]}")
    return local_path(url)


@task(name="prepare-model")
def prepare_model(cfg: FinetuneConfig) -> str:
    """Resolve the base model to a local directory."""
    path = resolve_model(cfg)
    get_run_logger().info("base model: %s", path)
    return path


def dataset_cache_key(context: TaskRunContext, parameters: dict[str, Any]) -> str | None:
    """Cache key of the staging task: the source digests, the settings and the tokenizer, plus the staged
    manifest and the files present, so that deleting or restaging the dataset misses. None (no caching)
    when nothing complete is staged for these inputs yet."""
    cfg: FinetuneConfig = parameters["cfg"]
    try:
        return staged_state(cfg.data, cfg.run.storage, parameters["model_path"],
                            resolve_chat_template(cfg.model.chat_template))
    except Exception:  # noqa: BLE001 - the task itself runs next and reports the problem with its message
        return None


@task(name="stage-dataset", cache_key_fn=dataset_cache_key, persist_result=True)
def prepare_dataset(cfg: FinetuneConfig, model_path: str) -> DatasetRef:
    """Validate, tokenize and stage data.source with a manifest (or find it already staged)."""
    logger = get_run_logger()
    return stage_dataset(cfg.data, cfg.run.storage, model_path, progress=logger.info,
                         chat_template=resolve_chat_template(cfg.model.chat_template))
