"""The preference objectives' metric sums, and their metrics divided once: a micro-batch's sums of pairs or of KTO
answers (rewards, reward accuracy, log-probabilities and their token counts), added over micro-batches and ranks
(trainer/objectives/base.py), then `metrics_of`: loss, reward accuracy and margin, the mean rewards, the chosen and
rejected log-probabilities per token, the units. The same sums serve the optimizer step (metrics.jsonl) and the
evaluation (eval.json). A micro-batch's sums stay on the device (`Pending`), read once a step (base.py `settled`):
nothing here waits for the device, so the next micro-batch's work is queued behind this one's."""

from __future__ import annotations

import torch

from trainer.objectives.base import Pending, Sums

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
) -> Pending:
    """The metric sums of a micro-batch of pairs: a pair is right when its chosen answer's reward is the higher."""
    n = len(chosen_reward)
    return {
        "units": n,
        "correct": (chosen_reward > rejected_reward).sum(),
        "chosen_reward_sum": chosen_reward.sum(),
        "chosen_count": n,
        "rejected_reward_sum": rejected_reward.sum(),
        "rejected_count": n,
        "chosen_logp_sum": chosen.sum(),
        "chosen_tokens": chosen_count.sum(),
        "rejected_logp_sum": rejected.sum(),
        "rejected_tokens": rejected_count.sum(),
    }


def feedback_sums(reward: torch.Tensor, policy: torch.Tensor, counts: torch.Tensor, desirable: torch.Tensor) -> Pending:
    """The metric sums of KTO answers: an answer is right when its reward's sign is its label's (positive for a
    desirable one); the desirable answers count as chosen, the others as rejected. Masked sums, not boolean
    indexing, which would wait for the device to count the selected rows."""
    good = desirable.to(reward.device)

    def split(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        zero = torch.zeros((), dtype=values.dtype, device=values.device)
        return torch.where(good, values, zero).sum(), torch.where(good, zero, values).sum()

    (chosen_reward, rejected_reward), (chosen_logp, rejected_logp) = split(reward), split(policy)
    chosen_tokens, rejected_tokens = split(counts)
    return {
        "units": len(reward),
        "correct": ((reward > 0) == good).sum(),
        "chosen_reward_sum": chosen_reward,
        "chosen_count": good.sum(),
        "rejected_reward_sum": rejected_reward,
        "rejected_count": (~good).sum(),
        "chosen_logp_sum": chosen_logp,
        "chosen_tokens": chosen_tokens,
        "rejected_logp_sum": rejected_logp,
        "rejected_tokens": rejected_tokens,
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
