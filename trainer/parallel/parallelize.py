"""The parallel layout applied to a built model, before DeepSpeed takes it: the attention that sequence parallelism
wraps checked, a mixture of experts' blocks made ZeRO-3 leaves and its router's balance (the load-balancing loss the
step adds, trainer/step.py), and, in the chaos suite only, routers forced apart by rank."""

from __future__ import annotations

import torch

from config.sections.model_train import TrainConfig
from trainer.parallel import sequence_parallel
from trainer.parallel.distributed import Dist
from trainer.parallel.moe import RouterBalance, set_zero3_leaves
from trainer.watch.faults import Faults


def parallelize(
    model: torch.nn.Module, train: TrainConfig, dist: Dist, zero_stage: int, faults: Faults
) -> RouterBalance | None:
    """Lay `model` out for this rank's job; returns a mixture of experts' router balance (None for a dense model)."""
    sequence_parallel.check_attention(model, dist.sequence_parallel)
    faults.route_disjointly(model, dist.rank)
    set_zero3_leaves(model, zero_stage)
    return RouterBalance.of(model.config, train.moe.aux_loss_coef, dist)
