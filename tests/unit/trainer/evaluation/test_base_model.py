"""The base model beside the trained one (eval.compare_base) without ranks or models: the cache key (what it depends
on and what it does not), the cache's refusal of a file of other inputs, eval.json's `base` and `delta`, the registry
record of them, and the gate on `delta.<metric>`. The evaluation itself (a cache hit loads no base model; the base
figures equal a direct evaluation) is tests/distributed/test_evaluate.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from config.loader import load_config
from config.sections.results import GateConfig
from core.errors import UserError
from storage import layout
from storage.location import Location
from storage.metrics import beside_base, delta_metrics, eval_record, metric_deltas, metric_value
from tests.specs import spec_for
from trainer.evaluation.base_model import cache_inputs, cache_key, cache_url, read_cached

TRAINED = {
    "loss": 1.0,
    "perplexity": 2.7,
    "token_accuracy": 0.75,
    "loss_sum": 10.0,
    "target_tokens": 10,
    "correct_tokens": 7,
    "examples": 3,
    "generate": {
        "records": 4,
        "exact_match": 0.5,
        "rouge_l_f1": 0.625,
        "tool_call_accuracy": None,
        "scores": {"judge": 0.75},
        "seconds": 2.0,
        "answers": [{"index": 0, "prompt": "p", "reference": "r", "output": "trained"}],
    },
}
BASE = {
    **TRAINED,
    "loss": 1.5,
    "token_accuracy": 0.5,
    "generate": {
        **TRAINED["generate"],
        "exact_match": 0.25,
        "scores": {"judge": 1.0},
        "seconds": 9.0,
        "answers": [{"index": 0, "prompt": "p", "reference": "r", "output": "base"}],
    },
}


def with_digests(spec, model: str | None = "m", dataset: str = "d"):
    return spec.model_copy(
        update={"model_manifest_digest": model, "dataset": spec.dataset.model_copy(update={"manifest_digest": dataset})}
    )


def test_the_cache_key_is_the_base_models_and_the_eval_datas_digests_and_the_settings(tmp_path: Path) -> None:
    spec = with_digests(spec_for(tmp_path, []))
    key = cache_key(cache_inputs(spec))
    assert key == cache_key(cache_inputs(with_digests(spec_for(tmp_path, ["train.learning_rate=0.5"]))))  # training
    others = [
        with_digests(spec, model="m2"),
        with_digests(spec, dataset="d2"),
        with_digests(spec_for(tmp_path, ["eval.generate.enabled=true"])),
        with_digests(spec_for(tmp_path, ["eval.batch_size=3"])),
    ]
    assert len({key, *(cache_key(cache_inputs(other)) for other in others)}) == 5
    assert cache_inputs(with_digests(spec, model=None)) is None and cache_url(with_digests(spec, model=None)) is None
    url, inputs = cache_url(spec)
    assert url == layout.base_eval_url(Location(str(tmp_path)), key)  # under run.storage, beside the runs
    assert url.url == f"{tmp_path}/eval-cache/base/{key}.json" and inputs["dataset_manifest_digest"] == "d"


def test_a_cache_file_of_other_inputs_or_unreadable_is_a_miss(tmp_path: Path) -> None:
    path = tmp_path / "k.json"
    url = Location(str(path))
    assert read_cached(url, {"a": 1}) is None
    path.write_text(json.dumps({"schema": layout.BASE_EVAL_SCHEMA, "inputs": {"a": 1}, "figures": {"loss": 2.0}}))
    assert read_cached(url, {"a": 1}) == {"loss": 2.0}
    assert read_cached(url, {"a": 2}) is None
    path.write_text("{cut short")
    assert read_cached(url, {"a": 1}) is None


def test_deltas_are_trained_minus_base_for_every_metric_and_score_both_have() -> None:
    delta = metric_deltas(TRAINED, BASE)
    assert delta == {
        "loss": -0.5,
        "perplexity": 0.0,
        "token_accuracy": 0.25,
        "generate": {"exact_match": 0.25, "rouge_l_f1": 0.0, "scores": {"judge": -0.25}},
    }  # counts and seconds are no metric; a rate without a value (no tool-call references) has no delta
    assert delta_metrics({"delta": delta})["delta.generate.scores.judge"] == -0.25
    assert delta_metrics(TRAINED) == {}


def test_eval_json_gets_the_base_figures_the_deltas_and_both_answers() -> None:
    result = json.loads(json.dumps(TRAINED))
    beside_base(result, json.loads(json.dumps(BASE)))
    assert result["generate"]["answers"] == [
        {"index": 0, "prompt": "p", "reference": "r", "output": "trained", "base_output": "base"}
    ]
    assert "answers" not in result["base"]["generate"] and result["base"]["loss"] == 1.5
    assert metric_value(result, "delta.generate.exact_match") == 0.25 and metric_value(result, "base.loss") == 1.5
    record = eval_record(result)  # the registry entry's metrics
    assert record["delta"] == result["delta"] and record["base"]["generate"]["exact_match"] == 0.25
    assert metric_value(record, "delta.loss") == -0.5


def test_the_gate_takes_a_delta_in_its_metrics_direction(tmp_path: Path) -> None:
    assert GateConfig(metric="delta.generate.exact_match", min=0).direction == "max"
    assert GateConfig(metric="delta.loss", max=0).direction == "min"
    with pytest.raises(ValidationError, match=r"must be min for delta\.loss"):
        GateConfig(metric="delta.loss", direction="max", max=0)
    with pytest.raises(ValidationError, match=r"is not an eval\.json metric"):
        GateConfig(metric="delta.bogus", min=0)
    gate = ["register.gate.metric=delta.generate.exact_match", "register.gate.min=0", "eval.generate.enabled=true"]
    with pytest.raises(UserError, match=r"compares with the base model: set eval\.compare_base=true"):
        load_config(None, [f"run.storage={tmp_path}", *gate])
    assert load_config(None, [f"run.storage={tmp_path}", *gate, "eval.compare_base=true"]).eval.compare_base
