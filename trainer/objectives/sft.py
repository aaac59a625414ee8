"""Supervised fine-tuning (train.objective=sft): the cross-entropy of the answers' tokens, token-weighted across ranks
and accumulation, and its evaluation: loss, perplexity and token accuracy.

A micro-batch's loss is its summed cross-entropy over the predicted positions (labels after the shift, not -100),
taken through the loss head (trainer/loss/chunked.py: from the last hidden states, in one pass or in chunks, or from
full logits), and scaled by the step's accumulation over its global target-token count: every target token weighs the
same whatever the micro-batch, accumulation and world size. The evaluation sums loss, predicted target tokens and
correct argmax predictions per rank; the sums are all-reduced and divided once, so the result equals a single-process
evaluation of the same rows.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from config.objectives import Objective
from config.sections.model_train import TrainConfig
from core.errors import UserError
from storage.shards import Row
from storage.spec import Spec
from storage.split_reader import Split
from trainer.data import Batch, GlobalOrder, collate, collate_flat, rank_micro_batches
from trainer.loss.chunked import LossHead
from trainer.loss.liger import LigerLossHead
from trainer.model import attention
from trainer.model.kernels import Kernels, resolve
from trainer.objectives.base import MicroLoss, StepResult, Sums
from trainer.parallel.distributed import Dist, dist_sum
from trainer.parallel.moe import RouterBalance
from trainer.parallel.sequence_parallel import shard


def summed_loss(model: Any, batch: Batch, device: torch.device, loss: LossHead) -> torch.Tensor:
    """Cross-entropy summed over the predicted positions of a micro-batch (labels shifted by one)."""
    out = model(**batch.model_inputs(device), **loss.forward_kwargs(device))
    return loss.summed(out, batch.labels)


@torch.no_grad()
def local_sums(
    model: Any,
    examples: Sequence[Row],
    indices: Sequence[int],
    *,
    rank: int,
    world: int,
    batch_size: int,
    pad_id: int,
    device: torch.device,
    loss_chunk_tokens: int,
    lockstep: bool = False,
    part: Callable[[Batch], Batch] = lambda batch: batch,
    flat: bool = False,
) -> tuple[float, int, int, int]:
    """(summed loss, target tokens, correct tokens, examples) over this rank's share of the rows `indices` of
    `examples` (the split's rows; a packed row counts each of its examples).

    With `lockstep` (a ZeRO-3 engine, whose forward is collective) every rank runs the same number of
    forward passes (and of the chunked loss's output-layer calls, which LossHead.eval_sums agrees across ranks):
    ranks with fewer rows run throw-away passes so nobody waits forever. `part`: what of a batch this rank computes
    (a sequence-parallel rank's part of its rows: trainer/parallel/sequence_parallel.py `shard`). `flat`: each pass's
    rows as
    one padding-free row (variable-length attention, trainer/model/attention.py).
    """
    mine = indices[rank::world]
    batches = [mine[start : start + batch_size] for start in range(0, len(mine), batch_size)]
    passes = math.ceil(math.ceil(len(indices) / world) / batch_size) if lockstep else len(batches)
    loss_sum, targets, correct, count = 0.0, 0, 0, 0
    loss = LossHead.of(model, loss_chunk_tokens)
    layout = collate_flat if flat else collate
    for index in range(passes):
        rows = [examples[i] for i in (batches[index] if index < len(batches) else indices[:1])]
        batch = part(layout(rows, pad_id))
        out = model(**batch.model_inputs(device), **loss.forward_kwargs(device))
        # A throw-away pass takes its sums too, and drops them: under ZeRO-3 the chunked loss's output layer is a
        # collective as well, called as often on every rank.
        sums = loss.eval_sums(out, batch.labels)
        if index < len(batches):
            loss_sum, targets, correct = loss_sum + sums[0], targets + sums[1], correct + sums[2]
            count += sum(len(row.segments) for row in rows)
    return loss_sum, targets, correct, count


def reduced_metrics(sums: tuple[float, int, int, int], dist: Dist) -> dict[str, Any]:
    """SUM-reduce the per-rank sums and divide once."""
    loss_sum, targets, correct, count = dist_sum(sums, dist)
    if targets == 0:
        raise UserError(
            f"the eval split has no target tokens ({int(count)} examples); set data.eval_ratio > 0 "
            "or give data with assistant answers"
        )
    loss = loss_sum / targets
    return {
        "loss": loss,
        "perplexity": math.exp(loss),
        "token_accuracy": correct / targets,
        "loss_sum": loss_sum,
        "target_tokens": int(targets),
        "correct_tokens": int(correct),
        "examples": int(count),
    }


@dataclass(frozen=True)
class SftScope:
    """An optimizer step's global target tokens, and the scale of a micro-batch's summed loss for backward: DeepSpeed
    divides by the accumulation steps and averages over ranks (`accumulation` = both), undone here."""

    targets: float
    scale: float
    device: torch.device


@dataclass
class Sft:
    """Supervised fine-tuning: train.objective=sft, with its loss head (`head`, built by `start` for the engine)."""

    objective: Objective
    chunk_tokens: int  # train.loss_chunk_tokens
    aux_loss_coef: float | None = None  # train.moe.aux_loss_coef
    kernels: str = "none"  # train.kernels, resolved for the device in start
    attention: str = "sdpa"  # train.attention, resolved for the device in start
    flat: bool = False  # micro-batches as one padding-free row each (variable-length attention)
    head: LossHead | None = None
    router: RouterBalance | None = None  # a mixture of experts' load balance (trainer/parallel/moe.py)
    sum_keys: tuple[str, ...] = ("loss_sum",)

    @classmethod
    def of(cls, train: TrainConfig) -> Sft:
        """SFT with train's loss settings."""
        return cls(train.objective, train.loss_chunk_tokens, train.moe.aux_loss_coef, train.kernels, train.attention)

    def start(self, engine: Any, spec: Spec, dist: Dist, pad_id: int) -> None:
        """The loss head of the engine's model (Liger's fused loss with train.kernels' Liger, trainer/loss/liger.py);
        a mixture of experts' router balance; the layout of micro-batches the attention takes."""
        self.head = LossHead.of(engine, self.chunk_tokens)
        self.flat = attention.resolve(self.attention, dist.device, dist.sequence_parallel).varlen
        if resolve(self.kernels, dist.device) is Kernels.LIGER:
            self.head = LigerLossHead.of_head(self.head)
        model_config = getattr(engine, "module", engine).config  # an engine's own .config is DeepSpeed's
        self.router = RouterBalance.of(model_config, self.aux_loss_coef, dist)
        if self.router is not None:
            self.sum_keys = ("loss_sum", "aux_loss_sum", "micro_batches")

    def start_evaluation(self, spec: Spec, rows: Split) -> None:
        """Nothing to prepare: evaluate builds the head of the model it is given."""

    def deal(self, rows: Split, order: GlobalOrder, **dealing: Any) -> Iterator[Batch]:
        """This rank's micro-batches of supervised rows (trainer/data.py), flattened for variable-length attention."""
        return rank_micro_batches(rows, order, flat=self.flat, **dealing)

    def begin_step(self, model: Any, batches: Sequence[Batch], dist: Dist) -> SftScope:
        """The global batch's target tokens."""
        (targets,) = dist_sum([sum(b.target_tokens for b in batches)], dist)
        # DeepSpeed averages gradients over the ranks that read different rows (with sequence parallelism it sums
        # a sequence group's parts first), except ZeRO-3's reduce-scatter, over every rank: dist.gradient_ranks.
        return SftScope(targets, dist.gradient_ranks * len(batches) / max(targets, 1.0), dist.device)

    def micro_batch(self, model: Any, batch: Batch, scope: SftScope) -> MicroLoss:
        """The micro-batch's summed cross-entropy, scaled by the step's target tokens."""
        assert self.head is not None, "Sft.start builds the loss head before the first step"
        if self.router is None:
            loss = summed_loss(model, batch, scope.device, self.head)
            return MicroLoss(loss * scope.scale, {"loss_sum": loss.detach()})
        out = model(
            **batch.model_inputs(scope.device), **self.head.forward_kwargs(scope.device), **self.router.forward_kwargs
        )
        loss = self.head.summed(out, batch.labels)
        aux = self.router.observe(out, batch.attention_mask)
        # DeepSpeed's average over accumulation and ranks makes the weighted auxiliary loss the step's mean of it.
        backward = loss * scope.scale + self.router.coef * aux
        return MicroLoss(backward, {"loss_sum": loss.detach(), "aux_loss_sum": aux.detach(), "micro_batches": 1.0})

    def end_step(self, sums: Sums, scope: SftScope) -> StepResult:
        """The global batch's loss per target token (the language model's alone); for a mixture of experts, the
        load-balancing loss (mean over micro-batches) and the experts' load, apart."""
        loss = sums["loss_sum"] / max(scope.targets, 1.0)
        if self.router is None:
            return StepResult(loss, int(scope.targets), {})
        moe = {"aux_loss": sums["aux_loss_sum"] / max(sums["micro_batches"], 1.0), **self.router.end_step()}
        return StepResult(loss, int(scope.targets), moe)

    def evaluate(
        self,
        model: Any,
        rows: Split,
        indices: Sequence[int],
        dist: Dist,
        *,
        batch_size: int,
        pad_id: int,
        lockstep: bool,
    ) -> dict[str, Any]:
        """Loss, perplexity and token accuracy over the rows `indices`."""
        loss_sum, targets, correct, count = local_sums(
            model,
            rows,
            indices,
            rank=dist.data_rank,  # a sequence group evaluates the same rows, each rank its part of them
            world=dist.data_world,
            batch_size=batch_size if dist.sequence_parallel == 1 else 1,  # DeepSpeed's Ulysses: one row a pass
            pad_id=pad_id,
            device=dist.device,
            loss_chunk_tokens=self.chunk_tokens,
            lockstep=lockstep,
            part=functools.partial(shard, dist=dist),
            flat=self.flat,
        )
        # Losses, targets and correct predictions are of each rank's part; a group's examples are counted once.
        first_part = dist.layout.sequence_rank(dist.rank) == 0
        return reduced_metrics((loss_sum, targets, correct, count if first_part else 0), dist)

    def eval_fields(self) -> dict[str, Any]:
        """Nothing beside the metrics."""
        return {}

    def summary(self, result: dict[str, Any]) -> str:
        """The evaluation's log line."""
        return (
            f"eval loss {result['loss']:.4f} perplexity {result['perplexity']:.2f} token accuracy "
            f"{result['token_accuracy']:.4f} over {result['target_tokens']} target tokens"
        )
