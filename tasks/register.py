"""Register: apply the gate, write the registry entry with its lineage, promote the champion, and publish
Prefect artifacts (metrics table, model card, link to the model)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from prefect import get_run_logger, runtime, task
from prefect.artifacts import create_link_artifact, create_markdown_artifact, create_table_artifact

from storage import layout
from storage.checkpoints import CompleteCheckpoint
from storage.manifest import read_manifest
from storage.spec import Spec, WrittenSpec
from storage.fs import is_local, join, local_path, write_bytes_atomic
from config.redact import mask_text, redact
from config.version import code_version
from storage.gate import check_gate, ranking
from storage.model_card import model_card
from storage.registry import promote, read_entry, register_version

METRIC_KEYS = ("loss", "perplexity", "token_accuracy", "loss_sum", "target_tokens", "correct_tokens", "examples")


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
        **({"attempts": [a.model_dump() for a in spec.attempts]} if spec.attempts else {}),
    }


def browser_link(url: str) -> str:
    """A URL a browser or the Prefect UI can show: file:// for local paths, the URL itself otherwise."""
    return f"file://{local_path(url)}" if is_local(url) else url


def registry_entry(spec: Spec, spec_digest: str, checkpoint: CompleteCheckpoint, model_url: str,
                   metrics: dict[str, Any]) -> dict[str, Any]:
    """The registry document's body (the registry adds schema, model, version, created_at)."""
    return {
        "metrics": {key: metrics[key] for key in METRIC_KEYS},
        "model_url": model_url,
        "checkpoint_url": checkpoint.url,
        "evaluated_url": metrics["model_url"],
        "base_model": spec.model_path,
        "method": spec.config.train.method,
        "run_url": spec.run_url,
        "lineage": lineage(spec, spec_digest, checkpoint),
    }


@dataclass(frozen=True)
class Registration:
    """What registering a run did: whether the gate passed, the message to show, and for a registered model its
    version, registry entry URL, whether it became the champion, and the entry's body."""

    registered: bool
    message: str
    version: int | None = None
    url: str | None = None
    champion: bool = False
    entry: dict[str, Any] = field(default_factory=dict)


@task(name="register")
def register_model(written: WrittenSpec, checkpoint: CompleteCheckpoint, model_url: str, metrics: dict[str, Any],
                   loss_plot: str | None = None) -> Registration:
    """Gate, then claim the next registry version, promote the champion and publish the artifacts."""
    logger = get_run_logger()
    spec = written.spec
    model, storage = spec.config.register.model_name, spec.config.run.storage
    create_table_artifact(
        key="eval-metrics",
        table=redact([{"metric": key, "value": metrics[key]} for key in METRIC_KEYS]),
        description=f"{model}, run {spec.run_id}: eval metrics (all-reduced over {metrics['world_size']} ranks)",
    )
    gate = check_gate(spec.config.register.gate, metrics, storage, model)
    if not gate.passed:
        logger.warning("%s (registry %s left untouched)", gate.message, layout.registry_dir(storage, model))
        return Registration(False, gate.message)
    entry = registry_entry(spec, written.digest, checkpoint, model_url, metrics)
    version, url = register_version(storage, model, entry)
    metric, direction = ranking(spec.config.register.gate)
    is_champion = promote(storage, model, version, metrics, metric, direction)
    logger.info("registered %s v%04d at %s (%s)%s", model, version, url, gate.message,
                f"; champion by {metric}" if is_champion else "")
    publish_model_card(spec, storage, model, version, url, loss_plot)
    create_link_artifact(key="model", link=mask_text(browser_link(model_url)), link_text=f"{model} v{version:04d}",
                         description=mask_text(f"the registered model ({entry['method']}); registry entry {url}"))
    message = f"{model} v{version:04d}" + (" (champion)" if is_champion else "")
    return Registration(True, message, version, url, is_champion, entry)


def publish_model_card(spec: Spec, storage: str, model: str, version: int, url: str, loss_plot: str | None) -> None:
    """Write {run}/model_card.md and publish it as a Prefect artifact."""
    doc = {**read_entry(storage, model, version), "url": url}
    splits = read_manifest(spec.dataset.url, layout.DATASET_SCHEMA)[0]["splits"]
    card = model_card(spec, doc, splits, loss_plot)
    write_bytes_atomic(join(spec.run_url, layout.MODEL_CARD), card.encode())
    create_markdown_artifact(key="model-card", markdown=card, description=f"{model} v{version:04d}: model card")
    # (model_card masks the card itself; the registry entry it is built from was masked when written)
