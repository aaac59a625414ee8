"""Each sequence's summed log-probability of its targets, from full logits: what the preference objectives compare
(trainer/objectives/preference/) and their reference table holds (labels shifted by one, Hugging Face's convention)."""

from __future__ import annotations

import torch

from storage.shards import IGNORE_INDEX


def sequence_logps(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(summed log-probability of each sequence's targets, its target count), labels shifted by one."""
    logits, targets = logits[:, :-1, :].float(), labels[:, 1:].to(logits.device)
    mask = targets != IGNORE_INDEX
    per_token = torch.gather(torch.log_softmax(logits, dim=-1), 2, torch.where(mask, targets, 0).unsqueeze(-1)).squeeze(
        -1
    )
    return (per_token * mask).sum(dim=1), mask.sum(dim=1)
