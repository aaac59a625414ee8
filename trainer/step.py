"""One optimizer step of any objective: forward and backward of this rank's micro-batches, the optimizer, and the
step's figures reduced over every rank in one all-reduce (sums, then divided once).

The objective (trainer/objectives/base.py) decides what is summed and how a micro-batch's loss is scaled; the step
owns what does not depend on it: the heartbeats that mark arrival at a collective, the chaos suite's fault hooks
(trainer/watch/faults.py), the compute time the straggler watch compares, the token and padding counts. A micro-batch
loss
that is not finite (a diverged loss, or one the fault hooks made NaN) makes the step's loss NaN on every rank, which
stops the run at this step (trainer/watch/guards.py), before its weights can be saved.
"""

from __future__ import annotations

import math
import time
from typing import Any

import torch

from trainer.metrics import StepStats
from trainer.objectives.base import Pending, TrainObjective, add, settled
from trainer.parallel.distributed import Dist, dist_sum
from trainer.watch import faults
from trainer.watch.heartbeat import Heartbeat


def optimizer_step(
    engine: Any, batches: list[Any], dist: Dist, heartbeat: Heartbeat, step: int, objective: TrainObjective
) -> tuple[StepStats, dict[str, float]]:
    """Forward/backward every micro-batch of optimizer step `step` (1-based) so that the gradient is that of the
    global batch's loss, then the optimizer; returns the step's stats and the objective's own step metrics."""
    heartbeat.beat(step)  # beats mark arrival at a collective: a stuck rank's beat is the oldest
    scope = objective.begin_step(engine, batches, dist)
    sums: Pending = {}
    losses: list[torch.Tensor] = []
    tokens = pads = positions = 0
    compute_s = 0.0
    for batch in batches:
        started = time.perf_counter()
        faults.maybe_slow(dist.rank)
        faults.maybe_stall(dist.rank, step)
        micro = objective.micro_batch(engine, batch, scope)
        loss = faults.maybe_poison(micro.backward, dist.rank, step)
        heartbeat.beat(step)
        # Only the forward pass is timed for straggler detection: DeepSpeed's backward reduces gradients across
        # ranks, so it would include waiting for the slowest rank.
        compute_s += time.perf_counter() - started
        engine.backward(loss)
        engine.step()
        # Kept on the device, as the sums are: reading a value waits for the device, once a step below.
        losses.append(loss.detach())
        add(sums, micro.sums, objective.sum_keys)
        pad, total = batch.padding
        pads, positions, tokens = pads + pad, positions + total, tokens + total - pad
    # The step's one wait for the device: every micro-batch's loss and sums, read after the last backward is queued.
    nonfinite = int((~torch.isfinite(torch.stack([loss.float() for loss in losses]))).sum())
    mine = settled(sums)
    keys = objective.sum_keys
    values = dist_sum([*(mine.get(key, 0.0) for key in keys), tokens, pads, positions, nonfinite], dist)
    all_tokens, all_pads, all_positions, all_nonfinite = values[len(keys) :]
    result = objective.end_step(dict(zip(keys, values, strict=False)), scope)
    stats = StepStats(
        math.nan if all_nonfinite else result.loss,
        result.target_tokens,
        int(all_tokens),
        all_pads / max(all_positions, 1.0),
        compute_s,
    )
    return stats, result.metrics
