"""GRPO's loss on a micro-batch of completions: TRL 1.16's `_compute_loss` written out (token-level importance
sampling, its default), and each loss type's share of the global batch's loss.

Per completion token t (mask 1: a real completion token, not padding, not a truncated completion's with
mask_truncated_completions):

    ratio_t = exp(logp_t - old_t)                   old: the log-probability when the rollouts were generated (the
                                                    policy's own, detached, when num_iterations is 1)
    loss_t  = -min(ratio_t A, clip(ratio_t, 1 - epsilon, 1 + epsilon_high) A) + beta kl_t
    kl_t    = exp(ref_t - logp_t) - (ref_t - logp_t) - 1   (beta > 0: the reference model's log-probability ref_t)

and the global batch's loss, of N completions and T mask tokens over every rank:

    dapo     sum of loss_t / T
    grpo     sum over completions of (their loss_t's mean) / N
    dr_grpo  sum of loss_t / (N x max_completion_length)
    bnpo     mean over micro-batches of (sum of the micro-batch's loss_t / its mask tokens): TRL's normalisation by the
             local batch, which depends on how completions are split into micro-batches and ranks

A micro-batch's share is its part of that sum; the step scales it for DeepSpeed's averaging
(trainer/objectives/base.py).
Log-probabilities are taken at the rollouts' temperature (logits / temperature), as TRL's are. The metrics' sums (KL,
entropy, clipped shares) are over mask tokens, all-reduced and divided once.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from config.sections.rl import RlConfig
from trainer.objectives.sums import Number, Sums


@dataclass(frozen=True)
class LossCounts:
    """What a micro-batch's share is divided by: the global batch's completions and mask tokens, and (bnpo) the
    micro-batches of the step over every rank."""

    sequences: float
    tokens: float
    micro_batches: int


@dataclass(frozen=True)
class RlSums(Sums):
    """A step's sums: its loss (the micro-batches' shares), and over mask tokens the KL, the entropy and the clipped
    ratios, with the tokens they are divided by."""

    loss_sum: Number = 0.0
    kl_sum: Number = 0.0
    entropy_sum: Number = 0.0
    clip_low_sum: Number = 0.0
    clip_high_sum: Number = 0.0
    clip_region_sum: Number = 0.0
    tokens: Number = 0.0


def token_logps(logits: torch.Tensor, ids: torch.Tensor, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(log-probability of each token of `ids`, the entropy of its distribution, without gradient) from the logits
    that predict them (batch x tokens x vocabulary), at `temperature`."""
    scaled = logits.float() / temperature
    logps = torch.log_softmax(scaled, dim=-1)
    chosen = logps.gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    with torch.no_grad():
        entropy = -(logps.exp() * logps).sum(-1)
    return chosen, entropy


def per_token_loss(
    logps: torch.Tensor,
    old: torch.Tensor,
    ref: torch.Tensor | None,
    advantages: torch.Tensor,
    rl: RlConfig,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(loss_t, ratio_t, kl_t or None) of every completion token (batch x tokens), advantages one per completion."""
    ratio = torch.exp(logps - old)
    a = advantages.unsqueeze(1)
    clipped = torch.clamp(ratio, 1 - rl.epsilon, 1 + rl.clip_high)
    loss = -torch.min(ratio * a, clipped * a)
    kl = None
    if rl.beta != 0.0:
        assert ref is not None, "beta > 0 needs the reference model's log-probabilities"
        kl = torch.exp(ref - logps) - (ref - logps) - 1
        loss = loss + rl.beta * kl
    return loss, ratio, kl


def share(loss: torch.Tensor, mask: torch.Tensor, rl: RlConfig, counts: LossCounts) -> torch.Tensor:
    """The micro-batch's share of the global batch's loss (the module docstring's table)."""
    masked = loss * mask
    if rl.loss_type == "dapo":
        return masked.sum() / max(counts.tokens, 1.0)
    if rl.loss_type == "grpo":
        return (masked.sum(-1) / mask.sum(-1).clamp(min=1.0)).sum() / counts.sequences
    if rl.loss_type == "dr_grpo":
        return masked.sum() / (counts.sequences * rl.max_completion_length)
    return masked.sum() / mask.sum().clamp(min=1.0) / counts.micro_batches


def metric_sums(
    ratio: torch.Tensor,
    kl: torch.Tensor | None,
    entropy: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    rl: RlConfig,
) -> RlSums:
    """The micro-batch's metric sums over its mask tokens (TRL's clipped shares: a token whose ratio the clip holds
    below with a negative advantage, or above with a positive one)."""
    with torch.no_grad():
        a = advantages.unsqueeze(1)
        low = ((ratio < 1 - rl.epsilon) & (a < 0)).float()
        high = ((ratio > 1 + rl.clip_high) & (a > 0)).float()
        region = torch.maximum(low, high)
        return RlSums(
            kl_sum=(kl * mask).sum() if kl is not None else 0.0,
            entropy_sum=(entropy * mask).sum(),
            clip_low_sum=(low * mask).sum(),
            clip_high_sum=(high * mask).sum(),
            clip_region_sum=(region * mask).sum(),
            tokens=mask.sum(),
        )


def step_metrics(sums: RlSums, rl: RlConfig) -> dict[str, float]:
    """The step's loss metrics under TRL's names, each a sum over mask tokens divided once."""
    tokens = max(float(sums.tokens), 1.0)
    out = {
        "entropy": float(sums.entropy_sum) / tokens,
        "clip_ratio/low_mean": float(sums.clip_low_sum) / tokens,
        "clip_ratio/high_mean": float(sums.clip_high_sum) / tokens,
        "clip_ratio/region_mean": float(sums.clip_region_sum) / tokens,
    }
    if rl.beta != 0.0:
        out["kl"] = float(sums.kl_sum) / tokens
    return out
