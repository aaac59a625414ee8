"""Register: apply the gate, write the registry entry with its lineage, promote the champion, and publish
Prefect artifacts (metrics table, model card, link to the model)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from prefect import get_run_logger, runtime, task
from prefect.artifacts import create_link_artifact, create_markdown_artifact, create_table_artifact

from core.redact import mask_text, redact
from pipeline.gate import check_gate, ranking
from pipeline.lineage import browser_link, registry_entry
from pipeline.model_card import answers_table, model_card
from pipeline.models import registry_name
from storage import layout
from storage.adapters import read_adapter_summary
from storage.checkpoints import CompleteCheckpoint
from storage.fs import write_bytes_atomic
from storage.location import Location, join
from storage.manifest import read_manifest
from storage.metrics import GENERATE, SHOWN_ANSWERS, delta_metrics, eval_record_keys, read_metrics, task_metrics
from storage.registry import promote, read_entry, register_version
from storage.spec import Spec, WrittenSpec


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


def metrics_table(metrics: dict[str, Any]) -> list[dict[str, Any]]:
    """The eval-metrics artifact's rows: the metrics and counts, the benchmark tasks' metrics, then each delta against
    the base model."""
    rows = [{"metric": key, "value": metrics[key]} for key in eval_record_keys(metrics)]
    figures = task_metrics(metrics) | delta_metrics(metrics)
    return rows + [{"metric": key, "value": value} for key, value in figures.items()]


@task(name="register")
def register_model(
    written: WrittenSpec,
    checkpoint: CompleteCheckpoint,
    model_url: Location,
    metrics: dict[str, Any],
    loss_plot: Location | None = None,
) -> Registration:
    """Gate, then claim the next registry version, promote the champion and publish the artifacts."""
    logger = get_run_logger()
    spec = written.spec
    model, storage = registry_name(spec.config), layout.root(spec.config.run)
    create_table_artifact(
        key="eval-metrics",
        table=redact(metrics_table(metrics)),
        description=f"{model}, run {spec.run_id}: eval metrics (all-reduced over {metrics['world_size']} ranks)",
    )
    answers = metrics.get(GENERATE, {}).get(SHOWN_ANSWERS, [])
    if answers:
        create_markdown_artifact(
            key="generated-answers",
            markdown=mask_text(answers_table(answers)),
            description=f"{model}, run {spec.run_id}: answers to eval prompts (eval.generate)",
        )
    gate = check_gate(spec.config.register.gate, metrics, storage, model)
    if not gate.passed:
        logger.warning("%s (registry %s left untouched)", gate.message, layout.registry_dir(storage, model))
        return Registration(False, gate.message)
    flow_run_id = str(runtime.flow_run.id) if runtime.flow_run.id else None
    entry = registry_entry(spec, written.digest, checkpoint, model_url, metrics, flow_run_id)
    version, url = register_version(storage, model, entry)
    metric, direction = ranking(spec.config.register.gate)
    is_champion = promote(storage, model, version, metrics, metric, direction)
    logger.info(
        "registered %s v%04d at %s (%s)%s",
        model,
        version,
        url,
        gate.message,
        f"; champion by {metric}" if is_champion else "",
    )
    publish_model_card(spec, storage, model, version, url, loss_plot, answers)
    create_link_artifact(
        key="model",
        link=mask_text(browser_link(model_url)),
        link_text=f"{model} v{version:04d}",
        description=mask_text(f"the registered model ({entry['method']}); registry entry {url}"),
    )
    message = f"{model} v{version:04d}" + (" (champion)" if is_champion else "")
    return Registration(True, message, version, str(url), is_champion, entry)


def publish_model_card(
    spec: Spec,
    storage: Location,
    model: str,
    version: int,
    url: Location,
    loss_plot: Location | None,
    answers: list[dict[str, Any]] | None = None,
) -> None:
    """Write {run}/model_card.md and publish it as a Prefect artifact."""
    doc = {**read_entry(storage, model, version), "url": str(url)}
    manifest = read_manifest(spec.dataset_dir, layout.DATASET_SCHEMAS)[0]
    adapters = read_adapter_summary(layout.final_dir(spec.run))
    card = model_card(spec, doc, manifest, loss_plot, adapters, answers, read_metrics(spec.run))
    write_bytes_atomic(join(spec.run, layout.MODEL_CARD), card.encode())
    create_markdown_artifact(key="model-card", markdown=card, description=f"{model} v{version:04d}: model card")
    # (model_card masks the card itself; the registry entry it is built from was masked when written)
