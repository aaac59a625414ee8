"""The whole pipeline under a real Prefect server, with real torchrun agents, DeepSpeed on gloo and real
files: what it leaves on storage is checked byte for byte against its own manifests."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pyarrow as pa
import pytest

from storage.digest import digest_bytes, digest_url
from storage.location import Location

pytestmark = pytest.mark.e2e


def test_dataset_manifest_digests_match_the_files(pipeline) -> None:
    storage, summary = pipeline
    base = storage / "datasets" / summary["dataset_id"]
    manifest = json.loads((base / "manifest.json").read_text())
    assert manifest["schema"] == "tandem.dataset/1" and manifest["digest_algorithm"] == "blake3"
    assert {f["path"] for f in manifest["files"]} == {"train/shard-00000.arrow", "eval/shard-00000.arrow"}
    for entry in manifest["files"]:
        digest, size = digest_url(Location(str(base / entry["path"])), "blake3")
        assert (digest, size) == (entry["digest"], entry["size"])
    assert manifest["sources"][0]["digest"] == digest_url(Location(manifest["sources"][0]["url"]), "blake3")[0]


def test_checkpoint_is_complete_and_consistent(pipeline) -> None:
    _, summary = pipeline
    ckpt = Path(summary["checkpoint_url"])
    assert ckpt.name == "step-00000030"
    raw = (ckpt / "manifest.json").read_bytes()
    manifest = json.loads(raw)
    assert (ckpt / "COMPLETE").read_text().strip() == digest_bytes(raw, "blake3")
    assert manifest["world_size"] == 2 and manifest["zero_stage"] == 2 and manifest["method"] == "lora"
    assert {f["rank"] for f in manifest["files"]} == {0, 1}
    for entry in manifest["files"]:
        assert entry["path"].startswith(("rank-00000/", "rank-00001/")) or entry["rank"] == 0
        digest, size = digest_url(Location(str(ckpt / entry["path"])), "blake3")
        assert (digest, size) == (entry["digest"], entry["size"])
    assert (ckpt.parent / "step-00000015" / "COMPLETE").exists()  # save_steps=15: an intermediate one too
    final = Path(summary["model_url"])
    assert (final / "COMPLETE").exists() and (final / "adapter_model.safetensors").stat().st_size > 0


def test_eval_counts_equal_the_eval_split(pipeline) -> None:
    storage, summary = pipeline
    run = Path(summary["run_url"])
    result = json.loads((run / "eval.json").read_text())
    manifest = json.loads((storage / "datasets" / summary["dataset_id"] / "manifest.json").read_text())
    split = manifest["splits"]["eval"]
    assert result["target_tokens"] == split["target_tokens"] > 0
    assert result["examples"] == split["records"]
    table = pa.ipc.open_file(storage / "datasets" / summary["dataset_id"] / "eval" / "shard-00000.arrow").read_all()
    predicted = sum(sum(1 for label in labels[1:] if label != -100) for labels in table.column("labels").to_pylist())
    assert result["target_tokens"] == predicted
    assert result["world_size"] == 2
    assert result["loss"] == pytest.approx(result["loss_sum"] / result["target_tokens"])


def test_registry_entry_carries_the_lineage(pipeline) -> None:
    storage, summary = pipeline
    # register.model_name unset: the run is named after its model's directory (Tiny-Qwen2.5-Instruct), lowercased.
    assert sorted(p.name for p in (storage / "registry").iterdir()) == ["tiny-qwen2.5-instruct"]
    entry = json.loads((storage / "registry" / "tiny-qwen2.5-instruct" / "v0001.json").read_text())
    dataset_manifest = storage / "datasets" / summary["dataset_id"] / "manifest.json"
    ckpt = Path(summary["checkpoint_url"])
    lineage = entry["lineage"]
    assert lineage["dataset_id"] == summary["dataset_id"]
    assert lineage["dataset_manifest_digest"] == digest_bytes(dataset_manifest.read_bytes(), "blake3")
    assert lineage["checkpoint_manifest_digest"] == (ckpt / "COMPLETE").read_text().strip()
    spec_bytes = (Path(summary["run_url"]) / "spec.json").read_bytes()
    assert lineage["spec_digest"] == digest_bytes(spec_bytes, "sha256")
    assert lineage["world_size"] == 2 and lineage["nnodes"] == 2 and lineage["flow_run_id"]
    assert entry["metrics"]["loss"] == summary["eval"]["loss"]
    # The base model's files as the pipeline found them, which every node's preflight checked its copy against.
    base_model = Path(summary["run_url"]) / "base_model.json"
    assert lineage["base_model_manifest_digest"] == digest_bytes(base_model.read_bytes(), "sha256")
    files = {f["path"] for f in json.loads(base_model.read_text())["files"]}
    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json"} <= files
    card = (Path(summary["run_url"]) / "model_card.md").read_text()
    assert lineage["base_model_manifest_digest"][:16] in card
    for node in (0, 1):
        preflight = json.loads((Path(summary["run_url"]) / "nodes" / str(node) / "preflight.json").read_text())
        assert preflight["checks"]["base model"].startswith(f"{len(files)} files (")


def test_training_loss_went_down(pipeline) -> None:
    _, summary = pipeline
    lines = (Path(summary["run_url"]) / "metrics.jsonl").read_text().splitlines()
    losses = [record["loss"] for record in map(json.loads, lines) if "event" not in record]  # steps, not events
    assert len(losses) == 30
    assert summary["train_loss"] == losses[-1]
    first, last = statistics.mean(losses[:5]), statistics.mean(losses[-5:])
    assert last < first - 0.2, f"loss did not fall: first five {first:.3f}, last five {last:.3f}"


def test_metrics_table_artifact_was_published(pipeline) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    with get_client(sync_client=True) as client:
        artifacts = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["eval-metrics"])))
    ours = [
        a for a in artifacts if ", run e2e: " in (a.description or "")
    ]  # the session's server holds other tests' runs too
    assert ours and ours[0].type == "table"
    assert "token_accuracy" in json.dumps(ours[0].data)
