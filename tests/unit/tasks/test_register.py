"""The register task against the session's Prefect server (its artifacts are real): a model that fails the gate leaves
the registry untouched; one that passes gets the next version with its lineage, becomes champion when it is the best,
and its model card is written into the run and published as an artifact."""

from __future__ import annotations

from prefect.logging import disable_run_logger

from config.loader import load_config
from config.sections.run_data import DataConfig
from pipeline.plan import build_spec
from storage.checkpoints import read_complete
from storage.location import Location
from storage.registry import versions
from storage.spec import publish_spec
from tasks.register import metrics_table, register_model
from tests.checkpoints import save_checkpoint
from tests.datafiles import arithmetic, write_jsonl

METRICS = {"loss": 2.0, "perplexity": 7.389, "token_accuracy": 0.5, "loss_sum": 200.0, "target_tokens": 100}
METRICS |= {"correct_tokens": 50, "examples": 10, "world_size": 2}


def test_the_gate_decides_and_a_registered_version_carries_its_card(prefect_server, tmp_path, tiny_model) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey
    from prefect.client.schemas.sorting import ArtifactSort

    from staging.stage import stage_dataset

    storage = tmp_path / "s"
    source = write_jsonl(tmp_path / "a.jsonl", arithmetic(30))
    dataset = stage_dataset(DataConfig(source=source, max_length=64), Location(str(storage)), tiny_model, bars=False)
    settings = [
        f"run.storage={storage}",
        f"data.source={source}",
        f"model.name_or_path={tiny_model}",
        "train.max_steps=8",
    ]
    strict = build_spec(load_config(None, [*settings, "register.gate={threshold: 1.5}"]), "r1", tiny_model, dataset)
    written = publish_spec(strict)
    checkpoint = read_complete(save_checkpoint(storage / "runs" / "r1", 8))
    final = Location(str(storage / "runs" / "r1" / "final"))
    metrics = {**METRICS, "model_url": str(final)}
    with disable_run_logger():
        refused = register_model.fn(written, checkpoint, final, metrics)
        assert (refused.registered, refused.message) == (False, "not registered: eval_loss 2.0 > threshold 1.5")
        assert versions(Location(str(storage)), "tandem-tiny") == []
        open_gate = publish_spec(build_spec(load_config(None, settings), "r1", tiny_model, dataset))
        answers = [{"index": 0, "prompt": "What is 2+2?", "reference": "4", "output": "5"}]
        generated = {"records": 1, "exact_match": 0.0, "rouge_l_f1": 0.0, "answers": answers}
        done = register_model.fn(open_gate, checkpoint, final, {**metrics, "generate": generated})
    assert (done.registered, done.message, done.version, done.champion) == (
        True,
        "tandem-tiny v0001 (champion)",
        1,
        True,
    )
    assert done.entry["lineage"]["dataset_id"] == dataset.dataset_id and done.entry["model_url"] == str(final)
    card = (storage / "runs" / "r1" / "model_card.md").read_text()
    assert card.startswith("# tandem-tiny v0001\n") and dataset.dataset_id in card
    assert done.entry["metrics"]["generate"] == {"records": 1, "exact_match": 0.0, "rouge_l_f1": 0.0}
    table = "| # | prompt (its end) | reference | output |\n|---|---|---|---|\n| 0 | What is 2+2? | 4 | 5 |"
    assert f"## Sample answers\n\nAnswers to eval prompts (`eval.generate`).\n\n{table}\n" in card
    with get_client(sync_client=True) as client:
        published, shown = (
            client.read_artifacts(
                artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])),
                sort=ArtifactSort.CREATED_DESC,
                limit=1,
            )[0]
            for key in ("model-card", "generated-answers")
        )
    assert published.data == card and shown.data == table


def test_the_eval_metrics_artifact_lists_each_delta_after_the_metrics() -> None:
    metrics = {"loss": 1.0, "perplexity": 2.7, "token_accuracy": 0.5, "loss_sum": 4.0, "target_tokens": 4}
    metrics |= {"correct_tokens": 2, "examples": 1}
    assert [row["metric"] for row in metrics_table(metrics)] == list(metrics)
    rows = metrics_table(metrics | {"delta": {"loss": -0.5, "generate": {"exact_match": 0.25}}})
    assert rows[len(metrics) :] == [
        {"metric": "delta.loss", "value": -0.5},
        {"metric": "delta.generate.exact_match", "value": 0.25},
    ]
