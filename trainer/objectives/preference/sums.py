"""The preference objectives' metric sums, and their metrics divided once: a micro-batch's sums of pairs or of KTO
answers (rewards, reward accuracy, log-probabilities and their token counts), added over micro-batches and ranks
(trainer/objectives/sums.py), then `metrics_of`: loss, reward accuracy and margin, the mean rewards, the chosen and
rejected log-probabilities per token, the units. The same sums serve the optimizer step (metrics.jsonl) and the
evaluation (eval.json). A micro-batch's sums stay on the device, read once a step (trainer/objectives/sums.py): nothing
here waits for the device, so the next micro-batch's work is queued behind this one's."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from trainer.objectives.sums import Number, Sums


@dataclass(frozen=True)
class PreferenceSums(Sums):
    """Every preference metric is divided from these (all-reduced as one vector, in this order)."""

    units: Number = 0.0
    correct: Number = 0.0
    loss_sum: Number = 0.0
    nll_sum: Number = 0.0
    nll_tokens: Number = 0.0
    chosen_reward_sum: Number = 0.0
    chosen_count: Number = 0.0
    rejected_reward_sum: Number = 0.0
    rejected_count: Number = 0.0
    chosen_logp_sum: Number = 0.0
    chosen_tokens: Number = 0.0
    rejected_logp_sum: Number = 0.0
    rejected_tokens: Number = 0.0


@dataclass(frozen=True)
class PairLogps:
    """A micro-batch of pairs as its losses read it: the policy's summed log-probabilities of the chosen and the
    rejected answers, their target counts, and the reference model's (None without one)."""

    chosen: torch.Tensor
    rejected: torch.Tensor
    chosen_count: torch.Tensor
    rejected_count: torch.Tensor
    ref_chosen: torch.Tensor | None = None
    ref_rejected: torch.Tensor | None = None

    @classmethod
    def of(cls, policy: torch.Tensor, counts: torch.Tensor, reference: torch.Tensor | None, pairs: int) -> PairLogps:
        """Split a batch's sequences (the `pairs` chosen first, then the rejected) into the pairs' halves."""
        n = pairs
        refs = (None, None) if reference is None else (reference[:n], reference[n:])
        return cls(policy[:n], policy[n:], counts[:n], counts[n:], *refs)

    def references(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The reference's (chosen, rejected); an objective with a reference model always has them."""
        assert self.ref_chosen is not None and self.ref_rejected is not None, "a reference model's pairs"
        return self.ref_chosen, self.ref_rejected

    def sums(self, chosen_reward: torch.Tensor, rejected_reward: torch.Tensor) -> PreferenceSums:
        """The metric sums of the pairs with these rewards: a pair is right when its chosen answer's reward is the
        higher."""
        n = len(chosen_reward)
        return PreferenceSums(
            units=n,
            correct=(chosen_reward > rejected_reward).sum(),
            chosen_reward_sum=chosen_reward.sum(),
            chosen_count=n,
            rejected_reward_sum=rejected_reward.sum(),
            rejected_count=n,
            chosen_logp_sum=self.chosen.detach().sum(),
            chosen_tokens=self.chosen_count.sum(),
            rejected_logp_sum=self.rejected.detach().sum(),
            rejected_tokens=self.rejected_count.sum(),
        )


def feedback_sums(
    reward: torch.Tensor, policy: torch.Tensor, counts: torch.Tensor, desirable: torch.Tensor
) -> PreferenceSums:
    """The metric sums of KTO answers: an answer is right when its reward's sign is its label's (positive for a
    desirable one); the desirable answers count as chosen, the others as rejected. Masked sums, not boolean
    indexing, which would wait for the device to count the selected rows."""
    good = desirable.to(reward.device)

    def split(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        zero = torch.zeros((), dtype=values.dtype, device=values.device)
        return torch.where(good, values, zero).sum(), torch.where(good, zero, values).sum()

    (chosen_reward, rejected_reward), (chosen_logp, rejected_logp) = split(reward), split(policy)
    chosen_tokens, rejected_tokens = split(counts)
    return PreferenceSums(
        units=len(reward),
        correct=((reward > 0) == good).sum(),
        chosen_reward_sum=chosen_reward,
        chosen_count=good.sum(),
        rejected_reward_sum=rejected_reward,
        rejected_count=(~good).sum(),
        chosen_logp_sum=chosen_logp,
        chosen_tokens=chosen_tokens,
        rejected_logp_sum=rejected_logp,
        rejected_tokens=rejected_tokens,
    )


def metrics_of(sums: PreferenceSums) -> dict[str, float]:
    """The preference metrics from (all-reduced) sums: divided once."""

    def ratio(a: Number, b: Number) -> float:
        return float(a) / float(b) if float(b) else 0.0

    s = sums
    loss = ratio(s.loss_sum, s.units) + ratio(s.nll_sum, s.nll_tokens)
    return {
        "loss": loss,
        "reward_accuracy": ratio(s.correct, s.units),
        "reward_margin": ratio(s.chosen_reward_sum, s.chosen_count) - ratio(s.rejected_reward_sum, s.rejected_count),
        "chosen_reward": ratio(s.chosen_reward_sum, s.chosen_count),
        "rejected_reward": ratio(s.rejected_reward_sum, s.rejected_count),
        "chosen_logps_per_token": ratio(s.chosen_logp_sum, s.chosen_tokens),
        "rejected_logps_per_token": ratio(s.rejected_logp_sum, s.rejected_tokens),
        "units": int(s.units),
    }
