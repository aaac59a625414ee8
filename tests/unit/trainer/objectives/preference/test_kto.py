"""KTO (trainer/objectives/preference/kto.py) on pinned.py's model: its loss and metrics from the evaluation of a real
split of answers with their labels in micro-batches of unequal widths, its kl the reference point (not clamped here),
pinned (pinned.py says where the literals come from and why they may not move)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.unit.trainer.objectives.pinned import CHUNK, assert_pinned, measure_preference, preference_split

PINNED: dict[str, Any] = {
    "loss": 0.49152108033498126,
    "reward_accuracy": 4 / 6,
    "reward_margin": 0.10183486839135487,
    "chosen_reward": 0.0018592824538548787,
    "rejected_reward": -0.0999755859375,
    "chosen_logps_per_token": -7.6702578862508135,
    "rejected_logps_per_token": -7.639385375976563,
    "units": 6,
    "objective": "kto",
    "kl": 0.021874109903971355,
}


@pytest.mark.parametrize("chunk_tokens", [0, CHUNK], ids=["full-logits", "hidden-states"])
def test_kto_is_pinned(pinned_model: Any, tmp_path: Path, chunk_tokens: int) -> None:
    split = preference_split(tmp_path, pairs=False)
    assert_pinned(measure_preference(pinned_model, split, "kto", chunk_tokens), PINNED)
