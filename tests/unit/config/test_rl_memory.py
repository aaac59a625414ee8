"""What online RL adds to the memory plan (config/rl_memory.py, through config/memory_plan.py): a row is a prompt and
its completion, the loss keeps the completions' logits, the rollouts are a phase of their own (the key-value cache of
one rollout batch, the next token's logits, ZeRO-3's weights gathered whole), full fine-tuning's frozen reference with
beta > 0, a window's rollouts on the host with num_iterations > 1; none of it for other objectives."""

from __future__ import annotations

from config.loader import load_config
from config.memory_plan import Phase, plan
from config.rl_memory import row_tokens

# Qwen2.5-0.5B's published shape.
MODEL = {
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "vocab_size": 151936,
    "tie_word_embeddings": True,
}
GRPO = ["train.objective=grpo", "train.micro_batch_size=4", "train.global_batch_size=32", "launch.nnodes=1"]
DS = {"zero_optimization": {"stage": 2}}


def terms(overrides: list[str], ds: dict = DS) -> dict[str, tuple[int, Phase]]:
    memory = plan(load_config(None, overrides), ds, MODEL, on_gpu=True)
    assert memory is not None
    return {t.what: (t.bytes, t.phase) for t in [*memory.device, *memory.host]}


def test_the_rollouts_and_the_completions_logits_are_counted() -> None:
    cfg = load_config(None, [*GRPO, "train.rl.max_completion_length=256", "train.rl.rollout_batch_size=16"])
    assert row_tokens(cfg) == 256 + 256  # data.max_length 256 (the preset's): the prompt, then its completion
    found = terms([*GRPO, "train.rl.max_completion_length=256", "train.rl.rollout_batch_size=16"])
    cache = 16 * 512 * 24 * 2 * 128 * 2  # rows x tokens x layers x (keys, values) x KV width x bf16
    assert found["rollouts: the key-value cache of a rollout batch"] == (cache, Phase.GENERATE)
    assert found["the loss's logits (completions)"] == (4 * 257 * 151936 * 14, Phase.BACKWARD)
    assert "rollouts: the weights gathered whole" not in found and "the reference model (a frozen copy)" not in found
    zero3 = terms([*GRPO, "launch.nproc_per_node=4"], {"zero_optimization": {"stage": 3}})
    assert zero3["rollouts: the weights gathered whole"][1] is Phase.GENERATE


def test_full_fine_tunings_reference_and_a_windows_rollouts() -> None:
    found = terms([*GRPO, "train.method=full", "train.rl.beta=0.04", "train.rl.num_iterations=2"])
    assert found["the reference model (a frozen copy)"][1] is Phase.ALWAYS
    assert found["a window's rollouts and log-probabilities"] == (32 * 256 * 16, Phase.ALWAYS)
    assert not any("rollouts" in what for what in terms(["launch.nnodes=1"]))
