"""Token shards -> per-rank micro-batches, deterministically from (seed, step) alone.

Every rank computes the same global order; a step takes the next
`micro_batch_size * gradient_accumulation_steps * world_size` examples of it. So the data a step
sees depends only on the step, which makes "resume at step N" exact and node layouts (2 nodes x 1
rank vs 1 node x 2 ranks) equivalent.

Within a step, examples are grouped by length (length grouping, not packing): the step's examples are
sorted by length, cut into micro-batches, and the micro-batches are dealt to ranks so that padded
token counts balance (longest first, to the least-loaded rank). Packing would remove padding
entirely, but exact packing needs per-document attention masks (flash-attention varlen kernels,
GPU only); without them packed documents attend to each other and the loss changes. Grouping keeps
every example independent, so the loss equals the unpadded one, and ranks get similar work. The
loss is normalized by the step's global target-token count, so how examples are dealt to ranks and
micro-batches does not change the gradient.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from storage.shards import IGNORE_INDEX, Example, load_split

__all__ = ["IGNORE_INDEX", "Batch", "Example", "collate", "load_split", "rank_micro_batches"]


@dataclass(frozen=True)
class Batch:
    """A padded micro-batch."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    labels: torch.Tensor

    @property
    def target_tokens(self) -> int:
        """Positions that are predicted (labels after the shift, not -100)."""
        return int((self.labels[:, 1:] != IGNORE_INDEX).sum())

    @property
    def padding(self) -> tuple[int, int]:
        """(pad positions, all positions)."""
        return int((self.attention_mask == 0).sum()), self.attention_mask.numel()


def collate(examples: list[Example], pad_id: int) -> Batch:
    """Right-pad to the longest example: pad id for inputs, -100 for labels, 0 in the mask."""
    width = max(len(ids) for ids, _ in examples)
    ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    labels = torch.full((len(examples), width), IGNORE_INDEX, dtype=torch.long)
    mask = torch.zeros((len(examples), width), dtype=torch.long)
    for row, (example_ids, example_labels) in enumerate(examples):
        n = len(example_ids)
        ids[row, :n] = torch.tensor(example_ids)
        labels[row, :n] = torch.tensor(example_labels)
        mask[row, :n] = 1
    return Batch(ids, mask, labels)


def global_order(n_examples: int, seed: int, epoch: int) -> list[int]:
    """The epoch's permutation of example indices, identical on every rank."""
    order = list(range(n_examples))
    random.Random(seed * 1_000_003 + epoch).shuffle(order)
    return order


def step_indices(n_examples: int, seed: int, step: int, per_step: int) -> list[int]:
    """The global indices consumed by optimizer step `step` (0-based), wrapping across epochs."""
    out: list[int] = []
    position = step * per_step
    while len(out) < per_step:
        epoch, offset = divmod(position, n_examples)
        take = min(per_step - len(out), n_examples - offset)
        out.extend(global_order(n_examples, seed, epoch)[offset : offset + take])
        position += take
    return out


def deal_by_length(indices: list[int], lengths: dict[int, int], micro: int, accum: int, world: int,
                   rotation: int = 0) -> list[list[list[int]]]:
    """Sort by length, cut into micro-batches, deal them to ranks balancing padded tokens.

    Returns per rank a list of `accum` micro-batches (lists of example indices). Deterministic: ties
    break on index, and on rank order rotated by `rotation` (the step), so that the longest
    micro-batch does not land on rank 0 every step.
    """
    ordered = sorted(indices, key=lambda i: (-lengths[i], i))
    groups = [ordered[start : start + micro] for start in range(0, len(ordered), micro)]
    cost = [len(g) * max(lengths[i] for i in g) for g in groups]
    load, dealt = [0] * world, [[] for _ in range(world)]
    for g in sorted(range(len(groups)), key=lambda k: (-cost[k], k)):
        rank = min((r for r in range(world) if len(dealt[r]) < accum), key=lambda r: (load[r], (r - rotation) % world))
        dealt[rank].append(groups[g])
        load[rank] += cost[g]
    return dealt


def rank_micro_batches(
    examples: list[Example], *, seed: int, step: int, micro: int, accum: int, rank: int, world: int, pad_id: int,
    group_by_length: bool = True,
) -> Iterator[Batch]:
    """This rank's `accum` micro-batches for optimizer step `step`."""
    per_rank = micro * accum
    indices = step_indices(len(examples), seed, step, per_rank * world)
    if group_by_length:
        lengths = {i: len(examples[i][0]) for i in indices}
        mine = deal_by_length(indices, lengths, micro, accum, world, rotation=step)[rank]
    else:
        flat = indices[rank * per_rank : (rank + 1) * per_rank]
        mine = [flat[start : start + micro] for start in range(0, per_rank, micro)]
    for group in mine:
        yield collate([examples[i] for i in group], pad_id)
