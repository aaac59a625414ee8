"""Batching: each step's examples are dealt to ranks exactly once, by length, with balanced work."""

from __future__ import annotations

import random
import statistics

import pytest

from config.sections.model_train import TrainConfig
from pipeline.plan import total_steps
from storage.shards import Row, row
from trainer.data import Dealing, GlobalOrder, deal_by_length, rank_micro_batches


def examples(n: int, seed: int = 0) -> list[Row]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        length = min(512, max(4, int(rng.lognormvariate(4.0, 0.8))))
        out.append(row([1] * length, [-100] + [1] * (length - 1)))
    return out


@pytest.mark.parametrize(("micro", "accum", "world"), [(4, 2, 2), (1, 4, 3), (2, 1, 1), (3, 3, 4)])
def test_every_example_of_a_step_goes_to_exactly_one_micro_batch(micro: int, accum: int, world: int) -> None:
    indices = GlobalOrder(100, seed=3).step_indices(step=7, per_step=micro * accum * world)
    lengths = {i: (i * 37) % 50 + 1 for i in indices}
    dealt = deal_by_length(indices, lengths, micro, accum, world)
    assert len(dealt) == world and all(len(rank) == accum for rank in dealt)
    flat = [i for rank in dealt for group in rank for i in group]
    assert sorted(flat) == sorted(indices)
    assert all(len(group) == micro for rank in dealt for group in rank)


def test_steps_walk_the_epoch_without_repeats() -> None:
    n, per_step = 50, 8
    order = GlobalOrder(n, seed=1)
    seen = [i for step in range(7) for i in order.step_indices(step=step, per_step=per_step)]
    assert sorted(seen[:n]) == list(range(n))  # the first 50 draws are one full epoch
    assert seen[n:] != seen[: len(seen) - n]  # the next epoch is shuffled differently


def test_length_grouping_cuts_padding_and_balances_ranks() -> None:
    data = examples(400)
    kwargs = {"micro": 4, "accum": 4, "world": 4, "pad_id": 0}
    order = GlobalOrder(len(data), seed=5)
    result = {}
    for grouped in (True, False):
        pads = positions = 0
        imbalance = []  # per step: the slowest rank's padded tokens over the fastest's (ranks sync every step)
        for step in range(20):
            per_rank = []
            for rank in range(4):
                dealing = Dealing(
                    step, kwargs["micro"], kwargs["accum"], rank, kwargs["world"], kwargs["pad_id"], grouped
                )
                batches = list(rank_micro_batches(data, order, dealing))
                pads += sum(b.padding[0] for b in batches)
                positions += sum(b.padding[1] for b in batches)
                per_rank.append(sum(b.padding[1] for b in batches))
            imbalance.append(max(per_rank) / min(per_rank))
        result[grouped] = (pads / positions, statistics.mean(imbalance))
    (grouped_pad, grouped_imbalance), (plain_pad, plain_imbalance) = result[True], result[False]
    assert grouped_pad < plain_pad / 3, result
    assert grouped_imbalance < 1.3 and grouped_imbalance < plain_imbalance - 0.2, result


def test_epochs_give_the_step_count_when_max_steps_is_empty() -> None:
    train = TrainConfig(micro_batch_size=2, gradient_accumulation_steps=4, epochs=2.5)
    assert total_steps(train, train_records=1000, world_size=4) == 79  # ceil(2.5 * 1000 / 32)
    assert total_steps(TrainConfig(max_steps=7), train_records=1000, world_size=4) == 7
