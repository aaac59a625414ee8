"""The global batch as the invariant: accumulation derived per world size, and a batch that does not divide named with
the nearest valid choices."""

from __future__ import annotations

import pytest

from config.batch import accumulation_steps, batch_problem
from config.loader import load_config
from core.errors import UserError
from pipeline.plan import total_steps


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


def test_accumulation_is_derived_from_the_global_batch_for_every_world_size() -> None:
    cfg = load_config(
        None,
        [
            "train.global_batch_size=12",
            "train.micro_batch_size=2",
            "launch.nnodes=3",
            "launch.min_nnodes=1",
            "launch.max_nnodes=3",
            "train.max_steps=",
        ],
    )
    assert [cfg.accumulation_steps(w) for w in (1, 2, 3)] == [6, 3, 2]
    assert {cfg.global_batch(w) for w in (1, 2, 3)} == {12}
    # Steps (hence the schedule) count global batches, whatever the world size.
    assert {total_steps(cfg.train, 120, w) for w in (1, 2, 3)} == {10}


def test_a_global_batch_that_does_not_divide_names_the_values_and_the_nearest_choices() -> None:
    with pytest.raises(UserError) as info:
        load_config(None, ["train.global_batch_size=10", "train.micro_batch_size=2", "launch.nnodes=3"])
    message = str(info.value)
    assert "\n" not in message
    assert (
        "train.global_batch_size=10 does not divide into train.micro_batch_size=2 x 3 ranks; nearest valid: "
        "train.global_batch_size=6 or 12"
    ) in message
    with pytest.raises(
        UserError,
        match=r"x 2 ranks \(world sizes 2..4 come from launch.min_nnodes..max_nnodes\); "
        r"nearest valid: train.global_batch_size=48, or train.micro_batch_size=1",
    ):
        load_config(
            None,
            [
                "train.global_batch_size=12",
                "train.micro_batch_size=4",
                "launch.nnodes=3",
                "launch.min_nnodes=2",
                "launch.max_nnodes=4",
            ],
        )
