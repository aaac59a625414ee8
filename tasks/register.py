"""Register: write the registry entry with its lineage and publish Prefect artifacts."""

from __future__ import annotations

from typing import Any

from prefect import get_run_logger, runtime, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact

from config.spec import Spec
from config.version import code_version
from config.checkpoints import CompleteCheckpoint
from tasks.registry import register_version

METRIC_KEYS = ("loss", "perplexity", "token_accuracy", "target_tokens", "correct_tokens", "examples")


def lineage(spec: Spec, spec_digest: str, checkpoint: CompleteCheckpoint) -> dict[str, Any]:
    """Where the model came from: data, config, code, checkpoint, flow run, layout."""
    return {
        "dataset_id": spec.dataset.dataset_id,
        "dataset_manifest_digest": spec.dataset.manifest_digest,
        "spec_digest": spec_digest,
        "code_version": code_version(),
        "checkpoint_manifest_digest": checkpoint.manifest_digest,
        "flow_run_id": str(runtime.flow_run.id) if runtime.flow_run.id else None,
        "nnodes": spec.config.launch.nnodes,
        "world_size": spec.world_size,
    }


@task(name="register")
def register_model(spec: Spec, spec_digest: str, checkpoint: CompleteCheckpoint, model_url: str,
                   metrics: dict[str, Any]) -> dict[str, Any]:
    """Claim the next registry version for this model and publish the metrics as artifacts."""
    logger = get_run_logger()
    model = spec.config.register.model_name
    entry = {
        "metrics": {key: metrics[key] for key in METRIC_KEYS},
        "model_url": model_url,
        "checkpoint_url": checkpoint.url,
        "lineage": lineage(spec, spec_digest, checkpoint),
    }
    version, url = register_version(spec.config.run.storage, model, entry)
    logger.info("registered %s v%04d at %s", model, version, url)
    create_table_artifact(
        key="eval-metrics",
        table=[{"metric": key, "value": metrics[key]} for key in METRIC_KEYS],
        description=f"{model} v{version:04d}: eval metrics (all-reduced over {metrics['world_size']} ranks)",
    )
    create_markdown_artifact(
        key="registered-model",
        markdown=f"# {model} v{version:04d}\n\n- model: `{model_url}`\n- checkpoint: `{checkpoint.url}`\n"
        f"- dataset: `{spec.dataset.dataset_id}`\n- registry entry: `{url}`\n",
        description="registered model",
    )
    return {"version": version, "url": url, **entry}
