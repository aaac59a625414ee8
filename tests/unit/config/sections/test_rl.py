"""train.rl (config/sections/rl.py): TRL 1.16's GRPOConfig defaults where TRL has the setting, and what the section
derives (the clip's upper epsilon, the rollout batch, the weights, whether a reward reads the reference answer)."""

from __future__ import annotations

from config.sections.rl import RlConfig


def test_the_defaults_are_trls() -> None:
    rl = RlConfig()
    assert (rl.num_generations, rl.max_completion_length, rl.temperature, rl.top_p) == (8, 256, 1.0, 1.0)
    assert (rl.beta, rl.epsilon, rl.loss_type, rl.scale_rewards, rl.num_iterations) == (0.0, 0.2, "dapo", "group", 1)
    assert rl.mask_truncated_completions is False and rl.epsilon_high is None


def test_what_the_section_derives() -> None:
    rl = RlConfig(rewards=["accuracy", "format"], reward_weights=[1.0, 0.5], epsilon_high=0.28, num_generations=4)
    assert (rl.clip_high, rl.rollout_batch, rl.weights, rl.needs_answer) == (0.28, 4, [1.0, 0.5], True)
    other = RlConfig(rewards=["format"], rollout_batch_size=16)
    assert (other.clip_high, other.rollout_batch, other.weights, other.needs_answer) == (0.2, 16, [1.0], False)
