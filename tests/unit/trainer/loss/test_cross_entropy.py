"""The loss of training and evaluation (trainer/loss/cross_entropy.py): `shift` pairs each position's float32 logits
with the label of the next position, and `cross_entropy` of those pairs equals torch's cross-entropy over the kept
positions alone: summed (the numerator the objectives divide by their target count), or per position with exactly 0
where the label is IGNORE_INDEX, whatever the logits there."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from storage.shards import IGNORE_INDEX
from trainer.loss.cross_entropy import cross_entropy, shift

VOCAB = 11


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    """(bfloat16 logits, labels) of 3 rows of 7 positions: a masked prompt, one row right-padded, one all masked."""
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 7, VOCAB, generator=generator).to(torch.bfloat16)
    labels = torch.randint(0, VOCAB, (3, 7), generator=generator)
    labels[:, :2] = IGNORE_INDEX
    labels[1, 5:] = IGNORE_INDEX
    labels[2, :] = IGNORE_INDEX
    return logits, labels


def test_shift_pairs_each_position_with_the_next_label_in_float32() -> None:
    logits, labels = batch()
    shifted, targets = shift(logits, labels)
    assert shifted.dtype == torch.float32 and shifted.shape == (3, 6, VOCAB) and targets.shape == (3, 6)
    assert torch.equal(shifted, logits[:, :6].float()) and torch.equal(targets, labels[:, 1:])


def test_the_sum_is_torchs_cross_entropy_over_the_kept_positions_only() -> None:
    shifted, targets = shift(*batch())
    kept = targets != IGNORE_INDEX
    assert int(kept.sum()) == 5 + 3  # rows 0 and 1; the masked row adds nothing
    expected = F.cross_entropy(shifted[kept], targets[kept], reduction="sum")
    got = cross_entropy(shifted, targets, "sum")
    assert got.shape == () and torch.allclose(got, expected, rtol=1e-6)
    # the mean the evaluation divides once: the sum over the count of kept positions, torch's ignore_index mean
    mean = F.cross_entropy(shifted.reshape(-1, VOCAB), targets.reshape(-1), ignore_index=IGNORE_INDEX)
    assert torch.allclose(got / kept.sum(), mean, rtol=1e-6)


def test_per_position_losses_are_zero_where_ignored_and_torchs_elsewhere() -> None:
    shifted, targets = shift(*batch())
    per_position = cross_entropy(shifted, targets, "none").reshape(targets.shape)
    kept = targets != IGNORE_INDEX
    assert torch.all(per_position[~kept] == 0)
    by_hand = -torch.log_softmax(shifted, dim=-1).gather(2, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    assert torch.allclose(per_position[kept], by_hand[kept], rtol=1e-6)
    assert torch.all(per_position[kept] > 0)


def test_the_logits_of_an_ignored_position_do_not_count() -> None:
    shifted, targets = shift(*batch())
    changed = shifted.clone()
    changed[targets == IGNORE_INDEX] = 1e4  # a position predicting an ignored label: anything at all
    assert torch.equal(cross_entropy(changed, targets, "sum"), cross_entropy(shifted, targets, "sum"))
    changed[0, 3, 0] += 5.0  # a kept one does
    assert not torch.equal(cross_entropy(changed, targets, "sum"), cross_entropy(shifted, targets, "sum"))
