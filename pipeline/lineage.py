"""What a registry entry says about a model: its metrics, where it is, and its lineage (data, config, code,
checkpoint, flow run, layout)."""

from __future__ import annotations

from typing import Any

from core.checkout import code_version
from storage.checkpoints import CompleteCheckpoint
from storage.location import Location, is_local, local_path
from storage.metrics import eval_record
from storage.spec import Spec


def lineage(
    spec: Spec, spec_digest: str, checkpoint: CompleteCheckpoint, flow_run_id: str | None = None
) -> dict[str, Any]:
    """Where the model came from: data, config, code, checkpoint, flow run, layout."""
    return {
        "dataset_id": spec.dataset.dataset_id,
        "dataset_manifest_digest": spec.dataset.manifest_digest,
        **({"base_model_manifest_digest": spec.model_manifest_digest} if spec.model_manifest_digest else {}),
        "spec_digest": spec_digest,
        "code_version": code_version(),
        "checkpoint_manifest_digest": checkpoint.manifest_digest,
        "flow_run_id": flow_run_id,
        "nnodes": spec.config.launch.nnodes,
        "world_size": spec.world_size,
        **({"attempts": [a.model_dump() for a in spec.attempts]} if spec.attempts else {}),
        # Online RL's reward functions: a file's by its staged copy's digest, the code the model was trained against.
        **({"rewards": [ref.describe() for ref in spec.rewards]} if spec.rewards else {}),
    }


def browser_link(url: Location) -> str:
    """A URL a browser or the Prefect UI can show: file:// for local paths, the URL itself otherwise."""
    return f"file://{local_path(url)}" if is_local(url) else str(url)


def registry_entry(
    spec: Spec,
    spec_digest: str,
    checkpoint: CompleteCheckpoint,
    model_url: Location,
    metrics: dict[str, Any],
    flow_run_id: str | None = None,
) -> dict[str, Any]:
    """The registry document's body (the registry adds schema, model, version, created_at)."""
    return {
        "metrics": eval_record(metrics),
        "model_url": str(model_url),
        "checkpoint_url": str(checkpoint.url),
        "evaluated_url": metrics["model_url"],
        "base_model": spec.model_path,
        "trust_remote_code": spec.config.model.trust_remote_code,
        "method": spec.config.train.method.name,
        "run_url": str(spec.run),
        "lineage": lineage(spec, spec_digest, checkpoint, flow_run_id),
    }
