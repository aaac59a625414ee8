"""The step's metric sums (trainer/objectives/base.py): device tensors added up without reading them (a read waits for
the device; the step reads once), equal bit for bit to adding each micro-batch's value as a Python float."""

from __future__ import annotations

import torch

from trainer.objectives.base import Pending, add, settled


def test_tensor_sums_stay_tensors_until_settled_and_equal_float_accumulation_to_the_bit() -> None:
    generator = torch.Generator().manual_seed(0)
    micro = [
        {"loss_sum": (torch.rand((), generator=generator) * 1e4).float(), "micro_batches": 1.0} for _ in range(37)
    ]
    pending: Pending = {}
    for sums in micro:
        add(pending, sums, ["loss_sum", "micro_batches", "absent"])
    assert isinstance(pending["loss_sum"], torch.Tensor) and pending["loss_sum"].dtype == torch.float64
    expected = 0.0
    for sums in micro:
        expected += float(sums["loss_sum"])
    assert settled(pending) == {"loss_sum": expected, "micro_batches": 37.0, "absent": 0.0}
