"""What online RL (train.objective=grpo) adds to a rank's memory plan (config/memory_plan.py), term by term, from
first principles like the rest of the plan:

- a micro-batch's rows are a prompt and its completion: train.rl.max_prompt_length + max_completion_length tokens
  (the plan's activations take that length), and the loss keeps the logits of the completion's positions over the
  whole vocabulary (the training dtype, their float32 copy at the temperature, its log-softmax and gradient);
- the rollouts (a phase of their own, never at once with backward): the key-value cache of one rollout batch
  (train.rl.rollout_batch_size rows of prompt + completion tokens, every layer's keys and values), the next token's
  logits over the vocabulary (float32 scores, the sampler's float64 noise and its float32 sum), and under ZeRO-3 the
  rest of the weights, gathered whole on every rank for the phase (trainer/model/generation.py `whole_weights`);
- the reference model with beta > 0: none for lora and qlora (the adapters disabled), the base's weights again,
  frozen, under full fine-tuning (refused under ZeRO-3);
- with num_iterations > 1, a window's old (and reference) log-probabilities kept for the whole global batch, float32,
  with the completions' tokens, on the host.
"""

from __future__ import annotations

from typing import Any

from config.footprint import projection_shapes
from config.objectives import PROMPT_DATA
from config.schema import FinetuneConfig

# A term as the plan's Term takes it: (what, bytes, its phase's name, the setting that shrinks it).
RawTerm = tuple[str, int, str, str]


def is_rl(cfg: FinetuneConfig) -> bool:
    """Whether the run is online RL."""
    return cfg.train.objective.data == PROMPT_DATA


def row_tokens(cfg: FinetuneConfig) -> int:
    """Tokens of a training row: data.max_length, or for online RL a prompt and its completion."""
    return cfg.data.max_length + (cfg.train.rl.max_completion_length if is_rl(cfg) else 0)


def loss_logits_bytes(cfg: FinetuneConfig, vocab: int, w: int) -> int:
    """Online RL's loss logits of a micro-batch: its completions' positions x the vocabulary, in the training dtype,
    a float32 copy at the temperature, its log-softmax and the gradient."""
    return cfg.train.micro_batch_size * (cfg.train.rl.max_completion_length + 1) * vocab * (w + 12)


def rl_terms(
    cfg: FinetuneConfig, model: dict[str, Any], sizes: tuple[int, int, int, int]
) -> tuple[list[RawTerm], list[RawTerm]]:
    """(device, host) terms online RL adds (module docstring) for `model`'s config.json, `sizes`: (its parameters,
    bytes of the training dtype, the ZeRO stage, the ranks); none for other objectives."""
    if not is_rl(cfg):
        return [], []
    params, w, stage, world = sizes
    rl = cfg.train.rl
    layers, vocab = int(model["num_hidden_layers"]), int(model["vocab_size"])
    kv_width = projection_shapes(model)["k_proj"][1]
    rows = rl.rollout_batch
    cache = rows * row_tokens(cfg) * layers * 2 * kv_width * w
    shrink = "train.rl.rollout_batch_size or max_completion_length"
    device = [
        ("rollouts: the key-value cache of a rollout batch", cache, "generate", shrink),
        ("rollouts: the next token's logits and noise", rows * vocab * 16, "generate", shrink),
    ]
    if stage == 3:
        whole = params * w - params * w // world
        device.append(("rollouts: the weights gathered whole", whole, "generate", "deepspeed.config: ZeRO-2"))
    if rl.beta > 0 and not cfg.train.method.trains_adapters:
        device.append(("the reference model (a frozen copy)", params * w, "always", "train.rl.beta=0"))
    host: list[RawTerm] = []
    if rl.num_iterations > 1:
        batch = cfg.global_batch(world) * rl.max_completion_length * (4 + 4 * (rl.beta > 0) + 8)
        host.append(("a window's rollouts and log-probabilities", batch, "always", "train.rl.num_iterations"))
    return device, host
