"""The online RL demo's reward (preset grpo-demo): the share of an answer's characters that are digits.

A built-in model with random weights answers with random tokens, so accuracy is almost always 0 and gives its
completions no spread to learn from; digits are a property its sampling reaches (a random answer has a few), so the
reward moves within a few dozen steps: the demo shows the loop learning, not arithmetic. Named in the preset as
`data/grpo-demo/reward.py:digits`, this file is staged with the data and its digest recorded in spec.json, the registry
entry and the model card. TRL's signature: one float per completion.
"""

from __future__ import annotations

from typing import Any


def digits(completions: list[list[dict[str, str]]], **kwargs: Any) -> list[float]:
    """The share of each completion's characters that are digits (0 for an empty one)."""
    texts = [completion[0]["content"] for completion in completions]
    return [sum(c.isdigit() for c in text) / len(text) if text else 0.0 for text in texts]
