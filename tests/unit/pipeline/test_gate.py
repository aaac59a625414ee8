"""The registration gate (register.gate): a threshold on an eval metric, or better than the model's champion."""

from __future__ import annotations

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
