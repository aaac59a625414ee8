"""The results sections (eval, register and its gate, track): their checks, each a one-line error naming the key."""

from __future__ import annotations

import pytest

from config.loader import load_config
from core.errors import UserError


@pytest.mark.parametrize(
    ("setting", "environ", "expected"),
    [
        (None, {}, None),  # unset, no variable: MLflow is off
        (None, {"MLFLOW_TRACKING_URI": "http://mlflow:5000"}, "http://mlflow:5000"),
        ("http://other:5000", {"MLFLOW_TRACKING_URI": "http://mlflow:5000"}, "http://other:5000"),
        ("off", {"MLFLOW_TRACKING_URI": "http://mlflow:5000"}, None),  # off even when the variable is set
    ],
)
def test_track_mlflow_uri_falls_back_to_the_environment_unless_off(setting, environ, expected) -> None:
    cfg = load_config(None, [f"track.mlflow_uri={setting}"] if setting else [])
    assert cfg.track.mlflow_tracking_uri(environ) == expected


def test_track_mlflow_uri_refuses_a_password() -> None:
    with pytest.raises(UserError) as info:
        load_config(None, ["track.mlflow_uri=https://me:hunter2hunter2@mlflow.example.com"])
    assert "hunter2" not in str(info.value)
    assert "track.mlflow_uri has a password in its URL: remove it and set MLFLOW_TRACKING_USERNAME" in str(info.value)


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        (
            "register.gate={threshold: 2.0, better_than: champion}",
            "register.gate: Value error, set exactly one rule in register.gate: threshold, better_than, or min and/or",
        ),
        (
            "register.gate={metric: loss}",
            "register.gate: Value error, set exactly one rule in register.gate: threshold, better_than, or min and/or",
        ),
        (
            "register.gate={metric: token_accuracy, direction: min, threshold: 0.5}",
            "register.gate.direction must be max for token_accuracy, got min",
        ),
        (
            "register.gate={metric: generate.exact_match, min: 0.5}",
            "register.gate.metric=generate.exact_match is measured by eval.generate: set eval.generate.enabled=true",
        ),
        (
            "register.gate={metric: exact_match, min: 0.5}",
            "register.gate.metric=exact_match is not an eval.json metric; use one of loss, perplexity",
        ),
        ("eval.generate.scorer=not-a-path", "eval.generate.scorer: String should match pattern"),
        (
            "train.objective=dpo | eval.generate.enabled=true",
            "eval.generate needs supervised eval data (a prompt and its reference answer), not the preference rows",
        ),
        ("register.gate={better_than: best}", "register.gate.better_than: Input should be 'champion'"),
        ("eval.generate_samples=-1", "eval.generate_samples: Input should be greater than or equal to 0"),
        ("eval.model=latest", "eval.model: Input should be 'final' or 'checkpoint'"),
    ],
)
def test_bad_gate_and_eval_config_is_one_line_naming_the_key(override: str, expected: str) -> None:
    with pytest.raises(UserError) as info:
        load_config(None, override.split(" | "))
    assert expected in str(info.value) and "\n" not in str(info.value) and info.value.exit_code == 2


def test_a_gate_on_a_generated_metric_takes_its_direction() -> None:
    cfg = load_config(None, ["eval.generate.enabled=true", "register.gate={metric: generate.rouge_l_f1, min: 0.3}"])
    assert cfg.register.gate is not None and cfg.register.gate.direction == "max" and cfg.register.gate.min == 0.3


def test_eval_tasks_take_a_list_and_a_gate_on_a_task_metric_needs_the_tasks_and_a_direction() -> None:
    cfg = load_config(
        None,
        [
            "eval.tasks=[arc_easy, mmlu]",
            "eval.compare_base=true",
            "register.gate={metric: delta.tasks.mmlu_anatomy.acc, direction: max, min: 0}",
        ],
    )
    assert cfg.eval.tasks.names == ["arc_easy", "mmlu"] and cfg.eval.tasks.limit is None
    assert cfg.register.gate is not None and cfg.register.gate.metric == "delta.tasks.mmlu_anatomy.acc"
    refusals = {
        "register.gate={metric: tasks.arc_easy.acc, direction: max, min: 0.5}": (
            "register.gate.metric=tasks.arc_easy.acc is measured by eval.tasks: set eval.tasks.names=[arc_easy]"
        ),
        "eval.tasks=[arc_easy] | register.gate={metric: tasks.arc_easy.acc, min: 0.5}": (
            "register.gate.direction: set min or max for tasks.arc_easy.acc"
        ),
        "eval.tasks=[arc_easy] | register.gate={metric: tasks.arc_easy, direction: max, min: 0.5}": (
            "register.gate.metric=tasks.arc_easy is not an eval.json metric"
        ),
        "eval.tasks=[arc_easy, arc_easy]": "eval.tasks.names must be distinct task names",
        "eval.tasks.limit=0": "eval.tasks.limit: Input should be greater than 0",
    }
    for overrides, expected in refusals.items():
        with pytest.raises(UserError) as info:
            load_config(None, overrides.split(" | "))
        assert expected in str(info.value) and "\n" not in str(info.value) and info.value.exit_code == 2, overrides
