"""metrics.jsonl read back (steps and events, in order) and which of an eval.json's keys are its metrics."""

from __future__ import annotations

import json

from storage.location import Location
from storage.metrics import (
    eval_metric_keys,
    eval_record,
    eval_record_keys,
    generate_metrics,
    metric_value,
    read_metrics,
    task_metrics,
)


def test_every_line_comes_back_in_order_and_a_missing_file_is_no_lines(tmp_path) -> None:
    lines = [{"step": 1, "loss": 2.0}, {"event": "straggler", "step": 1, "rank": 1}, {"step": 2, "loss": 1.5}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines) + "\n")
    assert read_metrics(Location(str(tmp_path))) == lines
    assert read_metrics(Location(str(tmp_path / "none"))) == []


def test_an_eval_result_names_its_metrics_and_counts_by_objective() -> None:
    assert eval_metric_keys({"loss": 1.0, "perplexity": 2.7}) == ("loss", "perplexity", "token_accuracy")
    preference = {"loss": 0.6, "reward_accuracy": 0.7}
    assert eval_metric_keys(preference)[:2] == ("loss", "reward_accuracy")
    assert eval_record_keys(preference)[-1] == "units"
    assert eval_record_keys({"loss": 1.0})[-4:] == ("loss_sum", "target_tokens", "correct_tokens", "examples")
    online = {"loss": -0.5, "reward": 0.5, "records": 8}
    assert (eval_metric_keys(online), eval_record_keys(online)) == (("loss", "reward"), ("loss", "reward", "records"))


def test_online_rls_rewards_flatten_under_generate_rewards_and_get_deltas() -> None:
    from storage.metrics import metric_deltas

    trained = {"loss": -0.75, "reward": 0.75, "generate": {"reward": 0.75, "rewards": {"accuracy": 0.5, "fmt": 1.0}}}
    base = {"loss": -0.25, "reward": 0.25, "generate": {"reward": 0.25, "rewards": {"accuracy": 0.25, "fmt": 0.25}}}
    assert generate_metrics(trained) == {"generate.reward": 0.75, "generate.rewards.accuracy": 0.5,
                                         "generate.rewards.fmt": 1.0}  # fmt: skip
    deltas = metric_deltas(trained, base)
    assert deltas["reward"] == 0.5 and deltas["generate"] == {"reward": 0.5, "rewards": {"accuracy": 0.25, "fmt": 0.75}}


def test_the_generated_answers_figures_flatten_to_dotted_names_and_are_read_back_by_them() -> None:
    result = {
        "loss": 1.5,
        "perplexity": 4.48,
        "token_accuracy": 0.5,
        **dict.fromkeys(("loss_sum", "target_tokens", "correct_tokens", "examples"), 1),
        "world_size": 3,
        "generate": {
            "records": 9,
            "exact_match": 0.25,
            "tool_call_accuracy": None,
            "scores": {"judge": 0.5},
            "answers": [{"index": 0}],
        },
    }
    assert generate_metrics(result) == {
        "generate.records": 9.0,
        "generate.exact_match": 0.25,
        "generate.scores.judge": 0.5,
    }
    record = eval_record(result)
    assert "answers" not in record["generate"] and "world_size" not in record and record["loss"] == 1.5
    assert metric_value(record, "generate.scores.judge") == 0.5 and metric_value(result, "loss") == 1.5
    assert metric_value(record, "generate.tool_call_accuracy") is None  # no tool-call references: no value
    assert (
        metric_value(record, "generate.nothing") is None and metric_value({"loss": 1.0}, "generate.exact_match") is None
    )


def test_benchmark_task_metrics_are_flat_dotted_names_and_the_record_keeps_them() -> None:
    result = {
        "loss": 1.0,
        "perplexity": 2.7,
        "token_accuracy": 0.5,
        "loss_sum": 2.0,
        "target_tokens": 2,
        "correct_tokens": 1,
        "examples": 1,
        "tasks": {"arc_easy": {"acc": 0.5, "acc_norm": 0.25}, "grp": {"acc": True}},
        "tasks_detail": {"harness_version": "0.4.13"},
    }
    assert task_metrics(result) == {"tasks.arc_easy.acc": 0.5, "tasks.arc_easy.acc_norm": 0.25}  # a bool is no figure
    assert metric_value(result, "tasks.arc_easy.acc_norm") == 0.25
    record = eval_record(result)
    assert record["tasks"] == result["tasks"] and record["tasks_detail"] == result["tasks_detail"]
    assert task_metrics({"loss": 1.0}) == {}
