"""The global batch as the invariant: accumulation derived per world size, and a batch that does not divide named with
the nearest valid choices."""

from __future__ import annotations

import pytest

from config.batch import accumulation_steps, batch_problem
from core.errors import UserError


def test_accumulation_comes_from_the_global_batch_when_it_is_set() -> None:
    assert [accumulation_steps(24, 2, 8, world) for world in (1, 2, 3, 4, 6)] == [12, 6, 4, 3, 2]
    assert accumulation_steps(None, 2, 8, 3) == 8  # train.gradient_accumulation_steps, whatever the world size


def test_a_batch_that_does_not_divide_names_the_values_and_the_nearest_choices() -> None:
    with pytest.raises(UserError) as info:
        accumulation_steps(10, 2, 8, 3)
    assert str(info.value) == (
        "train.global_batch_size=10 does not divide into train.micro_batch_size=2 x 3 ranks; "
        "nearest valid: train.global_batch_size=6 or 12"
    )  # no micro-batch size makes 10 divide by 3 ranks
    assert batch_problem(12, 2, [1, 2, 3]) is None
    problem = batch_problem(24, 5, [1, 2, 3, 4])
    assert problem == (
        "train.global_batch_size=24 does not divide into train.micro_batch_size=5 x 1 ranks (world sizes 1..4 come "
        "from launch.min_nnodes..max_nnodes); nearest valid: train.global_batch_size=60, or train.micro_batch_size=2"
    )  # 2: the micro-batch size nearest 5 that divides 24 rows on 1, 2, 3 and 4 ranks
    assert "\n" not in problem
