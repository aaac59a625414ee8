"""The preference objectives' metric sums, and their metrics divided once: a micro-batch's sums of pairs or of KTO
answers (rewards, reward accuracy, log-probabilities and their token counts), added over micro-batches and ranks
(trainer/objectives/base.py), then `metrics_of`: loss, reward accuracy and margin, the mean rewards, the chosen and
rejected log-probabilities per token, the units. The same sums serve the optimizer step (metrics.jsonl) and the
evaluation (eval.json)."""

from __future__ import annotations

import torch

from trainer.objectives.base import Sums

# The sums every preference metric is divided from, in this order (all-reduced as one vector).
SUM_KEYS: tuple[str, ...] = (
    "units",
    "correct",
    "loss_sum",
    "nll_sum",
    "nll_tokens",
    "chosen_reward_sum",
    "chosen_count",
    "rejected_reward_sum",
    "rejected_count",
    "chosen_logp_sum",
    "chosen_tokens",
    "rejected_logp_sum",
    "rejected_tokens",
)


def pair_sums(
    chosen_reward: torch.Tensor,
    rejected_reward: torch.Tensor,
    chosen: torch.Tensor,
    rejected: torch.Tensor,
    chosen_count: torch.Tensor,
    rejected_count: torch.Tensor,
) -> Sums:
    """The metric sums of a micro-batch of pairs: a pair is right when its chosen answer's reward is the higher."""
    n = len(chosen_reward)
    return {
        "units": n,
        "correct": float((chosen_reward > rejected_reward).sum()),
        "chosen_reward_sum": float(chosen_reward.sum()),
        "chosen_count": n,
        "rejected_reward_sum": float(rejected_reward.sum()),
        "rejected_count": n,
        "chosen_logp_sum": float(chosen.sum()),
        "chosen_tokens": float(chosen_count.sum()),
        "rejected_logp_sum": float(rejected.sum()),
        "rejected_tokens": float(rejected_count.sum()),
    }


def feedback_sums(reward: torch.Tensor, policy: torch.Tensor, counts: torch.Tensor, desirable: torch.Tensor) -> Sums:
    """The metric sums of KTO answers: an answer is right when its reward's sign is its label's (positive for a
    desirable one); the desirable answers count as chosen, the others as rejected."""
    good = desirable.to(reward.device)
    return {
        "units": len(reward),
        "correct": float(((reward > 0) == good).sum()),
        "chosen_reward_sum": float(reward[good].sum()),
        "chosen_count": float(good.sum()),
        "rejected_reward_sum": float(reward[~good].sum()),
        "rejected_count": float((~good).sum()),
        "chosen_logp_sum": float(policy[good].sum()),
        "chosen_tokens": float(counts[good].sum()),
        "rejected_logp_sum": float(policy[~good].sum()),
        "rejected_tokens": float(counts[~good].sum()),
    }


def metrics_of(sums: Sums) -> dict[str, float]:
    """The preference metrics from (all-reduced) sums: divided once."""

    def ratio(a: str, b: str) -> float:
        return sums[a] / sums[b] if sums[b] else 0.0

    loss = ratio("loss_sum", "units") + ratio("nll_sum", "nll_tokens")
    return {
        "loss": loss,
        "reward_accuracy": ratio("correct", "units"),
        "reward_margin": ratio("chosen_reward_sum", "chosen_count") - ratio("rejected_reward_sum", "rejected_count"),
        "chosen_reward": ratio("chosen_reward_sum", "chosen_count"),
        "rejected_reward": ratio("rejected_reward_sum", "rejected_count"),
        "chosen_logps_per_token": ratio("chosen_logp_sum", "chosen_tokens"),
        "rejected_logps_per_token": ratio("rejected_logp_sum", "rejected_tokens"),
        "units": int(sums["units"]),
    }
