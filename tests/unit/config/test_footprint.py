"""The estimate of what a run writes (config/footprint.py) on a published shape: Qwen2.5-0.5B-Instruct's config.json
(494M parameters with its biases, tied embeddings). The tiny model's estimate against a real checkpoint is in
tests/distributed/test_footprint.py."""

from __future__ import annotations

from config.footprint import CHECKPOINT_OVERHEAD, RANK_OVERHEAD, adapter_params, estimate, model_params
from config.loader import load_config

QWEN25_05B = {
    "hidden_size": 896,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "intermediate_size": 4864,
    "vocab_size": 151936,
    "tie_word_embeddings": True,
}


def test_the_parameters_of_qwen25_05b() -> None:
    # 494,032,768 published, of which 0.1% are the q/k/v biases the estimate leaves out.
    assert abs(model_params(QWEN25_05B) - 494_032_768) / 494_032_768 < 0.002


def test_lora_counts_r_times_in_plus_out_per_projection() -> None:
    # r=8 on q and v: 24 layers x 8 x ((896 + 896) + (896 + 128)).
    assert adapter_params(QWEN25_05B, 8, ["q_proj", "v_proj"]) == 24 * 8 * (1792 + 1024)


def test_checkpoints_on_storage_at_once() -> None:
    cfg = load_config(None, ["train.method=full", "train.save_steps=10", "train.keep_latest_k=2"])
    full = estimate(cfg, QWEN25_05B, 100, 2, bf16=True)
    assert full is not None
    # bf16 weights, fp32 master, two Adam moments, and the fixed allowance for scripts and RNG states
    assert full.checkpoint == full.params * (2 + 4 + 8) + CHECKPOINT_OVERHEAD + 2 * RANK_OVERHEAD
    assert full.checkpoints_kept == 3  # keep_latest_k + 1 while the newest save completes
    assert full.storage == 3 * full.checkpoint + full.params * 2
    every = estimate(load_config(None, ["train.save_steps=30"]), QWEN25_05B, 100, 2, bf16=False)
    assert every is not None and every.checkpoints_kept == 4  # steps 30, 60, 90 and the last
    merged = estimate(load_config(None, ["train.export_merged=true"]), QWEN25_05B, 100, 2, bf16=True)
    assert merged is not None and merged.merged == merged.params * 2
    assert estimate(load_config(None, []), {"hidden_size": 8}, 100, 2, bf16=True) is None


def test_a_mixture_of_experts_counts_every_expert_and_its_active_ones_apart() -> None:
    from tests.published import QWEN3_30B_A3B, QWEN3_MOE_SCALED

    # Qwen's model card: 30.5B parameters, 3.3B activated.
    assert abs(model_params(QWEN3_30B_A3B) - 30.5e9) / 30.5e9 < 0.01
    assert abs(model_params(QWEN3_30B_A3B, active=True) - 3.3e9) / 3.3e9 < 0.02
    scaled = {**QWEN3_30B_A3B, **QWEN3_MOE_SCALED}
    # What the trainer reports on the scaled model (tests/unit/trainer/parallel/test_moe.py): 37,376 LoRA parameters (r
    # 8 on
    # attention and every expert weight) of 19,621,760, the adapters and Qwen3's q/k norms (2 x 2 x 16) included.
    assert model_params(scaled) == 19_621_760 - 37_376 - 2 * 2 * 16
    assert adapter_params(scaled, 8, None) == 37_376
    assert adapter_params(scaled, 8, None, []) == 2 * (2 * 8 * (64 + 128) + 2 * 8 * (64 + 16))  # attention only
