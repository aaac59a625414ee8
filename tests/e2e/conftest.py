"""The pipeline run shared by the end-to-end tests."""

from __future__ import annotations

import pytest

from config.loader import load_config


@pytest.fixture(scope="session")
def pipeline(prefect_server, mlflow_server, tmp_path_factory, published_tiny):
    """One run of the default pipeline (2 nodes x 1 rank, ZeRO-2 + LoRA) into a temporary storage, tracked in the
    session's MLflow server (experiment `e2e`), in TensorBoard event files and in W&B's offline run files. Its model is
    a directory laid out as Qwen publishes its models (tied embeddings, no pad_token_id in config.json, bf16 weights,
    generation_config.json): the tiny shape of `published_tiny`."""
    from flows.finetune import finetune

    storage = tmp_path_factory.mktemp("storage")
    cfg = load_config(
        None,
        [
            f"run.storage={storage}",
            "run.name=e2e",
            f"model.name_or_path={published_tiny}",
            "eval.generate_samples=2",
            f"track.mlflow_uri={mlflow_server.uri}",
            "track.mlflow_experiment=e2e",
            "track.tensorboard=true",
            "track.wandb=true",
        ],
    )
    with pytest.MonkeyPatch.context() as patch:  # W&B writes its run files only, under {run}/wandb/
        patch.setenv("WANDB_MODE", "offline")
        patch.setenv("WANDB_SILENT", "true")
        summary = finetune(cfg)
    return storage, summary
