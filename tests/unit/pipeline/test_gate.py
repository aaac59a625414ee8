"""The registration gate (register.gate): a threshold on an eval metric, or better than the model's champion."""

from __future__ import annotations

import re

import pytest

from config.sections.results import GateConfig
from pipeline.gate import check_gate
from storage.location import Location
from storage.registry import champion
from tests.registry_helpers import registered

METRICS = {"loss": 2.31, "perplexity": 10.07, "token_accuracy": 0.42}


@pytest.mark.parametrize(
    ("gate", "passed", "message"),
    [
        ({"threshold": 2.0}, False, "not registered: eval_loss 2.31 > threshold 2.0"),
        ({"threshold": 2.5}, True, "passed: eval_loss 2.31 <= threshold 2.5"),
        (
            {"metric": "token_accuracy", "direction": "max", "threshold": 0.5},
            False,
            "not registered: eval_token_accuracy 0.42 < threshold 0.5",
        ),
        ({"metric": "perplexity", "threshold": 20}, True, "passed: eval_perplexity 10.07 <= threshold 20.0"),
    ],
)
def test_threshold_gate_both_ways(tmp_path, gate: dict, passed: bool, message: str) -> None:
    result = check_gate(GateConfig(**gate), METRICS, Location(str(tmp_path)), "m")
    assert (result.passed, result.message) == (passed, message)


def test_champion_gate_both_ways(tmp_path) -> None:
    storage, gate = Location(str(tmp_path)), GateConfig(better_than="champion")
    first = check_gate(gate, METRICS, storage, "m")
    assert first.passed and first.message == "passed: eval_loss 2.31, and m has no champion yet"
    registered(storage, 2.5, 2.0, 2.2)
    assert champion(storage, "m")["version"] == 2
    worse = check_gate(gate, METRICS, storage, "m")
    assert not worse.passed
    assert worse.message == "not registered: eval_loss 2.31 is not better than champion v0002 (eval_loss 2.0)"
    assert check_gate(gate, {**METRICS, "loss": 2.0}, storage, "m").passed is False  # a tie does not beat it
    better = check_gate(gate, {**METRICS, "loss": 1.9}, storage, "m")
    assert better.passed and better.message == "passed: eval_loss 1.9 beats champion v0002 (2.0)"


GENERATED = {**METRICS, "generate": {"exact_match": 0.25, "tool_call_accuracy": None, "scores": {"judge": 0.7}}}


@pytest.mark.parametrize(
    ("gate", "passed", "message"),
    [
        ({"metric": "generate.exact_match", "min": 0.2}, True, "passed: eval_generate.exact_match 0.25 >= min 0.2"),
        (
            {"metric": "generate.exact_match", "direction": "max", "min": 0.2, "max": 0.24},
            False,
            "not registered: eval_generate.exact_match 0.25 >= min 0.2 and > max 0.24",
        ),
        (
            {"metric": "generate.scores.judge", "direction": "max", "threshold": 0.8},
            False,
            "not registered: eval_generate.scores.judge 0.7 < threshold 0.8",
        ),
        ({"metric": "loss", "max": 2.5}, True, "passed: eval_loss 2.31 <= max 2.5"),
        (
            {"metric": "generate.tool_call_accuracy", "min": 0.5},
            False,
            "not registered: eval_generate.tool_call_accuracy has no value in eval.json (docs/evaluation.md)",
        ),
    ],
)
def test_a_gate_on_any_metric_with_min_and_max(tmp_path, gate: dict, passed: bool, message: str) -> None:
    result = check_gate(GateConfig(**gate), GENERATED, Location(str(tmp_path)), "m")
    assert (result.passed, result.message) == (passed, message)


def test_a_champion_gate_on_a_generated_metric_reads_the_entrys_nested_figures(tmp_path) -> None:
    storage, gate = Location(str(tmp_path)), GateConfig(metric="generate.exact_match", better_than="champion")
    assert gate.direction == "max"  # the metric's own
    registered(storage, 2.5)  # an entry from before eval.generate: no figure to beat
    assert check_gate(gate, GENERATED, storage, "m").message == (
        "passed: eval_generate.exact_match 0.25, and champion v0001 has none"
    )


@pytest.mark.parametrize(
    ("gate", "says"),
    [
        ({"metric": "exact_match", "min": 0}, "register.gate.metric=exact_match is not an eval.json metric; use one"),
        ({"metric": "generate.scores.judge", "min": 0}, "register.gate.direction: set min or max for generate.scores"),
        ({"metric": "generate.rouge_l_f1", "direction": "min", "min": 0}, "must be max for generate.rouge_l_f1"),
        ({"metric": "loss", "threshold": 2, "max": 3}, "set exactly one rule in register.gate"),
    ],
)
def test_a_gate_that_cannot_work_is_refused_naming_the_key(gate: dict, says: str) -> None:
    with pytest.raises(ValueError, match=re.escape(says)):
        GateConfig(**gate)
