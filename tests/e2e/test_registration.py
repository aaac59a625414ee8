"""Evaluation and registration through the real flow under a real Prefect server: the gate both ways (the run
ends Completed either way), artifacts, the asset materialization, the loss curve, and loading the registered
LoRA model back to reproduce its recorded eval loss."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from torch.testing import assert_close

from config.loader import load_config
from storage.location import Location

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def reruns(pipeline, mlflow_server, published_tiny):
    """The e2e run again (same run.name: nothing left to train) with a failing gate (tracked in MLflow, experiment
    e2e-rejected), then a passing one that evaluates the final checkpoint instead of final/; (registry before,
    rejected state, accepted state)."""
    from flows.finetune import finetune

    storage, _ = pipeline
    registry = storage / "registry" / "tiny-qwen2.5-instruct"
    before = files_under(registry)
    base = [f"run.storage={storage}", "run.name=e2e", f"model.name_or_path={published_tiny}"]
    rejected = finetune(
        load_config(
            None,
            [
                *base,
                "register.gate={metric: loss, direction: min, threshold: 0.5}",
                f"track.mlflow_uri={mlflow_server.uri}",
                "track.mlflow_experiment=e2e-rejected",
            ],
        ),
        return_state=True,
    )
    after_rejection = files_under(registry)
    accepted = finetune(
        load_config(
            None, [*base, "eval.model=checkpoint", "register.gate={metric: loss, direction: min, threshold: 100}"]
        ),
        return_state=True,
    )
    return before, rejected, after_rejection, accepted


def files_under(directory: Path) -> dict[str, bytes]:
    """Every file under `directory` (the registry's entries, champion and MLflow mirror records) and its bytes."""
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def test_a_run_that_fails_the_gate_completes_and_leaves_the_registry_untouched(pipeline, reruns) -> None:
    before, rejected, after_rejection, _ = reruns
    loss = pipeline[1]["eval"]["loss"]
    assert rejected.is_completed()
    assert rejected.message == f"not registered: eval_loss {loss:.4g} > threshold 0.5"
    summary = rejected.result()
    assert summary["registered"] is False and summary["registry_url"] is None
    assert after_rejection == before  # no new version, no changed byte, champion alias as it was


def test_a_run_that_fails_the_gate_registers_nothing_in_mlflow_either(pipeline, reruns, mlflow_server) -> None:
    from mlflow import MlflowClient

    client = MlflowClient(mlflow_server.uri)
    # the first run's
    assert [v.version for v in client.search_model_versions("name = 'tiny-qwen2.5-instruct'")] == ["1"]
    assert client.get_model_version_by_alias("tiny-qwen2.5-instruct", "champion").version == "1"
    experiment = client.get_experiment_by_name("e2e-rejected")
    [run] = client.search_runs([experiment.experiment_id])
    assert run.data.tags["tandem.registered"] == reruns[1].message
    assert run.info.status == "FINISHED"


def test_the_summary_prints_why_it_was_not_registered(reruns, capsys) -> None:
    from flows.finetune import print_summary

    print_summary(reruns[1].result())
    assert "registered     not registered: eval_loss " in capsys.readouterr().out


def test_a_rerun_of_a_finished_run_trains_nothing(pipeline, reruns) -> None:
    """Both reruns found the run trained to its last step (checkpoint and final/ complete): no node trained again,
    they went straight to evaluation."""
    log = (Path(pipeline[1]["run_url"]) / "nodes" / "0" / "log.txt").read_text()
    assert log.count("trainer.loop: training ") == 1  # the first run's ranks only
    assert log.count(" eval loss ") == 3  # the evaluator ran for each of the three runs


def test_a_run_that_passes_the_gate_registers_the_next_version(pipeline, reruns) -> None:
    storage, first = pipeline
    accepted = reruns[3]
    assert accepted.is_completed() and accepted.message == "registered tiny-qwen2.5-instruct v0002"
    entry = json.loads((storage / "registry" / "tiny-qwen2.5-instruct" / "v0002.json").read_text())
    assert entry["evaluated_url"] == first["checkpoint_url"]  # eval.model=checkpoint
    assert entry["model_url"] == first["model_url"]
    # The checkpoint reassembled on the base evaluates exactly like the exported adapter.
    assert_close(entry["metrics"]["loss"], first["eval"]["loss"], rtol=1e-7, atol=0)
    champion = json.loads((storage / "registry" / "tiny-qwen2.5-instruct" / "champion.json").read_text())
    assert champion["version"] == 1  # equal loss does not beat the champion


def test_registered_lora_model_loads_back_and_reproduces_its_eval_loss(pipeline) -> None:
    from pipeline.model_card import load_snippet

    storage, summary = pipeline
    entry = json.loads((storage / "registry" / "tiny-qwen2.5-instruct" / "v0001.json").read_text())
    namespace: dict = {}
    exec(load_snippet(entry), namespace)  # exactly what the model card and `flows.registry show` tell users
    model = namespace["model"].eval()
    assert type(model).__name__ == "PeftModelForCausalLM"
    assert_reproduces_eval(model, summary["run_url"], entry)


def assert_reproduces_eval(model, run_url: str, entry: dict) -> None:
    """`model` evaluated in this process on the run's eval split gives the entry's counts and loss."""
    import torch

    from storage.local_dataset import open_split
    from storage.node_cache import node_cache
    from storage.spec import load_spec
    from trainer.model.load import ensure_pad_token_id
    from trainer.objectives.base import EvalOptions
    from trainer.objectives.sft import EvalRows, local_sums

    spec, _ = load_spec(Location(str(Path(run_url) / "spec.json")))
    split = open_split(spec.dataset_dir, "eval", node_cache(spec.config.launch))
    options = EvalOptions(3, ensure_pad_token_id(model, spec.model_path))
    every = EvalRows(range(len(split)), 0, 1)
    loss_sum, targets, _, examples = local_sums(model, split, every, options, torch.device("cpu"), 0)
    # Full logits here, the chunked loss (train.loss_chunk_tokens) in the pipeline's evaluation: the same figure.
    assert (targets, examples) == (entry["metrics"]["target_tokens"], entry["metrics"]["examples"])
    assert_close(loss_sum / targets, entry["metrics"]["loss"], rtol=1e-7, atol=0)


def test_loss_curve_and_model_card_are_in_the_run_directory(pipeline) -> None:
    from PIL import Image

    _, summary = pipeline
    run = Path(summary["run_url"])
    assert summary["loss_plot"] == str(run / "loss.png")
    assert Image.open(run / "loss.png").format == "PNG"
    card = (run / "model_card.md").read_text()  # of the run's latest registration (the reruns register too)
    assert card.startswith("# tiny-qwen2.5-instruct v000") and "![loss curve](loss.png)" in card
    samples = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    assert [s["index"] for s in samples] == [0, 1]


def read_artifact(key: str):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    with get_client(sync_client=True) as client:
        found = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])))
    assert found, f"no artifact with key {key}"
    return found


def test_model_card_and_link_artifacts_were_published(pipeline) -> None:
    _, summary = pipeline
    # The server is the session's: other tests' runs may publish cards for their own tiny-qwen2.5-instruct v0001.
    cards = [
        a.data
        for a in read_artifact("model-card")
        if a.data.startswith("# tiny-qwen2.5-instruct v0001\n") and summary["model_url"] in a.data
    ]
    assert len(cards) == 1
    card = cards[0]
    for needle in (
        "## Data",
        summary["dataset_id"],
        "## Method and configuration",
        "| LoRA | r 16, alpha 32",
        "| adapters | adapters on modules down_proj, gate_proj, k_proj, o_proj, q_proj, up_proj, v_proj; on "
        "parameters none; ",  # a dense model: no fused expert weights
        "## Metrics",
        f"{summary['eval']['loss']:.4f}",
        "## Lineage",
        "dataset_manifest_digest",
        "`data.eval_ratio` 0.1, at most `data.eval_max_records` 2000 |",  # the sample's split: under the cap
        "![loss curve](loss.png)",
        "PeftModel.from_pretrained(base,",
        summary["model_url"],
    ):
        assert needle in card, needle
    links = [a.data for a in read_artifact("model")]
    assert f"[tiny-qwen2.5-instruct v0001](file://{summary['model_url']})" in links


def test_the_model_is_an_asset_materialized_from_the_staged_dataset(pipeline, reruns) -> None:
    from prefect.client.orchestration import get_client
    from prefect.events.filters import EventFilter, EventNameFilter, EventResourceFilter

    storage, summary = pipeline
    model_key = f"file://{summary['model_url']}"
    dataset_key = f"file://{storage}/datasets/{summary['dataset_id']}"
    event_filter = EventFilter(
        event=EventNameFilter(name=["prefect.asset.materialization.succeeded"]),
        resource=EventResourceFilter(id=[model_key]),
    )
    deadline, events = time.monotonic() + 60, []
    while time.monotonic() < deadline and len(events) < 2:  # events reach the server in batches: poll
        with get_client(sync_client=True) as client:
            # limit: Prefect 3.8's client asks for 100 by default, and its server refuses more than 50.
            events = client.read_events(filter=event_filter, limit=50).events
        time.sleep(1)
    by_version = {event.payload["version"]: event for event in events}
    assert sorted(by_version) == [1, 2], f"materializations of {model_key}: {sorted(by_version)}"  # + the rerun
    event = by_version[1]
    assert (dataset_key, "asset") in {(r.id, r.role) for r in event.related}
    assert event.resource.name == "tiny-qwen2.5-instruct v0001"
    assert event.payload["metrics"]["loss"] == summary["eval"]["loss"]
    assert event.payload["lineage"]["dataset_id"] == summary["dataset_id"]
