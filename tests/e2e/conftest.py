"""The pipeline run shared by the end-to-end tests."""

from __future__ import annotations

import pytest

from config.loader import load_config


@pytest.fixture(scope="session")
def pipeline(prefect_server, tmp_path_factory):
    """One run of the default pipeline (2 nodes x 1 rank, ZeRO-2 + LoRA) into a temporary storage."""
    from flows.finetune import finetune

    storage = tmp_path_factory.mktemp("storage")
    cfg = load_config(None, [f"run.storage={storage}", "run.name=e2e", "eval.generate_samples=2"])
    summary = finetune(cfg)
    return storage, summary
