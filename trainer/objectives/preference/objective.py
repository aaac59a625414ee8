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
from dataclasses import dataclass
from typing import Any, Self

import torch

from config.methods import Method
from config.objectives import Objective
from config.sections.model_train import TrainConfig
from config.sections.preference import PreferenceConfig
from core.errors import UserError
from storage.shards import PAIR
from storage.spec import Spec
from storage.split_reader import Split
from trainer.data import GlobalOrder
from trainer.loss.chunked import LossHead
from trainer.objectives.base import MicroLoss, Pending, StepResult, Sums, add, reduced
from trainer.objectives.preference.batching import PreferenceBatch, collate_preference, rank_preference_batches
from trainer.objectives.preference.reference import eval_tables, policy_logps, reference_for, run_tables
from trainer.objectives.preference.reference_table import ReferenceTable
from trainer.objectives.preference.sums import SUM_KEYS, metrics_of
from trainer.parallel.distributed import Dist, dist_sum
from trainer.parallel.moe import RouterBalance


@dataclass(frozen=True)
class PreferenceScope:
    """A step's (or an evaluation's) global counts: its units and the chosen answers' target tokens, KTO's reference
    point, the accumulation DeepSpeed averages over (micro-batches x ranks, undone), the device, and the split's
    reference table under full fine-tuning."""

    units: float
    chosen_tokens: float
    kl: float
    accumulation: int
    device: torch.device
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
    def of(cls, rows: Split, indices: Sequence[int], dist: Dist, batch_size: int, pad_id: int, lockstep: bool) -> Self:
        """This rank's passes."""
        if not len(indices):
            raise UserError(f"{rows.shards[0].path if rows.shards else 'the eval split'}: no eval rows to evaluate")
        mine = list(indices[dist.rank :: dist.world_size])
        groups = [mine[start : start + batch_size] for start in range(0, len(mine), batch_size)]
        passes = math.ceil(math.ceil(len(indices) / dist.world_size) / batch_size) if lockstep else len(groups)
        partner = {index: indices[(k + 1) % len(indices)] for k, index in enumerate(indices)}
        return cls(rows, indices, groups, passes, pad_id, partner)

    def batch(self, k: int) -> PreferenceBatch:
        """The micro-batch of pass k."""
        group = self.groups[k] if k < len(self.groups) else [self.indices[0]]  # throw-away: keeps ZeRO-3 in step
        feedback = [self.rows.feedback(i) for i in group]
        partners = [] if PAIR in feedback else [self.rows[self.partner[i]] for i in group]
        return collate_preference([self.rows[i] for i in group], feedback, self.pad_id, partners, group)


class PreferenceObjective(ABC):
    """A preference objective on a rank: its config object, its settings (train.preference), the method (full
    fine-tuning reads its reference from tables), the tables by split, and a mixture of experts' router balance
    (train.moe.aux_loss_coef: its load-balancing loss added to the policy's as SFT adds it, logged apart).
    Subclasses compute each unit's loss (`losses`); KTO adds its reference point."""

    sum_keys: tuple[str, ...] = SUM_KEYS

    def __init__(
        self,
        objective: Objective,
        settings: PreferenceConfig,
        method: Method,
        aux_loss_coef: float | None = None,
        chunk_tokens: int = 0,
    ) -> None:
        self.objective, self.settings, self.method = objective, settings, method
        self.aux_loss_coef = aux_loss_coef
        self.chunk_tokens = chunk_tokens  # train.loss_chunk_tokens: how log-probabilities are taken (LossHead)
        self.head: LossHead | None = None  # the model's, built by start (training) and evaluate
        self.tables: dict[str, ReferenceTable] = {}
        self.router: RouterBalance | None = None

    @classmethod
    def of(cls, train: TrainConfig) -> Self:
        """The objective of train, with its settings."""
        return cls(train.objective, train.preference, train.method, train.moe.aux_loss_coef, train.loss_chunk_tokens)

    def loss_head(self, model: Any) -> LossHead:
        """How `model`'s log-probabilities are taken (from its last hidden states in chunks, or full logits): the
        head start or evaluate built, else `model`'s, built now."""
        if self.head is None:
            self.head = LossHead.of(model, self.chunk_tokens)
        return self.head

    @property
    def beta(self) -> float:
        """train.preference.beta: DPO's beta, IPO's tau, ORPO's lambda."""
        return self.settings.beta

    @property
    def reads_tables(self) -> bool:
        """Whether its reference comes from tables: a reference model under full fine-tuning."""
        return self.objective.reference and not self.method.trains_adapters

    def start(self, engine: Any, spec: Spec, dist: Dist, pad_id: int) -> None:
        """Full fine-tuning's reference tables, read or computed by the base before any checkpoint is resumed; a
        mixture of experts' router balance (trainer/parallel/moe.py); the loss head the log-probabilities are taken
        through."""
        self.head = LossHead.of(engine, self.chunk_tokens)
        model_config = getattr(getattr(engine, "module", engine), "config", None)  # an engine's own is DeepSpeed's
        self.router = RouterBalance.of(model_config, self.aux_loss_coef, dist)
        if self.router is not None:
            self.sum_keys = (*SUM_KEYS, "aux_loss_sum", "micro_batches")
        if self.reads_tables:
            self.tables = run_tables(engine, spec, dist, pad_id)

    def start_evaluation(self, spec: Spec, rows: Split) -> None:
        """The eval split's reference table under full fine-tuning, as the train stage wrote it."""
        if self.reads_tables:
            self.tables = eval_tables(spec, rows, self.objective.name)

    def deal(self, rows: Split, order: GlobalOrder, **dealing: Any) -> Iterator[PreferenceBatch]:
        """This rank's micro-batches of preference units, dealt as supervised rows are."""
        return rank_preference_batches(rows, order, **dealing)

    def reference_point(self, model: Any, batches: Iterable[PreferenceBatch], counted: int, dist: Dist) -> float:
        """KTO's reference point (kto.py); none for the others."""
        return 0.0

    def begin_step(self, model: Any, batches: Sequence[PreferenceBatch], dist: Dist) -> PreferenceScope:
        """The global batch's units and chosen target tokens (and KTO's reference point)."""
        units, chosen = dist_sum([sum(b.units for b in batches), sum(b.chosen_tokens for b in batches)], dist)
        kl = self.reference_point(model, batches, len(batches), dist)
        return PreferenceScope(units, chosen, kl, dist.world_size * len(batches), dist.device, self.tables.get("train"))

    @abstractmethod
    def losses(
        self,
        policy: torch.Tensor,
        counts: torch.Tensor,
        reference: torch.Tensor | None,
        batch: PreferenceBatch,
        kl: float,
    ) -> tuple[torch.Tensor, torch.Tensor, Pending]:
        """(each unit's loss, the summed chosen-token cross-entropy ORPO adds (0 for the others), the metric sums)
        from the policy's log-probabilities of the batch's sequences and their target counts, and the reference's."""

    def nll_tokens(self, batch: PreferenceBatch) -> float:
        """The target tokens the cross-entropy of `losses` is divided by (ORPO: the chosen answers'); 0 without one."""
        return 0.0

    def unit_losses(
        self, model: Any, batch: PreferenceBatch, scope: PreferenceScope, router: RouterBalance | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, Pending, torch.Tensor | None]:
        """(each unit's loss, ORPO's summed cross-entropy, the metric sums, the `router`'s unweighted load-balancing
        loss or None without one) of a micro-batch: the reference first, then the policy in one forward pass."""
        head = self.loss_head(model)
        reference = reference_for(model, batch, scope.device, scope.table, head) if self.objective.reference else None
        policy, counts, aux = policy_logps(model, batch.sequences, scope.device, head, router)
        losses, nll, sums = self.losses(
            policy, counts.clamp(min=1), None if reference is None else reference[0], batch, scope.kl
        )
        sums["loss_sum"] = losses.detach().sum()
        sums["nll_sum"] = nll.detach()
        sums["nll_tokens"] = self.nll_tokens(batch)
        return losses, nll, sums, aux

    def mean_loss(self, losses: torch.Tensor, nll: torch.Tensor, scope: PreferenceScope) -> torch.Tensor:
        """The micro-batch's share of the global batch's loss: its units' summed losses over the global units."""
        return losses.sum() / max(scope.units, 1.0)

    def micro_batch(self, model: Any, batch: PreferenceBatch, scope: PreferenceScope) -> MicroLoss:
        """The micro-batch's share of the global batch's loss, scaled for backward, and its metric sums; a mixture
        of experts' weighted load-balancing loss added to backward only."""
        losses, nll, sums, aux = self.unit_losses(model, batch, scope, self.router)
        backward = self.mean_loss(losses, nll, scope) * scope.accumulation
        if self.router is not None and aux is not None:
            # DeepSpeed's average over accumulation and ranks makes the weighted auxiliary loss the step's mean of it.
            backward = backward + self.router.coef * aux
            sums |= {"aux_loss_sum": aux.detach(), "micro_batches": 1.0}
        return MicroLoss(backward, sums)

    def point(self, scope: PreferenceScope) -> dict[str, float]:
        """Its reference point, as metrics.jsonl and eval.json record it (KTO's kl); none for the others."""
        return {}

    def end_step(self, sums: Sums, scope: PreferenceScope) -> StepResult:
        """The step's mean loss (the preference objective's alone), the answers' target tokens, the reward accuracy
        and margin (and KTO's kl); for a mixture of experts, the load-balancing loss and the experts' load, apart."""
        metrics = metrics_of(sums)
        own = {key: metrics[key] for key in ("reward_accuracy", "reward_margin")} | self.point(scope)
        if self.router is not None:
            own |= {"aux_loss": sums["aux_loss_sum"] / max(sums["micro_batches"], 1.0), **self.router.end_step()}
        return StepResult(metrics["loss"], int(sums["chosen_tokens"] + sums["rejected_tokens"]), own)

    @torch.no_grad()
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
        """The preference metrics over the rows `indices` of the eval split: sums all-reduced and divided once (so
        equal to one process's). KTO's reference point comes from the same rows, each with the answer of the next
        row as its mismatched sequence."""
        self.head = LossHead.of(model, self.chunk_tokens)  # the model given here (the evaluate stage loads its own)
        plan = EvalPasses.of(rows, indices, dist, batch_size, pad_id, lockstep)
        kl = self.reference_point(model, (plan.batch(k) for k in range(plan.passes)), len(plan.groups), dist)
        scope = PreferenceScope(0.0, 0.0, kl, 1, dist.device, self.tables.get("eval"))
        sums: Pending = {}
        for k in range(plan.passes):
            _, _, micro, _ = self.unit_losses(model, plan.batch(k), scope)  # the language model's alone
            if k < len(plan.groups):
                add(sums, micro, SUM_KEYS)
        metrics = metrics_of(reduced(sums, SUM_KEYS, dist))
        return {**metrics, "objective": self.objective.name, **self.point(scope)}

    def eval_fields(self) -> dict[str, Any]:
        """The reference model it compared with, in words (null without one)."""
        return {"reference": self.objective.reference_words(self.method)}

    def summary(self, result: dict[str, Any]) -> str:
        """The evaluation's log line."""
        return (
            f"eval {result['objective']} loss {result['loss']:.4f} reward accuracy {result['reward_accuracy']:.4f} "
            f"reward margin {result['reward_margin']:.4f} over {result['units']} units"
        )
