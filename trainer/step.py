"""One optimizer step of any objective: forward and backward of this rank's micro-batches, the optimizer, and the
step's figures reduced over every rank in one all-reduce (sums, then divided once).

The objective (trainer/objectives/base.py) decides what is summed and how a micro-batch's loss is scaled; the step
owns what does not depend on it: the heartbeats that mark arrival at a collective, the faults a test injects
(trainer/watch/faults.py), the compute time the straggler watch compares, the token and padding counts, and a mixture
of experts' load balance: the router's load-balancing loss of the micro-batch's policy pass (trainer/objectives/
policy.py), weighted, is added to every objective's loss here, once, and logged apart (`aux_loss`, the experts'
load). A micro-batch loss that is not finite (a diverged loss, or one a fault made NaN) makes the step's loss NaN on
every rank, which stops the run at this step (trainer/watch/guards.py), before its weights can be saved.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import torch

from trainer.metrics import StepStats
from trainer.objectives.base import MicroBatch, TrainObjective
from trainer.objectives.policy import Policy
from trainer.objectives.sums import Number, Sums
from trainer.parallel.distributed import Dist, dist_sum
from trainer.watch.faults import Faults
from trainer.watch.heartbeat import Heartbeat

BatchT = TypeVar("BatchT", bound=MicroBatch)
ScopeT = TypeVar("ScopeT")
SumsT = TypeVar("SumsT", bound=Sums)


class Engine(Protocol):
    """What the step asks of a DeepSpeed engine."""

    def backward(self, loss: torch.Tensor) -> Any:
        """Backward pass of a micro-batch's loss (DeepSpeed scales and reduces the gradients)."""
        ...

    def step(self) -> Any:
        """The optimizer step, at the accumulation boundary (a no-op before it)."""
        ...


@dataclass(frozen=True)
class StepCounts(Sums):
    """What the step itself sums over micro-batches and ranks: real tokens, pad positions, all positions, losses that
    were not finite, and a mixture of experts' load-balancing loss (unweighted) over its micro-batches."""

    tokens: Number = 0.0
    pads: Number = 0.0
    positions: Number = 0.0
    nonfinite: Number = 0.0
    aux_loss_sum: Number = 0.0
    micro_batches: Number = 0.0


@dataclass(frozen=True)
class StepTools:
    """The rank's place, its heartbeat and the faults a test injects: what every step is run with."""

    dist: Dist
    heartbeat: Heartbeat
    faults: Faults


def optimizer_step(
    engine: Engine,
    policy: Policy,
    batches: Sequence[BatchT],
    objective: TrainObjective[BatchT, ScopeT, SumsT],
    tools: StepTools,
    step: int,
) -> tuple[StepStats, dict[str, float]]:
    """Forward/backward every micro-batch of optimizer step `step` (1-based) so that the gradient is that of the
    global batch's loss, then the optimizer; returns the step's stats and the objective's own step metrics."""
    dist, faults = tools.dist, tools.faults
    tools.heartbeat.beat(step)  # beats mark arrival at a collective: a stuck rank's beat is the oldest
    scope = objective.begin_step(policy, batches, dist)
    sums, counts = objective.sums_type(), StepCounts()
    losses: list[torch.Tensor] = []
    compute_s = 0.0
    for batch in batches:
        started = time.perf_counter()
        faults.in_micro_batch(dist.rank, step)
        micro = objective.micro_batch(policy, batch, scope)
        loss, counts = with_aux(micro.backward, policy, counts)
        loss = faults.poison(loss, dist.rank, step)
        tools.heartbeat.beat(step)
        # Only the forward pass is timed for straggler detection: DeepSpeed's backward reduces gradients across
        # ranks, so it would include waiting for the slowest rank.
        compute_s += time.perf_counter() - started
        engine.backward(loss)
        engine.step()
        # Kept on the device, as the sums are: reading a value waits for the device, once a step below.
        losses.append(loss.detach())
        sums = sums.plus(micro.sums)
        pad, total = batch.padding
        counts = counts.plus(StepCounts(tokens=total - pad, pads=pad, positions=total))
    # The step's one wait for the device: every micro-batch's loss and sums, read after the last backward is queued.
    nonfinite = int((~torch.isfinite(torch.stack([loss.float() for loss in losses]))).sum())
    counts = counts.plus(StepCounts(nonfinite=nonfinite))
    values = dist_sum([*sums.values(), *counts.values()], dist)
    reduced = StepCounts.of(values[sums.width() :])
    result = objective.end_step(objective.sums_type.of(values[: sums.width()]), scope)
    stats = StepStats(
        math.nan if float(reduced.nonfinite) else result.loss,
        result.target_tokens,
        int(float(reduced.tokens)),
        float(reduced.pads) / max(float(reduced.positions), 1.0),
        compute_s,
    )
    return stats, result.metrics | router_metrics(policy, reduced)


def with_aux(backward: torch.Tensor, policy: Policy, counts: StepCounts) -> tuple[torch.Tensor, StepCounts]:
    """A micro-batch's loss for backward with its mixture of experts' weighted load-balancing loss added (DeepSpeed's
    average over accumulation and ranks makes it the step's mean of it), and the counts with the unweighted one."""
    aux = policy.take_aux()
    if aux is None or policy.router is None:
        return backward, counts
    counts = counts.plus(StepCounts(aux_loss_sum=aux.detach(), micro_batches=1.0))
    return backward + policy.router.coef * aux, counts


def router_metrics(policy: Policy, reduced: StepCounts) -> dict[str, float]:
    """A mixture of experts' step metrics: the load-balancing loss (mean over micro-batches) and the experts' load
    over every rank (a collective: every rank calls it); none for a dense model."""
    if policy.router is None:
        return {}
    aux = float(reduced.aux_loss_sum) / max(float(reduced.micro_batches), 1.0)
    return {"aux_loss": aux, **policy.router.end_step()}
