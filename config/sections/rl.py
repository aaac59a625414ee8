"""Online RL's settings: the `train.rl` section (train.objective=grpo), TRL 1.16's `GRPOConfig` names where TRL has
them (docs/online-rl.md maps each one).

Apart from `train` for the same reason as `train.preference`: the objective (config/objectives.py) reads it to
describe itself, and `train` holds the objective.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from config.rewards import Reward
from config.sections.base import Section

LossType = Literal["dapo", "grpo", "dr_grpo", "bnpo"]
ScaleRewards = Literal["group", "batch", "none"]


class RlConfig(Section):
    """Online RL with verifiable rewards (train.objective=grpo; docs/online-rl.md)."""

    num_generations: int = Field(
        8,
        ge=2,
        le=1024,
        description="Completions sampled per prompt (the group size G): advantages compare each completion with its "
        "group's. The global batch (train.global_batch_size, or micro-batch x accumulation x ranks) counts "
        "completions, as TRL's generation batch does, and must be a multiple of it.",
    )
    max_prompt_length: int | None = Field(
        None,
        gt=0,
        description="Tokens of a prompt (its chat template's rendering, generation prompt included); a longer one "
        "follows data.excess_length (truncate keeps its end, as TRL does). Empty: data.max_length; set, it is the "
        "data.max_length prompts are staged with.",
    )
    max_completion_length: int = Field(256, gt=0, le=32768, description="Tokens generated per completion at most.")
    temperature: float = Field(
        1.0,
        gt=0.0,
        le=10.0,
        description="Sampling temperature of the rollouts; the loss's log-probabilities are taken at the same "
        "temperature (TRL's).",
    )
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling of the rollouts; 1: the whole vocabulary.")
    beta: float = Field(
        0.0,
        ge=0.0,
        le=100.0,
        description="Weight of the KL divergence to the reference model in the loss (TRL 1.16's default: 0, no "
        "reference model). Above 0 the reference is the base model: the adapters disabled for lora and qlora, a frozen "
        "copy of the base loaded beside the policy for full fine-tuning (counted by --plan).",
    )
    epsilon: float = Field(0.2, gt=0.0, lt=1.0, description="Lower clipping bound of the probability ratio (1 - eps).")
    epsilon_high: float | None = Field(
        None,
        gt=0.0,
        le=10.0,
        description="Upper clipping bound of the ratio (1 + eps_high; DAPO's clip-higher uses 0.28); empty: epsilon.",
    )
    loss_type: LossType = Field(
        "dapo",
        description="How per-token losses are averaged: dapo (over every completion token of the global batch), "
        "grpo (per completion, then over completions), dr_grpo (over completions x max_completion_length), bnpo "
        "(over each micro-batch's tokens, as TRL: the only one that changes with the number of ranks and "
        "micro-batches).",
    )
    scale_rewards: ScaleRewards = Field(
        "group",
        description="Advantages are rewards minus their group's mean, divided by the group's standard deviation "
        "(group), the whole global batch's (batch), or not divided (none: Dr. GRPO).",
    )
    num_iterations: int = Field(
        1,
        ge=1,
        le=64,
        description="Optimizer steps per batch of rollouts (TRL's mu): the rollouts of step k are reused for steps "
        "k+1 .. k+mu-1 against their log-probabilities when generated; kept in checkpoints, so a resume inside the "
        "window continues it exactly.",
    )
    mask_truncated_completions: bool = Field(
        False, description="Leave completions that reached max_completion_length without ending out of the loss."
    )
    rewards: list[str] = Field(
        default_factory=lambda: ["accuracy"],
        min_length=1,
        description="Reward functions, summed with reward_weights: accuracy (the completion's final answer against "
        "the record's answer or solution, with math-verify for math: \\boxed{}, #### N, LaTeX; else normalised exact "
        "match), format (reasoning then answer in rl.reasoning_tag and rl.answer_tag), tool_call (the completion's "
        "tool calls equal the record's), module:function or path/to/file.py:function (TRL's signature: "
        "function(prompts=, completions=, completion_ids=, **columns) -> a float or None per completion; a file is "
        "staged with the data and its digest recorded).",
    )
    reward_weights: list[float] | None = Field(None, description="One weight per reward, in order; empty: 1 each.")
    rollout_batch_size: int | None = Field(
        None,
        gt=0,
        description="Completions generated together in one call (left-padded prompts, the KV cache): the global "
        "batch's rollouts are cut into such batches, the same on any number of ranks, and dealt to the ranks in "
        "turn. Must divide the global batch; empty: num_generations (one group a call).",
    )
    reasoning_tag: str = Field(
        "think", pattern=r"^[A-Za-z][\w-]*$", description="The format reward's reasoning tag (<think>...</think>)."
    )
    answer_tag: str = Field(
        "answer",
        pattern=r"^[A-Za-z][\w-]*$",
        description="The format reward's answer tag (<answer>...</answer>); accuracy reads the last one's content "
        "when a completion has it.",
    )

    @field_validator("rewards")
    @classmethod
    def _known(cls, rewards: list[str]) -> list[str]:
        parsed = [Reward.of(text) for text in rewards]
        names = [reward.name for reward in parsed]
        twice = sorted({name for name in names if names.count(name) > 1})
        if twice:
            raise ValueError(
                f"train.rl.rewards: two rewards are named {twice[0]} (a reward's metrics carry its function's name); "
                "give each a distinct function name"
            )
        return rewards

    @model_validator(mode="after")
    def _weights(self) -> RlConfig:
        if self.reward_weights is not None and len(self.reward_weights) != len(self.rewards):
            raise ValueError(
                f"train.rl.reward_weights has {len(self.reward_weights)} weights for {len(self.rewards)} rewards; "
                "give one per reward, in order, or leave it empty"
            )
        return self

    @property
    def parsed_rewards(self) -> list[Reward]:
        """The rewards, read."""
        return [Reward.of(text) for text in self.rewards]

    @property
    def weights(self) -> list[float]:
        """One weight per reward."""
        return list(self.reward_weights) if self.reward_weights is not None else [1.0] * len(self.rewards)

    @property
    def clip_high(self) -> float:
        """The upper clipping bound's epsilon (epsilon_high, else epsilon)."""
        return self.epsilon if self.epsilon_high is None else self.epsilon_high

    @property
    def rollout_batch(self) -> int:
        """Completions per generation call."""
        return self.rollout_batch_size or self.num_generations

    @property
    def needs_answer(self) -> bool:
        """Whether a reward reads the record's reference answer (accuracy)."""
        return "accuracy" in self.rewards
