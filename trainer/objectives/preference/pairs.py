"""The objectives on pairs (train.objective dpo, ipo, orpo): each pair's chosen and rejected sequences go through one
forward pass (the n chosen first, then the n rejected: batching.py), and each objective turns their log-probabilities
into a loss per pair and the pair's rewards (losses.py has the equations).

- DPO: the sigmoid loss of the log-ratio margin against the reference (summed log-probabilities); rewards
  beta x (log pi - log ref).
- IPO: the squared loss on log-probabilities averaged per answer token; rewards as DPO's.
- ORPO: no reference; the odds-ratio term on per-token means, weighted by lambda, plus the chosen answers' summed
  cross-entropy, divided by the global batch's chosen target tokens; rewards lambda x the per-token means.
"""

from __future__ import annotations

from abc import abstractmethod

import torch

from trainer.objectives.preference.batching import PreferenceBatch
from trainer.objectives.preference.losses import dpo_losses, ipo_losses, orpo_ratio_losses
from trainer.objectives.preference.objective import PreferenceObjective, PreferenceScope, UnitLosses
from trainer.objectives.preference.sums import PairLogps

# (each pair's loss, the summed cross-entropy ORPO adds, each pair's chosen reward, its rejected reward)
PairLosses = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


class PairObjective(PreferenceObjective):
    """An objective on pairs; subclasses give each pair's loss and rewards (`pair_losses`)."""

    def losses(
        self,
        policy: torch.Tensor,
        counts: torch.Tensor,
        reference: torch.Tensor | None,
        batch: PreferenceBatch,
        kl: float,
    ) -> UnitLosses:
        """Each pair's loss from its chosen (first n) and rejected (last n) sequences."""
        assert batch.pairs, f"{self.objective.name} trains on pairs: a micro-batch of KTO answers"
        pairs = PairLogps.of(policy, counts, reference, batch.units)
        losses, nll, chosen_reward, rejected_reward = self.pair_losses(pairs)
        return UnitLosses(losses, nll, pairs.sums(chosen_reward.detach(), rejected_reward.detach()))

    @abstractmethod
    def pair_losses(self, pairs: PairLogps) -> PairLosses:
        """Each pair's loss and rewards from summed log-probabilities, their target counts and the reference's."""


class Dpo(PairObjective):
    """DPO (Rafailov et al. 2023), with conservative DPO's label smoothing."""

    def pair_losses(self, pairs: PairLogps) -> PairLosses:
        """The sigmoid loss of each pair's margin over the reference's."""
        ref_chosen, ref_rejected = pairs.references()
        chosen, rejected = pairs.chosen, pairs.rejected
        losses = dpo_losses(chosen, rejected, ref_chosen, ref_rejected, self.beta, self.settings.label_smoothing)
        zero = torch.zeros((), device=chosen.device)
        return losses, zero, self.beta * (chosen - ref_chosen), self.beta * (rejected - ref_rejected)


class Ipo(PairObjective):
    """IPO (Azar et al. 2023), on log-probabilities averaged per answer token; tau is train.preference.beta."""

    def pair_losses(self, pairs: PairLogps) -> PairLosses:
        """The squared loss of each pair's per-token margin over the reference's."""
        ref_chosen, ref_rejected = pairs.references()
        chosen, rejected = pairs.chosen, pairs.rejected
        losses = ipo_losses(
            chosen / pairs.chosen_count,
            rejected / pairs.rejected_count,
            ref_chosen / pairs.chosen_count,
            ref_rejected / pairs.rejected_count,
            self.beta,
        )
        zero = torch.zeros((), device=chosen.device)
        return losses, zero, self.beta * (chosen - ref_chosen), self.beta * (rejected - ref_rejected)


class Orpo(PairObjective):
    """ORPO (Hong et al. 2024): the chosen answers' cross-entropy and an odds-ratio term, no reference model; lambda
    is train.preference.beta."""

    def pair_losses(self, pairs: PairLogps) -> PairLosses:
        """The odds-ratio term of each pair, and the chosen answers' summed cross-entropy."""
        chosen_avg, rejected_avg = pairs.chosen / pairs.chosen_count, pairs.rejected / pairs.rejected_count
        losses = orpo_ratio_losses(chosen_avg, rejected_avg, self.beta)
        return losses, -pairs.chosen.sum(), self.beta * chosen_avg, self.beta * rejected_avg

    def nll_tokens(self, batch: PreferenceBatch) -> float:
        """The chosen answers' target tokens: the cross-entropy's denominator."""
        return float(batch.chosen_tokens)

    def mean_loss(self, units: UnitLosses, scope: PreferenceScope) -> torch.Tensor:
        """The units' mean odds-ratio term plus the cross-entropy per chosen target token of the global batch."""
        return super().mean_loss(units, scope) + units.nll / max(scope.chosen_tokens, 1.0)
