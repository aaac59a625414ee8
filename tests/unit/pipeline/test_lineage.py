"""What a registry entry says about a model: its metrics, where it and its checkpoint are, and its lineage (data,
config, code, checkpoint, flow run, the layout and an elastic run's attempts)."""

from __future__ import annotations

from core.checkout import code_version
from pipeline.lineage import browser_link, registry_entry
from storage.checkpoints import CompleteCheckpoint
from storage.location import Location
from storage.spec import Attempt
from tests.specs import spec_for

METRICS = {"loss": 2.0, "perplexity": 7.39, "token_accuracy": 0.5, "loss_sum": 20.0, "target_tokens": 10}
METRICS |= {"correct_tokens": 5, "examples": 2, "world_size": 2, "model_url": "/runs/r/final", "samples_url": None}


def test_an_entry_records_the_metrics_the_places_and_the_lineage(tmp_path) -> None:
    spec = spec_for(tmp_path, ["launch.nnodes=3", "launch.min_nnodes=2"])
    spec = spec.model_copy(update={"attempts": [Attempt(number=1, nodes=[0, 2], world_size=2, from_step=0)]})
    checkpoint = CompleteCheckpoint(Location(f"{tmp_path}/runs/r/checkpoints/step-00000008"), 8, "ckpt-digest", {})
    entry = registry_entry(spec, "spec-digest", checkpoint, Location(f"{tmp_path}/runs/r/final"), METRICS, "flow-1")
    assert entry["metrics"] == {k: METRICS[k] for k in ("loss", "perplexity", "token_accuracy", "loss_sum")} | {
        "target_tokens": 10,
        "correct_tokens": 5,
        "examples": 2,
    }  # the headline metrics and their counts; not where the evaluation ran
    assert (entry["model_url"], entry["evaluated_url"]) == (f"{tmp_path}/runs/r/final", "/runs/r/final")
    assert entry["checkpoint_url"].endswith("step-00000008") and entry["method"] == "lora"
    assert entry["lineage"] == {
        "dataset_id": "d",
        "dataset_manifest_digest": "x",
        "spec_digest": "spec-digest",
        "code_version": code_version(),
        "checkpoint_manifest_digest": "ckpt-digest",
        "flow_run_id": "flow-1",
        "nnodes": 3,
        "world_size": 3,
        "attempts": [{"number": 1, "nodes": [0, 2], "world_size": 2, "from_step": 0, "left_out": {}}],
    }


def test_a_link_a_browser_can_open() -> None:
    assert browser_link(Location("/data/runs/r/final")) == "file:///data/runs/r/final"
    assert (
        browser_link(Location("s3://bucket/runs/r/final", {"endpoint_url": "http://h"})) == "s3://bucket/runs/r/final"
    )
