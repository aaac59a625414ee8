"""An objective's sums as a typed value (trainer/objectives/sums.py): device tensors added up without reading them (a
read waits for the device; the step reads once), equal bit for bit to adding each micro-batch's value as a Python
float; read in field order, and rebuilt from the numbers an all-reduce gives back."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from trainer.objectives.sums import Number, Sums


@dataclass(frozen=True)
class Two(Sums):
    loss_sum: Number = 0.0
    micro_batches: Number = 0.0
    absent: Number = 0.0


def test_tensor_sums_stay_tensors_until_read_and_equal_float_accumulation_to_the_bit() -> None:
    generator = torch.Generator().manual_seed(0)
    micro = [Two((torch.rand((), generator=generator) * 1e4).float(), 1.0) for _ in range(37)]
    total = Two()
    for sums in micro:
        total = total.plus(sums)
    assert isinstance(total.loss_sum, torch.Tensor) and total.loss_sum.dtype == torch.float64
    expected = 0.0
    for sums in micro:
        expected += float(sums.loss_sum)
    assert total.values() == [expected, 37.0, 0.0]


def test_the_sums_round_trip_through_their_numbers_in_field_order() -> None:
    sums = Two(torch.tensor(2.5), 3.0, 0.0)
    assert Two.width() == 3 and Two.of(sums.values()) == Two(2.5, 3.0, 0.0)
    with pytest.raises(AssertionError, match="Two has 3 sums, got 2 values"):
        Two.of([1.0, 2.0])
