"""KTO (train.objective=kto; Ethayarajh et al. 2024) on answers labelled desirable or not: each answer's loss is
weighed against the reference point z0, the mean policy/reference log-ratio of mismatched answers (each prompt with
the next row's answer: batching.py), computed over the whole global batch before its first micro-batch, all-reduced,
clamped at 0 and never differentiated. An answer is right when its reward's sign is its label's."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from trainer.objectives.policy import Policy
from trainer.objectives.preference.batching import PreferenceBatch
from trainer.objectives.preference.losses import kto_losses
from trainer.objectives.preference.objective import PreferenceObjective, PreferenceScope, UnitLosses
from trainer.objectives.preference.reference import kl_sums
from trainer.objectives.preference.sums import feedback_sums
from trainer.parallel.distributed import Dist, dist_sum


class Kto(PreferenceObjective):
    """KTO with its weights of the desirable and undesirable answers (train.preference)."""

    def reference_point(self, policy: Policy, batches: Iterable[PreferenceBatch], counted: int, dist: Dist) -> float:
        """z0 over every rank's first `counted` micro-batches (the others are throw-away passes, run all the same:
        under ZeRO-3 every rank runs as many), clamped at 0."""
        head = self.loss_head(policy.module)
        local = [kl_sums(policy, batch, head) for batch in batches][:counted]
        total, count = dist_sum([sum(s for s, _ in local), sum(n for _, n in local)], dist)
        return max(total / max(count, 1.0), 0.0)

    def losses(
        self,
        policy: torch.Tensor,
        counts: torch.Tensor,
        reference: torch.Tensor | None,
        batch: PreferenceBatch,
        kl: float,
    ) -> UnitLosses:
        """Each answer's loss against the reference point."""
        assert reference is not None and not batch.pairs, "kto trains on labelled answers, with a reference"
        losses = kto_losses(
            policy,
            reference,
            batch.desirable.to(policy.device),
            torch.tensor(kl, device=policy.device),
            self.beta,
            self.settings.desirable_weight,
            self.settings.undesirable_weight,
        )
        sums = feedback_sums(self.beta * (policy - reference).detach(), policy.detach(), counts, batch.desirable)
        return UnitLosses(losses, torch.zeros((), device=policy.device), sums)

    def point(self, scope: PreferenceScope) -> dict[str, float]:
        """The reference point, as `kl`."""
        return {"kl": scope.kl}
