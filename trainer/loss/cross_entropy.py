"""The one loss of training and evaluation: cross-entropy of each position's prediction of the next token
(labels shifted by one, Hugging Face's convention), over the positions whose label is not IGNORE_INDEX."""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F

from storage.shards import IGNORE_INDEX


def shift(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(float32 logits of positions 0..n-2, the labels they predict: positions 1..n-1). Labels one wider than the
    positions (a sequence-parallel part's: trainer/parallel/sequence_parallel.py) give every position its target."""
    predicted = labels[:, 1:].to(logits.device)
    return logits[:, : predicted.size(1), :].float(), predicted


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor, reduction: Literal["sum", "none"]) -> torch.Tensor:
    """Cross-entropy of shifted logits against their targets; IGNORE_INDEX positions count zero."""
    return F.cross_entropy(
        logits.reshape(-1, logits.size(-1)), targets.reshape(-1), ignore_index=IGNORE_INDEX, reduction=reduction
    )
