"""The policy: the model an objective trains, as the objective calls it.

Every objective runs its micro-batches through `Policy.forward`, and that is where a mixture of experts' load
balance is taken, once for every objective: a pass with gradients (the policy's own, not the reference's or an
evaluation's) also asks the model for its router logits, and the router's load-balancing loss is kept until the
optimizer step takes it (`take_aux`) and adds it, weighted, to the micro-batch's loss (trainer/step.py). An objective
never sees the router.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from trainer.data import Batch
from trainer.parallel.moe import RouterBalance


class Policy:
    """The model (a DeepSpeed engine while training, a plain model in evaluation) on its device, with a mixture of
    experts' router balance (`router`: None for a dense model, and outside training)."""

    def __init__(self, module: torch.nn.Module, device: torch.device, router: RouterBalance | None = None) -> None:
        self.module, self.device, self.router = module, device, router
        self._aux: list[torch.Tensor] = []

    def forward(self, batch: Batch, extra: Mapping[str, Any]) -> Any:
        """The model's output for `batch` on the device, with `extra` keyword arguments (a loss head's); with a router
        and gradients on, its load-balancing loss is kept for the step (the routed tokens counted for its load)."""
        balance = self.router is not None and torch.is_grad_enabled()
        router_kwargs = self.router.forward_kwargs if self.router is not None and balance else {}
        out = self.module(**batch.model_inputs(self.device), **extra, **router_kwargs)
        if self.router is not None and balance:
            self._aux.append(self.router.observe(out, batch.attention_mask))
        return out

    def take_aux(self) -> torch.Tensor | None:
        """The unweighted load-balancing loss of the passes since the last call (None without a router or a pass)."""
        aux, self._aux = self._aux, []
        if not aux:
            return None
        return aux[0] if len(aux) == 1 else torch.stack(aux).sum()
