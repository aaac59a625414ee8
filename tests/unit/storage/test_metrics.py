"""metrics.jsonl read back (steps and events, in order) and which of an eval.json's keys are its metrics."""

from __future__ import annotations

import json

from storage.location import Location
from storage.metrics import eval_metric_keys, eval_record_keys, read_metrics


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
