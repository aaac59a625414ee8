"""SFT (trainer/objectives/sft.py) on the fixed batch of pinned.py: its summed training loss by every loss path (full
logits, the last hidden states in one pass and in chunks) and its evaluation's sums and metrics, pinned (pinned.py says
where the literals come from and why they may not move)."""

from __future__ import annotations

from typing import Any

import pytest

from storage.shards import Row
from tests.unit.trainer.objectives.pinned import CHUNK, assert_pinned, measure_sft_eval, measure_sft_losses


def test_sft_training_loss_is_pinned_by_every_loss_path(pinned_model: Any, pinned_rows: list[Row]) -> None:
    assert_pinned(
        measure_sft_losses(pinned_model, pinned_rows),
        {"full logits": 576.254638671875, "one pass": 576.2545776367188, "chunked": 576.254638671875},
    )


@pytest.mark.parametrize("chunk_tokens", [0, CHUNK], ids=["full-logits", "hidden-states"])
def test_sft_evaluation_is_pinned(pinned_model: Any, pinned_rows: list[Row], chunk_tokens: int) -> None:
    assert_pinned(
        measure_sft_eval(pinned_model, pinned_rows, chunk_tokens),
        {
            "loss": 7.387880190824851,
            "perplexity": 1616.2762816327381,
            "token_accuracy": 26 / 78,
            "loss_sum": 576.2546548843384,
            "target_tokens": 78,
            "correct_tokens": 26,  # every greedy token, no random one
            "examples": 5,
        },
    )
