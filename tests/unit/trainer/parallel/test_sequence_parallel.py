"""A micro-batch cut into sequence-parallel parts: labels shifted before the cut (each part carries the label its
last position predicts), the row padded to a multiple of the size with ignored positions, explicit positions; the
parts' target tokens and summed losses add up to the whole row's exactly. Packed rows and a model whose attention
Ulysses does not wrap are refused in one line. (Ulysses itself on real ranks: tests/distributed/
test_sequence_parallel.py.)"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from core.errors import UserError
from storage.shards import IGNORE_INDEX, Row
from trainer.data import collate
from trainer.loss.chunked import LossHead
from trainer.loss.cross_entropy import cross_entropy, shift
from trainer.parallel.distributed import Dist
from trainer.parallel.sequence_parallel import check_attention, shard


def dist(rank: int, size: int, world: int = 0) -> Dist:
    world = world or size
    return Dist(rank, rank, world, 0, "host", torch.device("cpu"), world, size)


def rows() -> list[Row]:
    # 7 and 4 tokens: the first prompt (3 tokens) is not a target, the second row is padded in the batch
    return [
        Row([5, 6, 7, 8, 9, 10, 11], [IGNORE_INDEX] * 3 + [8, 9, 10, 11], [7]),
        Row([12, 13, 14, 15], [12, 13, 14, 15], [4]),
    ]


@pytest.mark.parametrize("size", [2, 3, 4])
def test_parts_add_up_to_the_row(size: int) -> None:
    batch = collate(rows(), pad_id=0)
    parts = [shard(batch, dist(rank, size)) for rank in range(size)]
    assert sum(part.target_tokens for part in parts) == batch.target_tokens
    assert sum(part.padding[1] - part.padding[0] for part in parts) == int(batch.attention_mask.sum())
    width = parts[0].input_ids.size(1)
    assert all(part.input_ids.size(1) == width and part.labels.size(1) == width + 1 for part in parts)
    assert torch.cat([part.position_ids for part in parts], 1)[0].tolist() == list(range(width * size))
    assert torch.equal(torch.cat([part.input_ids for part in parts], 1)[:, :7], batch.input_ids)

    torch.manual_seed(0)
    logits = torch.randn(2, width * size, 16)  # as if one model had seen the whole (padded) row
    whole = cross_entropy(*shift(logits[:, :7], batch.labels), reduction="sum")
    pieces = [
        cross_entropy(*shift(logits[:, rank * width : (rank + 1) * width], part.labels), reduction="sum")
        for rank, part in enumerate(parts)
    ]
    assert torch.stack(pieces).sum().item() == pytest.approx(whole.item(), rel=1e-6)


def test_the_loss_head_reads_parts_alike() -> None:
    batch = collate(rows(), pad_id=0)
    parts = [shard(batch, dist(rank, 2)) for rank in range(2)]
    head = torch.nn.Linear(4, 16, bias=False)
    torch.manual_seed(1)
    hidden = torch.randn(2, 8, 4)
    loss = LossHead(head, chunk_tokens=2, vocab_size=16)
    whole = loss.summed(SimpleNamespace(hidden_states=[hidden[:, :7]]), batch.labels)
    pieces = [loss.summed(SimpleNamespace(hidden_states=[hidden[:, r * 4 : (r + 1) * 4]]), p.labels) for r, p in
              enumerate(parts)]  # fmt: skip
    assert (pieces[0] + pieces[1]).item() == pytest.approx(whole.item(), rel=1e-6)
    sums = [loss.eval_sums(SimpleNamespace(hidden_states=[hidden[:, r * 4 : (r + 1) * 4]]), p.labels) for r, p in
            enumerate(parts)]  # fmt: skip
    assert sums[0][1] + sums[1][1] == batch.target_tokens


def test_without_sequence_parallelism_a_batch_is_unchanged() -> None:
    batch = collate(rows(), pad_id=0)
    assert shard(batch, dist(0, 1, world=2)) is batch


def test_packed_rows_and_unwrapped_attention_are_refused() -> None:
    packed = collate([Row([1, 2, 3, 4], [1, 2, 3, 4], [2, 2])], pad_id=0)
    with pytest.raises(UserError, match=r"packed rows.*data\.packing=false"):
        shard(packed, dist(0, 2))
    model = SimpleNamespace(config=SimpleNamespace(_attn_implementation="eager"))
    with pytest.raises(UserError, match="attention 'eager'"):
        check_attention(model, 2)
    check_attention(model, 1)


def test_zero3_divides_a_gradient_by_every_rank_and_the_loss_scale_follows() -> None:
    """DeepSpeed 0.19 divides a summed gradient by the data-parallel ranks under ZeRO-2 but by every rank under ZeRO-3's
    reduce-scatter: the loss scale (Dist.gradient_ranks) follows the engine, and ZeRO-3 without reduce-scatter, which
    divides either way by bucket size, is refused. The multirun test shows the trajectory (2 x 2 under ZeRO-3)."""
    from trainer.parallel.sequence_parallel import gradient_divisor

    split = dist(0, 2, world=4)
    zero2, zero3 = {"zero_optimization": {"stage": 2}}, {"zero_optimization": {"stage": 3}}
    assert gradient_divisor(split, zero2) is None and split.gradient_ranks == split.data_world == 2
    assert gradient_divisor(split, zero3) == 4 and gradient_divisor(dist(0, 1, world=4), zero3) is None
    with pytest.raises(UserError, match=r"zero_optimization\.reduce_scatter false.*remove it"):
        gradient_divisor(split, {"zero_optimization": {"stage": 3, "reduce_scatter": False}})
