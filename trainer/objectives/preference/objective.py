"""What the preference objectives (DPO, IPO and ORPO on pairs: pairs.py; KTO on labelled answers: kto.py) share: their
micro-batches, the step's counts, the reference model, the step's result and the evaluation.

A pair, or a KTO answer, is a unit. A step's loss is the mean of its units' losses over the global batch (plus, for
ORPO, the chosen answers' cross-entropy per token of the global batch): each rank scales its micro-batches' summed
losses by the global counts, all-reduced before the first micro-batch, so the gradient is the same on any number of
ranks and micro-batches. KTO's reference point is computed then too, from every rank's mismatched sequences. A
micro-batch's reference log-probabilities come first, from the model with its adapters disabled or, under full
fine-tuning, from the table the base computed before training (reference.py); then the policy's, in one forward pass.
The evaluation takes the same units through the same losses, row i of the split on rank i % world, its sums
all-reduced and divided once, so it equals one process's.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Self

import torch

from config.methods import Method
from config.objectives import Objective
from config.sections.model_train import TrainConfig
from config.sections.preference import PreferenceConfig
from core.errors import UserError
from storage.shards import PAIR
from storage.spec import Spec
from storage.split_reader import Split
from trainer.data import Dealing, GlobalOrder
from trainer.loss.chunked import LossHead
from trainer.objectives.base import EvalOptions, Metrics, MicroLoss, StepResult
from trainer.objectives.policy import Policy
from trainer.objectives.preference.batching import PreferenceBatch, collate_preference, rank_preference_batches
from trainer.objectives.preference.reference import eval_tables, logps, reference_for, run_tables
from trainer.objectives.preference.reference_table import ReferenceTable
from trainer.objectives.preference.sums import PreferenceSums, metrics_of
from trainer.parallel.distributed import Dist, dist_sum

if TYPE_CHECKING:
    from trainer.build import Built


@dataclass(frozen=True)
class PreferenceScope:
    """A step's (or an evaluation's) global counts: its units and the chosen answers' target tokens, KTO's reference
    point, the accumulation DeepSpeed averages over (micro-batches x ranks, undone), and the split's reference table
    under full fine-tuning."""

    units: float
    chosen_tokens: float
    kl: float
    accumulation: int
    table: ReferenceTable | None = None


@dataclass(frozen=True)
class EvalPasses:
    """This rank's forward passes over the rows `indices` of an eval split: row i on rank i % world, in `groups` of
    the batch size; a KTO row's partner is the row after it in `indices` (`partner`). `passes` may exceed the groups
    (lockstep under ZeRO-3: every rank runs as many), the extra passes being throw-away ones over the first row."""

    rows: Split
    indices: Sequence[int]
    groups: list[list[int]]
    passes: int
    pad_id: int
    partner: dict[int, int]

    @classmethod
    def of(cls, rows: Split, indices: Sequence[int], dist: Dist, options: EvalOptions) -> Self:
        """This rank's passes."""
        if not len(indices):
            raise UserError(f"{rows.shards[0].path if rows.shards else 'the eval split'}: no eval rows to evaluate")
        size = options.batch_size
        mine = list(indices[dist.rank :: dist.world_size])
        groups = [mine[start : start + size] for start in range(0, len(mine), size)]
        passes = math.ceil(math.ceil(len(indices) / dist.world_size) / size) if options.lockstep else len(groups)
        partner = {index: indices[(k + 1) % len(indices)] for k, index in enumerate(indices)}
        return cls(rows, indices, groups, passes, options.pad_id, partner)

    def batch(self, k: int) -> PreferenceBatch:
        """The micro-batch of pass k."""
        group = self.groups[k] if k < len(self.groups) else [self.indices[0]]  # throw-away: keeps ZeRO-3 in step
        feedback = [self.rows.feedback(i) for i in group]
        partners = [] if PAIR in feedback else [self.rows[self.partner[i]] for i in group]
        return collate_preference([self.rows[i] for i in group], feedback, self.pad_id, partners, group)


@dataclass(frozen=True)
class UnitLosses:
    """A micro-batch's units as a preference objective computes them: each unit's loss, the summed chosen-token
    cross-entropy ORPO adds (0 for the others), and the metric sums."""

    losses: torch.Tensor
    nll: torch.Tensor
    sums: PreferenceSums


class PreferenceObjective(ABC):
    """A preference objective on a rank: its config object, its settings (train.preference), the method (full
    fine-tuning reads its reference from tables), and the tables by split. Subclasses compute each unit's loss
    (`losses`); KTO adds its reference point."""

    sums_type: type[PreferenceSums] = PreferenceSums

    def __init__(self, objective: Objective, settings: PreferenceConfig, method: Method, chunk_tokens: int = 0) -> None:
        self.objective, self.settings, self.method = objective, settings, method
        self.chunk_tokens = chunk_tokens  # train.loss_chunk_tokens: how log-probabilities are taken (LossHead)
        self.head: LossHead | None = None  # the model's, built by start (training) and evaluate
        self.tables: dict[str, ReferenceTable] = {}

    @classmethod
    def of(cls, train: TrainConfig) -> Self:
        """The objective of train, with its settings."""
        return cls(train.objective, train.preference, train.method, train.loss_chunk_tokens)

    @property
    def reads_tables(self) -> bool:
        """Whether its reference comes from tables: a reference model under full fine-tuning."""
        return self.objective.reference and not self.method.trains_adapters

    def loss_head(self, model: torch.nn.Module) -> LossHead:
        """How `model`'s log-probabilities are taken (from its last hidden states in chunks, or full logits): the
        head start or evaluate built, else `model`'s, built now."""
        if self.head is None:
            self.head = LossHead.of(model, self.chunk_tokens)
        return self.head

    @property
    def beta(self) -> float:
        """train.preference.beta: DPO's beta, IPO's tau, ORPO's lambda."""
        return self.settings.beta

    def start(self, built: Built, spec: Spec, dist: Dist) -> None:
        """Full fine-tuning's reference tables, read or computed by the base before any checkpoint is resumed; the
        loss head the log-probabilities are taken through."""
        self.head = LossHead.of(built.engine, self.chunk_tokens)
        if self.reads_tables:
            self.tables = run_tables(built.engine, spec, dist, built.pad_id)

    def start_evaluation(self, spec: Spec, rows: Split) -> None:
        """The eval split's reference table under full fine-tuning, as the train stage wrote it."""
        if self.reads_tables:
            self.tables = eval_tables(spec, rows, self.objective.name)

    def deal(self, rows: Split, order: GlobalOrder, dealing: Dealing) -> Iterator[PreferenceBatch]:
        """This rank's micro-batches of preference units, dealt as supervised rows are."""
        return rank_preference_batches(rows, order, dealing)

    def reference_point(self, policy: Policy, batches: Iterable[PreferenceBatch], counted: int, dist: Dist) -> float:
        """KTO's reference point (kto.py); none for the others."""
        return 0.0

    def begin_step(self, policy: Policy, batches: Sequence[PreferenceBatch], dist: Dist) -> PreferenceScope:
        """The global batch's units and chosen target tokens (and KTO's reference point)."""
        units, chosen = dist_sum([sum(b.units for b in batches), sum(b.chosen_tokens for b in batches)], dist)
        kl = self.reference_point(policy, batches, len(batches), dist)
        return PreferenceScope(units, chosen, kl, dist.world_size * len(batches), self.tables.get("train"))

    @abstractmethod
    def losses(
        self,
        policy: torch.Tensor,
        counts: torch.Tensor,
        reference: torch.Tensor | None,
        batch: PreferenceBatch,
        kl: float,
    ) -> UnitLosses:
        """Each unit's loss, the summed chosen-token cross-entropy ORPO adds and the metric sums, from the policy's
        log-probabilities of the batch's sequences and their target counts, and the reference's."""

    def nll_tokens(self, batch: PreferenceBatch) -> float:
        """The target tokens the cross-entropy of `losses` is divided by (ORPO: the chosen answers'); 0 without one."""
        return 0.0

    def unit_losses(self, policy: Policy, batch: PreferenceBatch, scope: PreferenceScope) -> UnitLosses:
        """A micro-batch's units: the reference first, then the policy in one forward pass."""
        head = self.loss_head(policy.module)
        reference = reference_for(policy, batch, scope.table, head) if self.objective.reference else None
        values, counts = logps(policy, batch.sequences, head)
        units = self.losses(values, counts.clamp(min=1), reference, batch, scope.kl)
        sums = replace(
            units.sums,
            loss_sum=units.losses.detach().sum(),
            nll_sum=units.nll.detach(),
            nll_tokens=self.nll_tokens(batch),
        )
        return replace(units, sums=sums)

    def mean_loss(self, units: UnitLosses, scope: PreferenceScope) -> torch.Tensor:
        """The micro-batch's share of the global batch's loss: its units' summed losses over the global units."""
        return units.losses.sum() / max(scope.units, 1.0)

    def micro_batch(self, policy: Policy, batch: PreferenceBatch, scope: PreferenceScope) -> MicroLoss[PreferenceSums]:
        """The micro-batch's share of the global batch's loss, scaled for backward, and its metric sums."""
        units = self.unit_losses(policy, batch, scope)
        return MicroLoss(self.mean_loss(units, scope) * scope.accumulation, units.sums)

    def point(self, scope: PreferenceScope) -> dict[str, float]:
        """Its reference point, as metrics.jsonl and eval.json record it (KTO's kl); none for the others."""
        return {}

    def end_step(self, sums: PreferenceSums, scope: PreferenceScope) -> StepResult:
        """The step's mean loss (the preference objective's alone), the answers' target tokens, the reward accuracy
        and margin (and KTO's kl)."""
        metrics = metrics_of(sums)
        own = {key: metrics[key] for key in ("reward_accuracy", "reward_margin")} | self.point(scope)
        return StepResult(metrics["loss"], int(float(sums.chosen_tokens) + float(sums.rejected_tokens)), own)

    @torch.no_grad()
    def evaluate(
        self, model: torch.nn.Module, rows: Split, indices: Sequence[int], dist: Dist, options: EvalOptions
    ) -> Metrics:
        """The preference metrics over the rows `indices` of the eval split: sums all-reduced and divided once (so
        equal to one process's). KTO's reference point comes from the same rows, each with the answer of the next
        row as its mismatched sequence."""
        self.head = LossHead.of(model, self.chunk_tokens)  # the model given here (the evaluate stage loads its own)
        policy = Policy(model, dist.device)
        plan = EvalPasses.of(rows, indices, dist, options)
        kl = self.reference_point(policy, (plan.batch(k) for k in range(plan.passes)), len(plan.groups), dist)
        scope = PreferenceScope(0.0, 0.0, kl, 1, self.tables.get("eval"))
        sums = PreferenceSums()
        for k in range(plan.passes):
            units = self.unit_losses(policy, plan.batch(k), scope)
            if k < len(plan.groups):
                sums = sums.plus(units.sums)
        metrics = metrics_of(sums.reduced(dist))
        return {**metrics, "objective": self.objective.name, **self.point(scope)}

    def eval_fields(self) -> Metrics:
        """The reference model it compared with, in words (null without one)."""
        return {"reference": self.objective.reference_words(self.method)}

    def state_dict(self) -> dict[str, Any] | None:
        """Nothing beside the engine (full fine-tuning's tables are on storage)."""
        return None

    def load_state_dict(self, state: dict[str, Any] | None) -> None:  # noqa: B027 - every subclass's, deliberately
        """Nothing to restore."""

    def summary(self, result: Metrics) -> str:
        """The evaluation's log line."""
        return (
            f"eval {result['objective']} loss {result['loss']:.4f} reward accuracy {result['reward_accuracy']:.4f} "
            f"reward margin {result['reward_margin']:.4f} over {result['units']} units"
        )
