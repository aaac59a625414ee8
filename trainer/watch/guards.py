"""Failures that a retry would only repeat, stopped at once as one-line `UserError`s (exit 2: the launcher
does not retry them) that name the rank and what to change.

- A non-finite loss: the loss is all-reduced, so every rank sees it at the same step and stops before the
  step's weights can be saved; the newest complete checkpoint predates the divergence.
- Out of GPU memory on one rank: without this, the rank dies with a traceback, torchrun reports "exited
  with code 1", and the launcher retries a failure that recurs at the same step every time.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from core.errors import UserError
from trainer.parallel.distributed import Dist


class Diverged(UserError):
    """The loss became NaN or infinite."""


class OutOfMemory(UserError):
    """A rank ran out of accelerator memory."""


def check_loss(loss: float, step: int) -> None:
    """Stop when the (all-reduced) loss of `step` is not a finite number."""
    if not math.isfinite(loss):
        raise Diverged(
            f"training diverged: the loss is {loss} at step {step} on every rank; lower "
            "train.learning_rate, raise train.warmup_ratio or lower train.max_grad_norm, and check the "
            "data; the newest complete checkpoint is from before this step"
        )


@contextmanager
def out_of_memory_named(dist: Dist, step: int) -> Iterator[None]:
    """Turn an out-of-memory error in this block into one line naming the node, host, rank and step."""
    try:
        yield
    except torch.OutOfMemoryError as exc:
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else "out of memory"
        raise OutOfMemory(
            f"out of memory on node {dist.node_rank} ({dist.host}) rank {dist.rank} at step {step}: {first_line}; "
            "lower train.micro_batch_size (train.global_batch_size keeps the batch; without it raise "
            "train.gradient_accumulation_steps) or data.max_length, set train.gradient_checkpointing=true, or use "
            "ZeRO-3 with CPU offload"
        ) from None
