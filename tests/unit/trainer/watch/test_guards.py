"""Failures a retry would only repeat, stopped at once as one-line user errors (exit 2) naming the rank and the fix:
a non-finite loss, and out of accelerator memory on one rank."""

from __future__ import annotations

import math

import pytest
import torch

from core.errors import EXIT_USER_ERROR
from trainer.parallel.distributed import Dist
from trainer.watch.guards import Diverged, OutOfMemory, check_loss, out_of_memory_named


@pytest.mark.parametrize("loss", [math.nan, math.inf, -math.inf])
def test_a_loss_that_is_not_a_number_stops_training(loss: float) -> None:
    with pytest.raises(Diverged) as info:
        check_loss(loss, 17)
    assert str(info.value).startswith(f"training diverged: the loss is {loss} at step 17 on every rank; lower ")
    assert info.value.exit_code == EXIT_USER_ERROR
    check_loss(2.5, 17)


def test_out_of_memory_names_the_node_the_rank_and_the_step() -> None:
    dist = Dist(5, 1, 8, 1, "gpu-02", torch.device("cpu"), local_world=4)
    with pytest.raises(OutOfMemory) as info, out_of_memory_named(dist, 40):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB\nmore detail")
    message = str(info.value)
    assert message.startswith(
        "out of memory on node 1 (gpu-02) rank 5 at step 40: CUDA out of memory. Tried to allocate 2.00 GiB; lower "
    )
    assert "train.gradient_checkpointing=true" in message and "\n" not in message
    with pytest.raises(ValueError, match="not ours"), out_of_memory_named(dist, 40):
        raise ValueError("not ours")
