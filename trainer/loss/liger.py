"""SFT's training loss through Liger Kernel's fused linear cross-entropy (train.kernels=liger,
trainer/model/kernels.py).

The same summed cross-entropy as trainer/loss/chunked.py, from the same target positions of the last hidden states;
Liger's kernel applies the output layer and the loss block by block and computes the gradients in the forward pass,
so neither the logits nor their gradient exist whole. It reads the output layer's weight directly, not through the
layer's forward:

- under ZeRO-3 that weight is partitioned (empty on every rank): it is gathered (deepspeed.zero.GatheredParameters)
  for the forward pass and again for the backward pass, where its gradient accumulates (`PartitionedFused`), the
  failure of Liger's issue 1048 otherwise;
- an output layer that is not a plain `nn.Linear` (LoRA on the head, a quantized head) would lose its adapter or its
  dequantization: such a head keeps the chunked loss, said in the log.

Evaluation keeps the chunked loss's sums (LossHead.eval_sums, in float64), so the evaluation's metrics do not depend
on the kernels.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from storage.shards import IGNORE_INDEX
from trainer.loss.chunked import LossHead, target_positions

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LigerLossHead(LossHead):
    """LossHead whose training loss is Liger's fused linear cross-entropy over the target positions."""

    @classmethod
    def of_head(cls, chunked: LossHead) -> LossHead:
        """The fused loss for `chunked`'s output layer where it is a plain Linear; `chunked` itself otherwise."""
        head = chunked.head
        if head is None:
            return chunked
        if type(head) is not torch.nn.Linear:
            log.info(
                "loss: the chunked loss, not Liger's fused one: the output layer is a %s (LoRA or quantized), whose "
                "weight alone is not the layer",
                type(head).__name__,
            )
            return chunked
        log.info("loss: Liger's fused linear cross-entropy over the target positions (train.kernels)")
        return cls(head, chunked.chunk_tokens, chunked.partitioned, chunked.vocab_size, chunked.one_pass_max_bytes)

    def summed(self, out: Any, labels: torch.Tensor) -> torch.Tensor:
        """Cross-entropy summed over the predicted positions (labels shifted by one), differentiable."""
        hidden, targets = target_positions(out.hidden_states[-1], labels)
        assert isinstance(self.head, torch.nn.Linear), "of_head keeps plain Linear heads only"
        if self.partitioned:
            loss: torch.Tensor = PartitionedFused.apply(hidden, targets, self.head)
            return loss
        return fused_cross_entropy(hidden, self.head.weight, targets, self.head.bias, reduction="sum")


class PartitionedFused(torch.autograd.Function):
    """Liger's fused loss through a ZeRO-3-partitioned output layer. The fused kernel reads the weight directly, not
    through the layer's forward, so DeepSpeed's hooks never gather it: forward gathers it for the value alone, and
    backward gathers it again and runs the kernel with autograd, so the weight's gradient accumulates while the
    weight is whole and reaches ZeRO-3's reduce as a layer's would. Gathered only in forward, the gradient (vocabulary
    x hidden) would meet an empty partition in backward: Liger's issue 1048."""

    @staticmethod
    def forward(ctx: Any, hidden: torch.Tensor, targets: torch.Tensor, head: torch.nn.Linear) -> torch.Tensor:
        ctx.head = head
        ctx.save_for_backward(hidden, targets)
        with gathered(head), torch.no_grad():  # detached: the kernel computes no gradient here
            return fused_cross_entropy(hidden.detach(), head.weight.detach(), targets, _detached(head.bias))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, None, None]:
        hidden, targets = ctx.saved_tensors
        hidden = hidden.detach().requires_grad_()
        with gathered(ctx.head), torch.enable_grad():
            loss = fused_cross_entropy(hidden, ctx.head.weight, targets, ctx.head.bias)
            torch.autograd.backward(loss, grad)
        return hidden.grad, None, None


def _detached(tensor: torch.Tensor | None) -> torch.Tensor | None:
    return None if tensor is None else tensor.detach()


def fused_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    reduction: str = "sum",
) -> torch.Tensor:
    """Liger's fused linear cross-entropy of `hidden @ weight.T (+ bias)` against `targets` (IGNORE_INDEX ignored)."""
    from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy

    return liger_fused_linear_cross_entropy(
        hidden, weight, targets, bias, ignore_index=IGNORE_INDEX, reduction=reduction
    )


@contextlib.contextmanager
def gathered(head: torch.nn.Module) -> Iterator[None]:
    """A ZeRO-3-partitioned head's whole weight while the fused loss reads it (gathered read-only on every rank)."""
    import deepspeed

    with deepspeed.zero.GatheredParameters(list(head.parameters()), modifier_rank=None):
        yield
