"""One micro-batch of preference units through the objective (trainer/preference_loss.py), with the reference
log-probabilities, the rewards and the sums the metrics are divided from.

The reference of dpo, ipo and kto is the policy's own base: the same model with its LoRA adapters disabled (PEFT's
`disable_adapter()`), run without gradients before the policy's pass; no second model is loaded. Under full
fine-tuning, dpo's and ipo's reference log-probabilities are looked up in the table the base computed before
training (trainer/reference_table.py). A micro-batch's
loss is returned as its units' summed losses (and ORPO's summed chosen-token cross-entropy) for the caller to divide
by the global batch's counts.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from config.sections.model_train import REFERENCE_OBJECTIVES, TrainConfig
from trainer.data import Batch
from trainer.preference_data import PreferenceBatch
from trainer.preference_loss import dpo_losses, ipo_losses, kto_losses, orpo_ratio_losses, sequence_logps

if TYPE_CHECKING:
    from trainer.reference_table import ReferenceTable

# The sums every preference metric is divided from, in this order (all-reduced as one vector).
SUM_KEYS = (
    "units",
    "correct",
    "loss_sum",
    "nll_sum",
    "nll_tokens",
    "chosen_reward_sum",
    "chosen_count",
    "rejected_reward_sum",
    "rejected_count",
    "chosen_logp_sum",
    "chosen_tokens",
    "rejected_logp_sum",
    "rejected_tokens",
)
Sums = dict[str, float]


@dataclass(frozen=True)
class Objective:
    """train.objective with its settings (train.preference)."""

    name: str
    beta: float
    label_smoothing: float = 0.0
    desirable_weight: float = 1.0
    undesirable_weight: float = 1.0

    @classmethod
    def of(cls, train: TrainConfig) -> Objective:
        """The run's objective."""
        p = train.preference
        return cls(train.objective, p.beta, p.label_smoothing, p.desirable_weight, p.undesirable_weight)

    @property
    def needs_reference(self) -> bool:
        """Whether it compares the policy with a reference model (all but orpo)."""
        return self.name in REFERENCE_OBJECTIVES


@contextmanager
def adapters_off(model: Any) -> Iterator[None]:
    """The reference model: `model` (a DeepSpeed engine, a PEFT model) with its adapters disabled."""
    peft = getattr(model, "module", model)
    if not hasattr(peft, "disable_adapter"):
        raise RuntimeError("the reference model is the policy with its adapters disabled: a LoRA model is needed")
    with peft.disable_adapter():
        yield


def logps(model: Any, batch: Batch, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(summed target log-probability, target count) of every sequence of `batch`, in one forward pass."""
    out = model(**batch.model_inputs(device))
    return sequence_logps(out.logits, batch.labels)


def reference_logps(model: Any, batch: Batch, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference model's log-probabilities of `batch`, without gradients."""
    with torch.no_grad(), adapters_off(model):
        return logps(model, batch, device)


def reference_for(
    model: Any, batch: PreferenceBatch, device: torch.device, table: ReferenceTable | None
) -> tuple[torch.Tensor, ...]:
    """The reference log-probabilities of a micro-batch's sequences (first of the tuple): looked up in full
    fine-tuning's `table`, else computed by the model with its adapters disabled."""
    if table is not None:
        return (table.logps(batch.indices, device),)
    return reference_logps(model, batch.sequences, device)


def kl_sums(model: Any, batch: PreferenceBatch, device: torch.device) -> tuple[float, int]:
    """KTO: (summed policy - reference log-probability of the mismatched sequences, their count), no gradients."""
    assert batch.mismatched is not None, "KTO micro-batch without its mismatched sequences"
    with torch.no_grad():
        policy, _ = logps(model, batch.mismatched, device)
    reference, _ = reference_logps(model, batch.mismatched, device)
    return float((policy - reference).sum()), batch.units


def micro_batch(
    model: Any,
    batch: PreferenceBatch,
    objective: Objective,
    device: torch.device,
    kl: float = 0.0,
    table: ReferenceTable | None = None,
) -> tuple[torch.Tensor, torch.Tensor, Sums]:
    """(summed unit losses, ORPO's summed chosen-token cross-entropy (0 otherwise), the metric sums); the reference
    from `table` where given (full fine-tuning), else from the model with its adapters disabled."""
    reference = reference_for(model, batch, device, table) if objective.needs_reference else None
    policy, counts = logps(model, batch.sequences, device)
    counts = counts.clamp(min=1)
    n = batch.units
    nll = torch.zeros((), device=policy.device)
    if batch.pairs:
        pc, pr, cc, cr = policy[:n], policy[n:], counts[:n], counts[n:]
        if objective.name == "orpo":
            losses = orpo_ratio_losses(pc / cc, pr / cr, objective.beta)
            nll = -pc.sum()
            chosen_reward, rejected_reward = objective.beta * pc / cc, objective.beta * pr / cr
        else:
            assert reference is not None
            rc, rr = reference[0][:n], reference[0][n:]
            if objective.name == "ipo":
                losses = ipo_losses(pc / cc, pr / cr, rc / cc, rr / cr, objective.beta)
            else:
                losses = dpo_losses(pc, pr, rc, rr, objective.beta, objective.label_smoothing)
            chosen_reward, rejected_reward = objective.beta * (pc - rc), objective.beta * (pr - rr)
        sums = pair_sums(chosen_reward.detach(), rejected_reward.detach(), pc.detach(), pr.detach(), cc, cr)
    else:
        assert reference is not None
        kl_point = torch.tensor(kl, device=policy.device)
        losses = kto_losses(
            policy,
            reference[0],
            batch.desirable.to(policy.device),
            kl_point,
            objective.beta,
            objective.desirable_weight,
            objective.undesirable_weight,
        )
        sums = feedback_sums(
            objective.beta * (policy - reference[0]).detach(), policy.detach(), counts, batch.desirable
        )
    sums["loss_sum"] = float(losses.detach().sum())
    sums["nll_sum"] = float(nll.detach())
    sums["nll_tokens"] = float(batch.chosen_tokens) if objective.name == "orpo" else 0.0
    return losses.sum(), nll, sums


def pair_sums(
    chosen_reward: torch.Tensor,
    rejected_reward: torch.Tensor,
    chosen: torch.Tensor,
    rejected: torch.Tensor,
    chosen_count: torch.Tensor,
    rejected_count: torch.Tensor,
) -> Sums:
    """The metric sums of a micro-batch of pairs: a pair is right when its chosen answer's reward is the higher."""
    n = len(chosen_reward)
    return {
        "units": n,
        "correct": float((chosen_reward > rejected_reward).sum()),
        "chosen_reward_sum": float(chosen_reward.sum()),
        "chosen_count": n,
        "rejected_reward_sum": float(rejected_reward.sum()),
        "rejected_count": n,
        "chosen_logp_sum": float(chosen.sum()),
        "chosen_tokens": float(chosen_count.sum()),
        "rejected_logp_sum": float(rejected.sum()),
        "rejected_tokens": float(rejected_count.sum()),
    }


def feedback_sums(reward: torch.Tensor, policy: torch.Tensor, counts: torch.Tensor, desirable: torch.Tensor) -> Sums:
    """The metric sums of KTO answers: an answer is right when its reward's sign is its label's (positive for a
    desirable one); the desirable answers count as chosen, the others as rejected."""
    good = desirable.to(reward.device)
    return {
        "units": len(reward),
        "correct": float(((reward > 0) == good).sum()),
        "chosen_reward_sum": float(reward[good].sum()),
        "chosen_count": float(good.sum()),
        "rejected_reward_sum": float(reward[~good].sum()),
        "rejected_count": float((~good).sum()),
        "chosen_logp_sum": float(policy[good].sum()),
        "chosen_tokens": float(counts[good].sum()),
        "rejected_logp_sum": float(policy[~good].sum()),
        "rejected_tokens": float(counts[~good].sum()),
    }


def metrics_of(sums: Sums) -> dict[str, float]:
    """The preference metrics from (all-reduced) sums: divided once."""

    def ratio(a: str, b: str) -> float:
        return sums[a] / sums[b] if sums[b] else 0.0

    loss = ratio("loss_sum", "units") + ratio("nll_sum", "nll_tokens")
    return {
        "loss": loss,
        "reward_accuracy": ratio("correct", "units"),
        "reward_margin": ratio("chosen_reward_sum", "chosen_count") - ratio("rejected_reward_sum", "rejected_count"),
        "chosen_reward": ratio("chosen_reward_sum", "chosen_count"),
        "rejected_reward": ratio("rejected_reward_sum", "rejected_count"),
        "chosen_logps_per_token": ratio("chosen_logp_sum", "chosen_tokens"),
        "rejected_logps_per_token": ratio("rejected_logp_sum", "rejected_tokens"),
        "units": int(sums["units"]),
    }
