"""The loss of trainer/loss/cross_entropy.py computed from the last hidden states: in one pass, or a chunk of target
positions at a time when the logits would be large.

The unfused loss takes the model's full logits, batch x sequence x vocabulary, and upcasts them to float32: for
Qwen2.5's 151,936-token vocabulary at micro-batch 2 x 2,048 tokens that is 2.5 GB in one tensor, and its gradient
as much again. Here the model stops short of its output layer (`logits_to_keep` selects no position) and hands back
its last hidden states; positions whose label is IGNORE_INDEX (prompts, padding) get no logits at all (their loss is
zero either way), and the output layer is applied to the target positions only. The same path gives each row's
summed log-probability of its targets (`sequence_logps`: what the preference objectives compare), the chunks' losses
added per row instead of over the micro-batch.

Chunking is chosen by the size of the logits, per micro-batch: when its target positions' logits in float32 (target
tokens x vocabulary x 4 bytes) fit in ONE_PASS_MAX_BYTES (256 MiB), the output layer runs once over all of them and
the logits are kept for the backward pass, as the model's own loss keeps its own; beyond that, it runs on at most
`train.loss_chunk_tokens` target positions at a time, in float32 only for that chunk, and the backward pass
recomputes a chunk's logits instead of keeping them. So small vocabularies (the built-in 2,048-token models: 32,768
target tokens fit) pay no recomputation, and Qwen2.5's (441 target tokens fit) never hold a micro-batch's logits.

The output layer is called as a module, never read through its `.weight`, so PEFT's LoRA on it works as in the
model's own forward, and under ZeRO-3 DeepSpeed's module hooks gather its partitioned weight for each call. Where
the weight stays whole (no DeepSpeed, ZeRO-2) each chunk is a non-reentrant `torch.utils.checkpoint`. Under ZeRO-3
(`LossHead.partitioned`) three things differ:

- every call of the layer is a collective (an all-gather of its weight), in the forward pass and again in the
  backward pass's recomputation, so every rank must call it equally often: one pass or chunks, and how many, follow
  the largest target count of any rank (an all-reduce MAX, paid under ZeRO-3 only), and a rank with fewer targets
  runs empty chunks (loss 0); one pass is one chunk there, recomputed like the others;
- ZeRO-3 releases the gathered weight after each call, so a non-reentrant checkpoint's recomputation reads an
  empty weight (CheckpointError): the recomputation has to run the layer's forward again, through the hooks that
  gather it, as a reentrant checkpoint does;
- ZeRO-3 hands a parameter's gradient to its reduction each time one arrives, and refuses the same parameter twice
  in one bucket, which a reentrant checkpoint per chunk gives it: one autograd function (`PartitionedChunks`)
  recomputes every chunk in its backward, and lets each parameter's gradient through once, summed over the chunks.

The hidden states come out of the model's output, not from a hook: DeepSpeed starts its backward bookkeeping from
hooks on the tensors its engine's forward returns.
"""

from __future__ import annotations

import functools
import logging
import operator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as tdist
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from storage.shards import IGNORE_INDEX
from trainer.loss.cross_entropy import cross_entropy, shift
from trainer.loss.logps import sequence_logps

log = logging.getLogger(__name__)

# Model types whose logits are exactly output_layer(last hidden state): no softcapping or scaling after the layer
# (Gemma-2's softcapping, Cohere's logit_scale), so the chunks reproduce the model's own logits. Others stay unfused.
PLAIN_HEAD_MODEL_TYPES = frozenset(
    {"qwen2", "qwen3", "qwen2_moe", "qwen3_moe", "llama", "mistral", "gemma", "qwen2_5_vl", "qwen3_vl"}
)
# A micro-batch whose target positions' float32 logits fit in this many bytes takes them in one pass, kept for the
# backward pass; a larger one is chunked and recomputed. Below it recomputation costs time and saves little memory:
# the largest one-pass logits are under half of one 1,024-token chunk's at Qwen2.5's vocabulary (594 MiB).
ONE_PASS_MAX_BYTES = 256 * 2**20
LOGIT_BYTES = 4  # the loss takes the logits in float32


@dataclass(frozen=True)
class LossHead:
    """How a model's summed loss is taken: from its last hidden states through `head` (in one pass when a
    micro-batch's target logits fit in `one_pass_max_bytes`, else in chunks of `chunk_tokens`), or (head None) from
    its full logits. `partitioned`: the head's weight is partitioned by ZeRO-3 (see the module's docstring)."""

    head: torch.nn.Module | None
    chunk_tokens: int
    partitioned: bool = False
    vocab_size: int = 0
    one_pass_max_bytes: int = ONE_PASS_MAX_BYTES

    @classmethod
    def of(cls, model: Any, chunk_tokens: int, *, one_pass_max_bytes: int = ONE_PASS_MAX_BYTES) -> LossHead:
        """The loss from the last hidden states for `model` (a DeepSpeed engine, a PEFT model or a plain causal LM)
        when `chunk_tokens` > 0 and its model type's logits are the output layer's alone; otherwise the unfused one.
        `one_pass_max_bytes` 0 chunks every micro-batch that has a target (tests of the chunked path)."""
        if chunk_tokens <= 0:
            log.info("loss: from full logits (train.loss_chunk_tokens=0)")
            return cls(None, 0)
        inner = getattr(model, "module", model)  # a DeepSpeed engine's own .config is DeepSpeed's, not the model's
        model_type = getattr(getattr(inner, "config", None), "model_type", "")
        if model_type not in PLAIN_HEAD_MODEL_TYPES:
            log.info(
                "loss: from full logits (train.loss_chunk_tokens: %r models are not in %s)",
                model_type,
                sorted(PLAIN_HEAD_MODEL_TYPES),
            )
            return cls(None, 0)
        head = inner.get_output_embeddings()
        # ZeRO-3 empties a partitioned weight, not the layer's own record of its width (PEFT's LoRA layer keeps one).
        vocab = int(getattr(head, "out_features", 0) or inner.config.vocab_size)
        # DeepSpeed marks the parameters ZeRO-3 partitions with a ds_id; ZeRO-2 leaves the weights whole.
        partitioned = any(hasattr(p, "ds_id") for p in head.parameters())
        one_pass = one_pass_max_bytes // (vocab * LOGIT_BYTES)
        log.info(
            "loss: from the last hidden states, in one pass up to %d target tokens a micro-batch (%d MiB of "
            "float32 logits at a vocabulary of %d), beyond that in chunks of %d target tokens "
            "(train.loss_chunk_tokens)%s",
            one_pass,
            one_pass_max_bytes // 2**20,
            vocab,
            chunk_tokens,
            ", the choice and the chunk count agreed across ranks (ZeRO-3)" if partitioned else "",
        )
        return cls(head, chunk_tokens, partitioned, vocab, one_pass_max_bytes)

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
        return self.through_head(hidden, targets, Rows.none())

    def sequence_logps(self, out: Any, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(each row's summed log-probability of its targets, differentiable, and its target count): what the
        preference objectives compare (trainer/loss/logps.py from full logits), here through the same head and
        chunks as the loss, so no micro-batch's full-vocabulary logits exist."""
        if self.head is None:
            return sequence_logps(out.logits, labels)
        hidden, targets = target_positions(out.hidden_states[-1], labels)
        rows = Rows.of(labels, hidden.device)
        assert rows.counts is not None, "Rows.of counts each row's targets"
        return -self.through_head(hidden, targets, rows), rows.counts

    def through_head(self, hidden: torch.Tensor, targets: torch.Tensor, rows: Rows) -> torch.Tensor:
        """The summed cross-entropy of `targets` from their `hidden` states (per row with `rows.index`): in one pass
        or in chunks, and under ZeRO-3 through `PartitionedChunks`."""
        assert self.head is not None, "the fused loss needs the output layer"
        # At least one (empty) chunk when nothing is a target, so the loss still reaches the output layer and the
        # model's output: DeepSpeed's backward needs both. Chunks past this rank's targets are empty (loss 0).
        size, starts = self.chunks(len(targets), hidden.device, at_least_one=True)
        if self.partitioned:
            if not hidden.requires_grad:
                # The function's backward runs only if an input asks for a gradient: when nothing before the
                # output layer trains (LoRA on it alone), a stand-in does; the gradient it gets goes nowhere.
                hidden = hidden.detach().requires_grad_()
            return PartitionedChunks.apply(hidden, targets, self.head, starts, size, rows)
        if self.fits(len(targets)):
            # Logits this small are kept for the backward pass, as the model's own loss keeps its own: recomputing
            # them would cost a pass of the output layer and save little memory.
            return chunk_loss(self.head, hidden, targets, rows)
        # Non-reentrant: it saves nothing the chunk's inputs do not hold already. Summed in chunk order.
        parts = [
            checkpoint(
                chunk_loss,
                self.head,
                hidden[start : start + size],
                targets[start : start + size],
                rows.part(start, size),
                use_reentrant=False,
            )
            for start in starts
        ]
        return functools.reduce(operator.add, parts)

    def fits(self, count: int) -> bool:
        """Whether the float32 logits of `count` target positions are small enough for one pass."""
        return count * self.vocab_size * LOGIT_BYTES <= self.one_pass_max_bytes

    def chunks(self, count: int, device: torch.device, *, at_least_one: bool = False) -> tuple[int, range]:
        """(target positions per chunk, where the chunks start) for `count` target positions: one chunk of them all
        when their logits fit, else chunks of `chunk_tokens`; under ZeRO-3 both follow the rank with the most."""
        if self.partitioned:
            count = agreed_max(count, device)
        size = max(count, 1) if self.fits(count) else self.chunk_tokens
        chunks = max(-(-count // size), 1 if at_least_one else 0)
        return size, range(0, chunks * size, size)

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
        # Under ZeRO-3 every rank calls this as often (sft.local_sums' lockstep) and here runs as many chunks.
        size, starts = self.chunks(len(targets), hidden.device)
        for start in starts:
            logits = self.head(hidden[start : start + size]).float()
            chunk_targets = targets[start : start + size]
            loss += F.cross_entropy(logits, chunk_targets, reduction="none").double().sum()
            correct += (logits.argmax(-1) == chunk_targets).sum()
        return loss.item(), len(targets), int(correct)


class PartitionedChunks(torch.autograd.Function):
    """The summed loss of every chunk through a ZeRO-3-partitioned output layer: one checkpoint over all the chunks
    (see the module's docstring). Its backward runs the chunks again one after the other, through the layer's
    forward (DeepSpeed's hooks gather the weight for each), the gradients of the layer's parameters adding up in
    their .grad; the parameters are flagged ready (`ds_grad_is_ready`, as DeepSpeed's own tiled loss does) for the
    last chunk only, so each reaches ZeRO-3's reduce bucket once, whole."""

    @staticmethod
    def forward(
        ctx: Any,
        hidden: torch.Tensor,
        targets: torch.Tensor,
        head: torch.nn.Module,
        starts: range,
        size: int,
        rows: Rows,
    ) -> torch.Tensor:
        ctx.head, ctx.starts, ctx.size, ctx.rows = head, starts, size, rows
        ctx.save_for_backward(hidden, targets)
        total = torch.zeros((rows.count,) if rows.index is not None else (), dtype=torch.float32, device=hidden.device)
        for start in starts:  # autograd is off here: each chunk's logits go as soon as its loss is taken
            total += chunk_loss(
                head, hidden[start : start + size], targets[start : start + size], rows.part(start, size)
            )
        return total

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None, None, None]:
        hidden, targets = ctx.saved_tensors
        hidden = hidden.detach().requires_grad_()
        params = [p for p in ctx.head.parameters() if p.requires_grad]
        last = len(ctx.starts) - 1
        try:
            for index, start in enumerate(ctx.starts):
                for param in params:
                    param.ds_grad_is_ready = index == last
                end = start + ctx.size
                with torch.enable_grad():
                    part = chunk_loss(ctx.head, hidden[start:end], targets[start:end], ctx.rows.part(start, ctx.size))
                torch.autograd.backward(part, grad)
        finally:
            for param in params:
                param.ds_grad_is_ready = True
        return hidden.grad, None, None, None, None, None


def target_positions(hidden: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(hidden states of the positions that predict a target, those targets): position i predicts label i + 1 (labels
    one wider than the positions: every position has its target, as cross_entropy.shift)."""
    predicted = labels[:, 1:].to(hidden.device)
    mask = predicted != IGNORE_INDEX
    return hidden[:, : predicted.size(1)][mask], predicted[mask]


def agreed_max(count: int, device: torch.device) -> int:
    """The largest of every rank's `count` of target positions (each rank calls a ZeRO-3 layer, a collective, as
    often as it decides); this rank's own outside a process group."""
    if not (tdist.is_available() and tdist.is_initialized()) or tdist.get_world_size() == 1:
        return count
    largest = torch.tensor([count], dtype=torch.long, device=device)
    tdist.all_reduce(largest, op=tdist.ReduceOp.MAX)
    return int(largest.item())


@dataclass(frozen=True)
class Rows:
    """Which row of the micro-batch each target position belongs to (`index`, in target order), the number of rows
    (`count`) and each row's targets (`counts`): for sums per row; `index` None sums over the whole micro-batch."""

    index: torch.Tensor | None
    count: int = 0
    counts: torch.Tensor | None = None

    @classmethod
    def none(cls) -> Rows:
        """One sum over every target."""
        return cls(None)

    @classmethod
    def of(cls, labels: torch.Tensor, device: torch.device) -> Rows:
        """The rows of `labels`' targets (labels shifted by one, in `target_positions`' order)."""
        mask = labels[:, 1:].to(device) != IGNORE_INDEX
        index = torch.arange(labels.shape[0], device=device).unsqueeze(1).expand_as(mask)[mask]
        return cls(index, labels.shape[0], mask.sum(dim=1))

    def part(self, start: int, size: int) -> Rows:
        """The rows of the targets start .. start + size."""
        return self if self.index is None else Rows(self.index[start : start + size], self.count)


def chunk_loss(head: torch.nn.Module, hidden: torch.Tensor, targets: torch.Tensor, rows: Rows) -> torch.Tensor:
    """Summed cross-entropy of one chunk (a sum per row with `rows.index`): its logits exist, in float32, only while
    this runs."""
    if rows.index is None:
        return F.cross_entropy(head(hidden).float(), targets, reduction="sum")
    per_target = F.cross_entropy(head(hidden).float(), targets, reduction="none")
    return per_target.new_zeros(rows.count).index_add(0, rows.index, per_target)
