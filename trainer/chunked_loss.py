"""The loss of trainer/loss.py computed from the last hidden states, a chunk of target positions at a time.

The unfused loss takes the model's full logits, batch x sequence x vocabulary, and upcasts them to float32: for
Qwen2.5's 151,936-token vocabulary at micro-batch 2 x 2,048 tokens that is 2.5 GB in one tensor, and its gradient
as much again. Here the model stops short of its output layer (`logits_to_keep` selects no position) and hands back
its last hidden states; the output layer is applied to at most `train.loss_chunk_tokens` target positions at a time,
in float32 only for that chunk, inside a non-reentrant `torch.utils.checkpoint`, so the backward pass recomputes a
chunk's logits instead of keeping them. Positions whose label is IGNORE_INDEX (prompts, padding) get no logits at
all: their loss is zero either way.

The output layer is called as a module, never read through its `.weight`, so PEFT's LoRA on it works as in the
model's own forward. Under ZeRO-3 (the layer's weight partitioned) the loss stays on full logits for now: see
`LossHead.of`. The hidden states come out of the model's output, not from a hook: DeepSpeed starts its backward
bookkeeping from hooks on the tensors its engine's forward returns.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from storage.shards import IGNORE_INDEX
from trainer.loss import cross_entropy, shift

log = logging.getLogger(__name__)

# Model types whose logits are exactly output_layer(last hidden state): no softcapping or scaling after the layer
# (Gemma-2's softcapping, Cohere's logit_scale), so the chunks reproduce the model's own logits. Others stay unfused.
PLAIN_HEAD_MODEL_TYPES = frozenset({"qwen2", "qwen3", "qwen2_moe", "qwen3_moe", "llama", "mistral", "gemma"})


@dataclass(frozen=True)
class LossHead:
    """How a model's summed loss is taken: from chunks of its last hidden states through `head`, or (head None)
    from its full logits."""

    head: torch.nn.Module | None
    chunk_tokens: int

    @classmethod
    def of(cls, model: Any, chunk_tokens: int) -> LossHead:
        """The fused loss for `model` (a DeepSpeed engine, a PEFT model or a plain causal LM) when `chunk_tokens` > 0
        and its model type's logits are the output layer's alone; otherwise the unfused one."""
        if chunk_tokens <= 0:
            log.info("loss: from full logits (train.loss_chunk_tokens=0)")
            return cls(None, 0)
        inner = getattr(model, "module", model)  # a DeepSpeed engine's own .config is DeepSpeed's, not the model's
        model_type = getattr(inner.config, "model_type", "")
        if model_type not in PLAIN_HEAD_MODEL_TYPES:
            log.info("loss: from full logits (train.loss_chunk_tokens: %r models are not in %s)", model_type,
                     sorted(PLAIN_HEAD_MODEL_TYPES))
            return cls(None, 0)
        head = inner.get_output_embeddings()
        if any(hasattr(p, "ds_id") for p in head.parameters()):
            # Not yet under ZeRO-3, for two reasons seen on the CPU runs: every call of the partitioned layer is a
            # collective (an all-gather), and the number of chunks follows each rank's own target count, so ranks
            # that differ call it a different number of times and the job hangs or aborts; and ZeRO-3 releases the
            # gathered weight after each call, so a non-reentrant checkpoint's recomputation reads an empty weight
            # (CheckpointError). A reentrant checkpoint with the chunk count agreed across ranks (padding with
            # empty chunks, as evaluation's lockstep does) is the way in; until then, full logits.
            log.info("loss: from full logits (train.loss_chunk_tokens: not yet under ZeRO-3)")
            return cls(None, 0)
        log.info("loss: chunks of %d target tokens (train.loss_chunk_tokens)", chunk_tokens)
        return cls(head, chunk_tokens)

    def forward_kwargs(self, device: torch.device) -> dict[str, Any]:
        """Extra arguments of the model's forward: for the fused loss, no logits and the last hidden states."""
        if self.head is None:
            return {}
        # Selecting only the last hidden state (the final norm's output) keeps evaluation from holding every layer's;
        # a transformers version without selection takes it as True, and the last one is the same tensor.
        return {"logits_to_keep": torch.empty(0, dtype=torch.long, device=device), "output_hidden_states": [-1]}

    def summed(self, out: Any, labels: torch.Tensor) -> torch.Tensor:
        """Cross-entropy summed over the predicted positions (labels shifted by one), differentiable."""
        if self.head is None:
            return cross_entropy(*shift(out.logits, labels), reduction="sum")
        hidden, targets = target_positions(out.hidden_states[-1], labels)
        total = None
        # One (empty) chunk when nothing is a target, so the loss still reaches the output layer and the model's
        # output: DeepSpeed's backward needs both.
        for start in range(0, max(len(targets), 1), self.chunk_tokens):
            end = start + self.chunk_tokens
            part = checkpoint(chunk_loss, self.head, hidden[start:end], targets[start:end], use_reentrant=False)
            total = part if total is None else total + part
        return total

    @torch.no_grad()
    def eval_sums(self, out: Any, labels: torch.Tensor) -> tuple[float, int, int]:
        """(summed loss, predicted target tokens, correct argmax predictions) of one batch; per-token losses are
        summed in float64, so the total hardly depends on how examples were batched."""
        if self.head is None:
            logits, predicted = shift(out.logits, labels)
            mask = predicted != IGNORE_INDEX
            loss = cross_entropy(logits, predicted, reduction="none").double().sum()
            return loss.item(), int(mask.sum()), int(((logits.argmax(-1) == predicted) & mask).sum())
        hidden, targets = target_positions(out.hidden_states[-1], labels)
        loss = torch.zeros((), dtype=torch.float64, device=hidden.device)
        correct = torch.zeros((), dtype=torch.long, device=hidden.device)
        for start in range(0, len(targets), self.chunk_tokens):
            logits = self.head(hidden[start : start + self.chunk_tokens]).float()
            chunk_targets = targets[start : start + self.chunk_tokens]
            loss += F.cross_entropy(logits, chunk_targets, reduction="none").double().sum()
            correct += (logits.argmax(-1) == chunk_targets).sum()
        return loss.item(), len(targets), int(correct)


def target_positions(hidden: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(hidden states of the positions that predict a target, those targets): position i predicts label i + 1."""
    predicted = labels[:, 1:].to(hidden.device)
    mask = predicted != IGNORE_INDEX
    return hidden[:, :-1][mask], predicted[mask]


def chunk_loss(head: torch.nn.Module, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Summed cross-entropy of one chunk: its logits exist, in float32, only while this runs."""
    return F.cross_entropy(head(hidden).float(), targets, reduction="sum")
