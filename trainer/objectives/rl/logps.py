"""The log-probabilities GRPO takes of its completions: the policy's (with gradients, for the loss), and without
gradients the old ones (the policy when the rollouts were generated, for num_iterations > 1) and the reference
model's (beta > 0).

The reference is the base model: the policy with its LoRA adapters disabled (PEFT's `disable_adapter`, as DPO's:
trainer/objectives/preference/reference.py), or under full fine-tuning a frozen copy of the base loaded beside the
policy once (`frozen_reference`: not under ZeRO-3, whose policy is partitioned: pipeline/plan.py refuses it). Each is a
forward pass over a micro-batch's prompt and completion tokens that keeps the logits of the completion's positions
only (`logits_to_keep`), at the rollouts' temperature.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any

import torch

from trainer.objectives.policy import Policy
from trainer.objectives.preference.reference import adapters_off
from trainer.objectives.rl.loss import token_logps
from trainer.objectives.rl.rollouts import RolloutBatch


def completion_logps(policy: Policy, built: RolloutBatch, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(each completion token's log-probability, its distribution's entropy) under `policy`."""
    width = built.completion_ids.shape[1]
    out = policy.forward(built.batch, {"logits_to_keep": width + 1})
    logits = out.logits[:, :-1, :]  # position t predicts token t + 1: these predict the completion's tokens
    return token_logps(logits, built.completion_ids.to(policy.device), temperature)


@torch.no_grad()
def detached_logps(
    policy: Policy, built: RolloutBatch, temperature: float, old: bool, reference: tuple[Policy | None, bool]
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(the policy's log-probabilities as they are now when `old`, the reference's or None) of a micro-batch, without
    gradients; `reference`: (a frozen copy under full fine-tuning, else None; whether the reference is the policy with
    its adapters off)."""
    frozen, adapters = reference
    module = policy.module
    training = module.training
    module.eval()  # no dropout: the values are those of the model, not of a draw
    try:
        now = completion_logps(policy, built, temperature)[0].float().cpu() if old else None
        ref = None
        if frozen is not None or adapters:
            context: Any = adapters_off(policy) if frozen is None else nullcontext()
            with context:
                ref = completion_logps(frozen or policy, built, temperature)[0].float().cpu()
    finally:
        module.train(training)
    return now, ref


def frozen_reference(model_path: str, device: torch.device, *, bf16: bool, trust_remote_code: bool) -> Policy:
    """The base model loaded again, frozen, as full fine-tuning's reference."""
    from config.methods import METHODS
    from trainer.model.load import load_base

    model = load_base(model_path, method=METHODS["full"], bf16=bf16, trust_remote_code=trust_remote_code)
    model.requires_grad_(False)
    return Policy(model.to(device).eval(), device)
