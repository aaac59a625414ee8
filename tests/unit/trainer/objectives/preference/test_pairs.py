"""The pair objectives (trainer/objectives/preference/pairs.py: DPO, IPO, ORPO) on pinned.py's model: their losses and
metrics (rewards, reward accuracy and margin, log-probabilities per token) from the evaluation of a real split of
preference pairs in micro-batches of unequal widths, pinned (pinned.py says where the literals come from and why they
may not move)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.unit.trainer.objectives.pinned import CHUNK, assert_pinned, measure_preference, preference_split

# DPO and IPO share their rewards (beta times the log-ratio to the reference) and differ in the loss; ORPO's rewards
# are beta times the mean log-probabilities.
PINNED: dict[str, dict[str, Any]] = {
    "dpo": {
        "loss": 0.6783335208892822,
        "reward_accuracy": 4 / 6,
        "reward_margin": 0.04528837651014327,
        "chosen_reward": -0.045219135781129204,
        "rejected_reward": -0.09050751229127248,
        "chosen_logps_per_token": -7.655960407662899,
        "rejected_logps_per_token": -7.673305829366048,
        "units": 6,
        "objective": "dpo",
    },
    "ipo": {
        "loss": 2.763322432835897,
        "reward_accuracy": 4 / 6,
        "reward_margin": 0.04528837651014327,
        "chosen_reward": -0.045219135781129204,
        "rejected_reward": -0.09050751229127248,
        "chosen_logps_per_token": -7.655960407662899,
        "rejected_logps_per_token": -7.673305829366048,
        "units": 6,
        "objective": "ipo",
    },
    "orpo": {
        "loss": 7.86349996110649,
        "reward_accuracy": 3 / 6,
        "reward_margin": 0.0011514027913412939,
        "chosen_reward": -2.299834410349528,
        "rejected_reward": -2.300985813140869,
        "chosen_logps_per_token": -7.655960407662899,
        "rejected_logps_per_token": -7.673305829366048,
        "units": 6,
        "objective": "orpo",
    },
}


@pytest.mark.parametrize("chunk_tokens", [0, CHUNK], ids=["full-logits", "hidden-states"])
@pytest.mark.parametrize("name", sorted(PINNED))
def test_pair_objectives_are_pinned(pinned_model: Any, tmp_path: Path, name: str, chunk_tokens: int) -> None:
    split = preference_split(tmp_path, pairs=True)
    assert_pinned(measure_preference(pinned_model, split, name, chunk_tokens), PINNED[name])
