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

import dataclasses
import functools
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from config.objectives import Objective
from config.sections.model_train import TrainConfig
from core.errors import UserError
from storage.shards import Row
from storage.spec import Spec
from storage.split_reader import Split
from trainer.data import Batch, Dealing, GlobalOrder, batch_of, collate, collate_flat, image_source, rank_micro_batches
from trainer.loss.chunked import LossHead
from trainer.loss.liger import LigerLossHead
from trainer.objectives.base import EvalOptions, Metrics, MicroLoss, StepResult
from trainer.objectives.policy import Policy
from trainer.objectives.sums import Sums
from trainer.parallel.distributed import Dist, dist_sum
from trainer.parallel.sequence_parallel import shard

if TYPE_CHECKING:
    from trainer.build import Built


def summed_loss(policy: Policy, batch: Batch, loss: LossHead) -> torch.Tensor:
    """Cross-entropy summed over the predicted positions of a micro-batch (labels shifted by one)."""
    out = policy.forward(batch, loss.forward_kwargs(policy.device))
    return loss.summed(out, batch.labels)


@dataclass(frozen=True)
class EvalRows:
    """What of the rows `indices` this rank evaluates: its share (`rank` of `world`), `part` of each batch (a
    sequence-parallel rank's part of its rows: trainer/parallel/sequence_parallel.py `shard`), and `flat`: each pass's
    rows as one padding-free row (variable-length attention, trainer/model/attention.py)."""

    indices: Sequence[int]
    rank: int
    world: int
    part: Callable[[Batch], Batch] = lambda batch: batch
    flat: bool = False


@torch.no_grad()
def local_sums(
    model: torch.nn.Module,
    examples: Sequence[Row],
    rows: EvalRows,
    options: EvalOptions,
    device: torch.device,
    loss_chunk_tokens: int,
) -> tuple[float, int, int, int]:
    """(summed loss, target tokens, correct tokens, examples) over this rank's share of the rows `rows.indices` of
    `examples` (the split's rows; a packed row counts each of its examples).

    With `options.lockstep` (a ZeRO-3 engine, whose forward is collective) every rank runs the same number of
    forward passes (and of the chunked loss's output-layer calls, which LossHead.eval_sums agrees across ranks):
    ranks with fewer rows run throw-away passes so nobody waits forever.
    """
    mine = rows.indices[rows.rank :: rows.world]
    size = options.batch_size
    batches = [mine[start : start + size] for start in range(0, len(mine), size)]
    passes = math.ceil(math.ceil(len(rows.indices) / rows.world) / size) if options.lockstep else len(batches)
    loss_sum, targets, correct, count = 0.0, 0, 0, 0
    loss = LossHead.of(model, loss_chunk_tokens)
    layout = collate_flat if rows.flat else collate
    policy = Policy(model, device)
    for index in range(passes):
        group = [examples[i] for i in (batches[index] if index < len(batches) else rows.indices[:1])]
        batch = rows.part(batch_of(group, options.pad_id, layout, options.images, image_source(examples)))
        out = policy.forward(batch, loss.forward_kwargs(device))
        # A throw-away pass takes its sums too, and drops them: under ZeRO-3 the chunked loss's output layer is a
        # collective as well, called as often on every rank.
        sums = loss.eval_sums(out, batch.labels)
        if index < len(batches):
            loss_sum, targets, correct = loss_sum + sums[0], targets + sums[1], correct + sums[2]
            count += sum(len(row.segments) for row in group)
    return loss_sum, targets, correct, count


def reduced_metrics(sums: tuple[float, int, int, int], dist: Dist) -> Metrics:
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


@dataclass(frozen=True)
class SftSums(Sums):
    """A step's summed cross-entropy over its target tokens."""

    loss_sum: float | torch.Tensor = 0.0


@dataclass
class Sft:
    """Supervised fine-tuning: train.objective=sft, with its loss head (`head`, built by `start` for the engine)."""

    objective: Objective
    chunk_tokens: int  # train.loss_chunk_tokens
    flat: bool = False  # micro-batches as one padding-free row each (variable-length attention)
    head: LossHead | None = None
    sums_type: type[SftSums] = SftSums

    @classmethod
    def of(cls, train: TrainConfig) -> Sft:
        """SFT with train's loss settings."""
        return cls(train.objective, train.loss_chunk_tokens)

    def start(self, built: Built, spec: Spec, dist: Dist) -> None:
        """The loss head of the engine's model (Liger's fused loss where the run's kernels are Liger's,
        trainer/loss/liger.py), and the layout of micro-batches the run's attention takes: both as the build resolved
        them."""
        self.head = LossHead.of(built.engine, self.chunk_tokens)
        self.flat = built.choices.flat
        if built.choices.liger:
            self.head = LigerLossHead.of_head(self.head)

    def start_evaluation(self, spec: Spec, rows: Split) -> None:
        """Nothing to prepare: evaluate builds the head of the model it is given."""

    def deal(self, rows: Split, order: GlobalOrder, dealing: Dealing) -> Iterator[Batch]:
        """This rank's micro-batches of supervised rows (trainer/data.py), flattened for variable-length attention."""
        return rank_micro_batches(rows, order, dealing, flat=self.flat)

    def begin_step(self, policy: Policy, batches: Sequence[Batch], dist: Dist) -> SftScope:
        """The global batch's target tokens."""
        (targets,) = dist_sum([sum(b.target_tokens for b in batches)], dist)
        # DeepSpeed averages gradients over the ranks that read different rows (with sequence parallelism it sums
        # a sequence group's parts first), except ZeRO-3's reduce-scatter, over every rank: dist.gradient_ranks.
        return SftScope(targets, dist.gradient_ranks * len(batches) / max(targets, 1.0))

    def micro_batch(self, policy: Policy, batch: Batch, scope: SftScope) -> MicroLoss[SftSums]:
        """The micro-batch's summed cross-entropy, scaled by the step's target tokens."""
        assert self.head is not None, "Sft.start builds the loss head before the first step"
        loss = summed_loss(policy, batch, self.head)
        return MicroLoss(loss * scope.scale, SftSums(loss.detach()))

    def end_step(self, sums: SftSums, scope: SftScope) -> StepResult:
        """The global batch's loss per target token (the language model's alone: a mixture of experts' load-balancing
        loss is the step's, trainer/step.py)."""
        return StepResult(float(sums.loss_sum) / max(scope.targets, 1.0), int(scope.targets), {})

    def evaluate(
        self, model: torch.nn.Module, rows: Split, indices: Sequence[int], dist: Dist, options: EvalOptions
    ) -> Metrics:
        """Loss, perplexity and token accuracy over the rows `indices`."""
        if dist.sequence_parallel > 1:  # DeepSpeed's Ulysses: one row a pass
            options = dataclasses.replace(options, batch_size=1)
        # A sequence group evaluates the same rows, each rank its part of them.
        share = EvalRows(indices, dist.data_rank, dist.data_world, functools.partial(shard, dist=dist), self.flat)
        loss_sum, targets, correct, count = local_sums(model, rows, share, options, dist.device, self.chunk_tokens)
        # Losses, targets and correct predictions are of each rank's part; a group's examples are counted once.
        first_part = dist.layout.sequence_rank(dist.rank) == 0
        return reduced_metrics((loss_sum, targets, correct, count if first_part else 0), dist)

    def eval_fields(self) -> Metrics:
        """Nothing beside the metrics."""
        return {}

    def summary(self, result: Metrics) -> str:
        """The evaluation's log line."""
        return (
            f"eval loss {result['loss']:.4f} perplexity {result['perplexity']:.2f} token accuracy "
            f"{result['token_accuracy']:.4f} over {result['target_tokens']} target tokens"
        )

    def state_dict(self) -> dict[str, Any] | None:
        """Nothing beside the engine."""
        return None

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        """Nothing to restore."""
