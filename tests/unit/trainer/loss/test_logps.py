"""Each sequence's summed log-probability of its targets (trainer/loss/logps.py), what the preference objectives compare
and their reference table holds: equal to a hand gather of log_softmax at each kept position over the token the next
label names (labels shifted by one), computed in float32 from lower-precision logits; its count is the kept positions';
a masked position counts nothing whatever its logits, and a sequence without targets is (0, 0)."""

from __future__ import annotations

import torch

from storage.shards import IGNORE_INDEX
from trainer.loss.logps import sequence_logps

VOCAB = 13


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    """(logits, labels) of 4 rows of 9 positions: masked prompts of different lengths, padding, one row all masked."""
    generator = torch.Generator().manual_seed(1)
    logits = torch.randn(4, 9, VOCAB, generator=generator) * 3
    labels = torch.randint(0, VOCAB, (4, 9), generator=generator)
    for row, prompt in enumerate((1, 3, 4, 9)):
        labels[row, :prompt] = IGNORE_INDEX
    labels[1, 7:] = IGNORE_INDEX
    return logits, labels


def by_hand(logits: torch.Tensor, labels: torch.Tensor) -> tuple[list[float], list[int]]:
    """Per sequence: the sum over positions t >= 1 whose label is kept of log softmax(logits[t - 1])[labels[t]]."""
    sums, counts = [], []
    for row in range(labels.shape[0]):
        total, count = 0.0, 0
        for t in range(1, labels.shape[1]):
            if labels[row, t] != IGNORE_INDEX:
                total += float(torch.log_softmax(logits[row, t - 1].double(), dim=-1)[labels[row, t]])
                count += 1
        sums.append(total)
        counts.append(count)
    return sums, counts


def test_the_sums_and_counts_are_the_hand_gathered_ones() -> None:
    logits, labels = batch()
    got, counts = sequence_logps(logits, labels)
    expected, expected_counts = by_hand(logits, labels)
    assert counts.tolist() == expected_counts == [8, 4, 5, 0]
    assert torch.allclose(got.double(), torch.tensor(expected, dtype=torch.float64), rtol=1e-5, atol=1e-5)
    assert got[3] == 0.0 and torch.all(got[:3] < 0)


def test_lower_precision_logits_are_read_in_float32() -> None:
    logits, labels = batch()
    half = logits.to(torch.bfloat16)
    got, _ = sequence_logps(half, labels)
    expected, _ = by_hand(half.float(), labels)
    assert got.dtype == torch.float32
    assert torch.allclose(got.double(), torch.tensor(expected, dtype=torch.float64), rtol=1e-5, atol=1e-5)


def test_masked_positions_count_nothing_whatever_their_logits() -> None:
    logits, labels = batch()
    base, _ = sequence_logps(logits, labels)
    changed = logits.clone()
    changed[:, :-1][labels[:, 1:] == IGNORE_INDEX] = -1e4  # positions that predict an ignored label
    changed[:, -1] = 1e4  # the last position predicts nothing
    assert torch.equal(sequence_logps(changed, labels)[0], base)
    changed[0, 4, int(labels[0, 5])] += 2.0  # a kept prediction does count, on its own row only
    moved = sequence_logps(changed, labels)[0]
    assert moved[0] > base[0] and torch.equal(moved[1:], base[1:])


def test_gradients_reach_the_target_logits_only() -> None:
    logits, labels = batch()
    logits.requires_grad_(True)
    sequence_logps(logits, labels)[0].sum().backward()
    assert logits.grad is not None
    predicting = torch.zeros(4, 9, dtype=torch.bool)
    predicting[:, :-1] = labels[:, 1:] != IGNORE_INDEX
    assert torch.all(logits.grad[~predicting] == 0) and torch.all(logits.grad[predicting].abs().sum(-1) > 0)
