"""Prepare: materialize the base model when it is the built-in `tiny`, then stage the dataset."""

from __future__ import annotations

import subprocess
import sys

from prefect import get_run_logger, task

from config import layout
from config.digest import digest_bytes
from config.loader import PROJECT_ROOT
from config.schema import FinetuneConfig
from config.spec import DatasetRef
from config.storage import exists, is_local, join, local_path
from tasks.data.stage import stage_dataset

TINY_CORPUS = PROJECT_ROOT / "data" / "sample" / "conversations.json"


def tiny_model_url(storage: str) -> str:
    """Where the tiny model lives: named by the digest of its recipe inputs, so it is built once.

    `from_pretrained` needs a local directory, so with object-store storage the model goes to a local
    cache; the build is deterministic, so every machine that builds it gets the same bytes.
    """
    recipe = (PROJECT_ROOT / "trainer" / "tiny.py").read_bytes() + TINY_CORPUS.read_bytes()
    name = f"tiny-{digest_bytes(recipe, 'blake3')[:12]}"
    if is_local(storage):
        return layout.model_dir(storage, name)
    return str(PROJECT_ROOT / ".tandem" / "models" / name)


def resolve_model(cfg: FinetuneConfig) -> str:
    """The base model's local directory; builds the tiny model in a subprocess (torch stays out of the flow)."""
    if cfg.model.name_or_path != "tiny":
        return cfg.model.name_or_path
    url = tiny_model_url(cfg.run.storage)
    if not exists(join(url, layout.COMPLETE)):
        result = subprocess.run(
            [sys.executable, "-m", "trainer.tiny", "--out", local_path(url), "--corpus", str(TINY_CORPUS)],
            cwd=PROJECT_ROOT, capture_output=True, text=True,
        )
        if result.returncode != 0:
            raise RuntimeError(f"building the tiny model failed:\n{result.stderr[-2000:]}")
    return local_path(url)


@task(name="prepare-model")
def prepare_model(cfg: FinetuneConfig) -> str:
    """Resolve the base model to a local directory."""
    path = resolve_model(cfg)
    get_run_logger().info("base model: %s", path)
    return path


@task(name="stage-dataset")
def prepare_dataset(cfg: FinetuneConfig, model_path: str) -> DatasetRef:
    """Validate, tokenize and stage data.source with a manifest."""
    logger = get_run_logger()
    return stage_dataset(cfg.data, cfg.run.storage, model_path, progress=logger.info)
