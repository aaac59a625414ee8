"""The rollouts of a global batch (trainer/objectives/rl/rollouts.py): a step's slots dealt the same micro-batches on
any number of ranks, the window's prompts in the global order, rollout batches fixed globally and dealt in turn (the
completions the same whichever rank draws them), and a slot's tensors in TRL's layout."""

from __future__ import annotations

import torch

from storage.split_reader import Split
from tests.unit.trainer.objectives.rl.conftest import load_policy
from trainer.data import Dealing, GlobalOrder
from trainer.model.generation import Completion, Generator, Sampling
from trainer.objectives.rl.rollouts import (
    RolloutPlan,
    Rollouts,
    assemble,
    build_batch,
    deal_slots,
    generate_mine,
    rollout_batches,
)


def slots_of(rows: Split, world: int, step: int = 0, iterations: int = 1) -> list[list[int]]:
    accum = 8 // 2 // world  # 8 completions a step, micro-batches of 2
    return [
        slot.rows
        for rank in range(world)
        for slot in deal_slots(rows, GlobalOrder(len(rows), 1), Dealing(step, 2, accum, rank, world, 0), 4, iterations)
    ]


def test_the_micro_batches_are_the_same_on_any_number_of_ranks(prompts: Split) -> None:
    assert slots_of(prompts, 1) == slots_of(prompts, 2) == slots_of(prompts, 4) == [[0, 1], [2, 3], [4, 5], [6, 7]]
    order = GlobalOrder(len(prompts), 1)
    (slot, *_) = deal_slots(prompts, order, Dealing(3, 2, 4, 0, 1, 0), 4, 2)  # step 3: window 1 of 2-step windows
    assert [p.row for p in slot.window.prompts] == order.step_indices(1, 2)
    assert slot.window.prompts[0].record["columns"]["answer"]


def test_rollout_batches_are_fixed_and_their_completions_do_not_depend_on_the_rank(
    tiny_model: str, prompts: Split
) -> None:
    assert [list(b) for b in rollout_batches(10, 4)] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    (slot, *_) = deal_slots(prompts, GlobalOrder(len(prompts), 1), Dealing(0, 2, 4, 0, 1, 0), 4, 1)
    generator = Generator(load_policy(tiny_model).eval(), 0, [1])
    sampling = Sampling(5, 0.8)

    def scorer(rows: list[int], done: list[Completion]) -> list[list[float]]:
        return [[float(len(c.ids))] for c in done]

    def drawn(rank: int, world: int) -> object:
        return generate_mine(generator, slot.window, RolloutPlan(9, 4, 2, sampling, rank, world), scorer)

    one = assemble([drawn(0, 1)], 8)  # type: ignore[list-item]
    two = assemble([drawn(0, 2), drawn(1, 2)], 8)  # type: ignore[list-item]
    three = assemble([drawn(r, 3) for r in range(3)], 8)  # type: ignore[misc]
    assert one[0] == two[0] == three[0] and torch.equal(one[1], two[1])
    assert len({tuple(c.ids) for c in one[0]}) > 1  # sampled: the completions of a prompt differ


def test_a_slots_tensors_are_trls_layout(prompts: Split) -> None:
    (slot, *_) = deal_slots(prompts, GlobalOrder(len(prompts), 1), Dealing(0, 2, 1, 0, 1, 0), 2, 1)
    completions = [[5, 6, 1], [7]]
    rollouts = Rollouts(0, completions, [True, False], torch.zeros(2, 1), torch.tensor([0.5, -0.5]), {})
    built = slot.built = build_batch(slot, rollouts, 2, 0, mask_truncated=True)
    prompt = slot.window.prompts[0].ids
    assert built.batch.input_ids[0].tolist() == [*prompt, 5, 6, 1]
    assert built.batch.input_ids[1].tolist() == [*prompt, 7, 0, 0]  # the completion right-padded
    assert built.batch.attention_mask[1].tolist() == [1] * (len(prompt) + 1) + [0, 0]
    assert built.completion_ids.tolist() == [[5, 6, 1], [7, 0, 0]]
    assert built.mask.tolist() == [[1, 1, 1], [0, 0, 0]]  # the truncated one out of the loss
    assert built.advantages.tolist() == [0.5, -0.5] and built.old is None and slot.padding == (2, 2 * len(prompt) + 6)
