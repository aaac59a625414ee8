"""The preference objectives' losses, as published, on per-sequence log-probabilities (trainer/loss/logps.py; see
docs/preference-tuning.md). Every function returns one value per unit (a pair, or a KTO answer), never a mean: the
objective divides by the global batch's counts once (trainer/objectives/preference/objective.py), so that a unit
weighs the same whatever the micro-batch, accumulation and world size.

    DPO  (Rafailov et al. 2023; conservative DPO's label smoothing eps):
         h = (log pi(c) - log pi(r)) - (log ref(c) - log ref(r))
         loss = -(1 - eps) log sigmoid(beta h) - eps log sigmoid(-beta h)
    IPO  (Azar et al. 2023), on log-probabilities averaged over each answer's tokens:
         loss = (h_avg - 1 / (2 beta))^2
    KTO  (Ethayarajh et al. 2024): z0 = max(0, mean over mismatched pairs of log pi(y'|x) - log ref(y'|x)),
         detached; r = log pi(y|x) - log ref(y|x)
         desirable:   w_d (1 - sigmoid(beta (r - z0)));  undesirable: w_u (1 - sigmoid(beta (z0 - r)))
    ORPO (Hong et al. 2024), no reference; log-probabilities averaged over each answer's tokens:
         log odds(y) = avg log p(y) - log(1 - exp(avg log p(y)))
         loss = NLL of the chosen answers' tokens - lambda log sigmoid(log odds(c) - log odds(r))
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def dpo_losses(
    chosen: torch.Tensor,
    rejected: torch.Tensor,
    ref_chosen: torch.Tensor,
    ref_rejected: torch.Tensor,
    beta: float,
    label_smoothing: float = 0.0,
) -> torch.Tensor:
    """DPO's sigmoid loss of each pair (summed log-probabilities)."""
    h = (chosen - rejected) - (ref_chosen - ref_rejected)
    return -(1 - label_smoothing) * F.logsigmoid(beta * h) - label_smoothing * F.logsigmoid(-beta * h)


def ipo_losses(
    chosen: torch.Tensor, rejected: torch.Tensor, ref_chosen: torch.Tensor, ref_rejected: torch.Tensor, beta: float
) -> torch.Tensor:
    """IPO's squared loss of each pair (log-probabilities averaged per token)."""
    h = (chosen - rejected) - (ref_chosen - ref_rejected)
    return (h - 1 / (2 * beta)) ** 2


def kto_losses(
    policy: torch.Tensor,
    reference: torch.Tensor,
    desirable: torch.Tensor,
    kl: torch.Tensor,
    beta: float,
    desirable_weight: float,
    undesirable_weight: float,
) -> torch.Tensor:
    """KTO's loss of each answer (summed log-probabilities; `desirable`: bool per answer; `kl`: the reference point,
    already clamped at 0 and reduced over the global batch)."""
    ratio = policy - reference
    kl = kl.detach()
    good = desirable_weight * (1 - torch.sigmoid(beta * (ratio - kl)))
    bad = undesirable_weight * (1 - torch.sigmoid(beta * (kl - ratio)))
    return torch.where(desirable, good, bad)


def orpo_ratio_losses(chosen_avg: torch.Tensor, rejected_avg: torch.Tensor, weight: float) -> torch.Tensor:
    """ORPO's odds-ratio term of each pair, weighted by lambda (log-probabilities averaged per token)."""
    log_odds = (chosen_avg - rejected_avg) - (
        torch.log1p(-torch.exp(chosen_avg)) - torch.log1p(-torch.exp(rejected_avg))
    )
    return -weight * F.logsigmoid(log_odds)
