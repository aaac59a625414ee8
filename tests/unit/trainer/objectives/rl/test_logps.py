"""GRPO's log-probabilities (trainer/objectives/rl/logps.py): the policy's of a slot's completion tokens, at the
temperature, equal those of one full forward pass over each prompt and completion alone; the detached ones (old, and
the reference with the adapters off) equal them without gradients, with the model left in its mode."""

from __future__ import annotations

import torch

from storage.split_reader import Split
from tests.unit.trainer.objectives.rl.conftest import load_policy
from trainer.data import Dealing, GlobalOrder
from trainer.objectives.policy import Policy
from trainer.objectives.preference.reference import adapters_off
from trainer.objectives.rl.logps import completion_logps, detached_logps
from trainer.objectives.rl.rollouts import Rollouts, build_batch, deal_slots

CPU = torch.device("cpu")


def test_a_slots_log_probabilities_are_each_rows_own(tiny_model: str, prompts: Split) -> None:
    model = load_policy(tiny_model).train()
    (slot, *_) = deal_slots(prompts, GlobalOrder(len(prompts), 1), Dealing(0, 2, 1, 0, 1, 0), 2, 1)
    rollouts = Rollouts(0, [[11, 12, 1], [13]], [True, False], torch.zeros(2, 1), torch.zeros(2), {})
    built = build_batch(slot, rollouts, 2, 0, mask_truncated=False)
    policy = Policy(model, CPU)
    logps, entropy = completion_logps(policy, built, 0.5)
    assert logps.requires_grad and logps.shape == entropy.shape == (2, 3)
    prompt = slot.window.prompts[0].ids
    with torch.no_grad():
        alone = model(input_ids=torch.tensor([[*prompt, 11, 12, 1]])).logits[0, len(prompt) - 1 : -1] / 0.5
    expected = torch.log_softmax(alone, -1).gather(-1, torch.tensor([[11], [12], [1]])).squeeze(-1)
    assert torch.allclose(logps[0], expected, atol=1e-5)
    old, ref = detached_logps(policy, built, 0.5, True, (None, True))
    assert old is not None and ref is not None and model.training and not old.requires_grad
    assert torch.allclose(old, logps.detach(), atol=1e-6)
    with torch.no_grad(), adapters_off(policy):
        base, _ = completion_logps(policy, built, 0.5)
    assert torch.equal(ref, base) and not torch.allclose(ref, old)
    assert detached_logps(policy, built, 0.5, False, (None, False)) == (None, None)
