"""FLOPs per token (config/flops.py), what MFU divides by: a mixture of experts counts the parameters a token goes
through (its routed experts), checked against Qwen3-30B-A3B's published figures and against the real scaled model's
parameters built on the meta device (no memory); a dense model's count is the one of its real parameters."""

from __future__ import annotations

import pytest

from config.flops import active_params, flops_per_token
from config.footprint import adapter_params, model_params
from config.methods import FULL, LORA, Method
from tests.published import QWEN3_30B_A3B, QWEN3_MOE_SCALED

SCALED = {**QWEN3_30B_A3B, **QWEN3_MOE_SCALED}


def real_active(config: dict, model_type: str) -> tuple[int, int]:
    """(parameters a token goes through, every parameter) of the transformers model built from `config`, on the
    meta device: every parameter (a tied head counted), less the input embedding, less the experts a token is not
    routed to (the fused 3-D expert weights x (experts - per token) / experts)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = {k: v for k, v in config.items() if k not in ("architectures", "model_type")}
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **fields))
    every = sum(p.numel() for _, p in model.named_parameters(remove_duplicate=False))
    experts = sum(p.numel() for p in model.parameters() if p.dim() == 3)
    count = config.get("num_experts") or 1
    idle = experts * (count - config.get("num_experts_per_tok", count)) // count
    return every - model.get_input_embeddings().weight.numel() - idle, every


def test_qwen3_30b_a3b_counts_its_active_parameters_not_all() -> None:
    # Qwen's model card: 3.3B activated of 30.5B, both embeddings counted; the input embedding is a lookup.
    embedding = 151936 * 2048
    assert active_params(QWEN3_30B_A3B) == model_params(QWEN3_30B_A3B, active=True) - embedding
    assert abs(active_params(QWEN3_30B_A3B) + embedding - 3.3e9) / 3.3e9 < 0.02
    attention = 12 * 48 * 32 * 128 * 4096
    full = flops_per_token(QWEN3_30B_A3B, FULL, 4096)
    assert full == 6 * active_params(QWEN3_30B_A3B) + attention
    every = 6 * (model_params(QWEN3_30B_A3B) - embedding) + attention
    assert 6.5 < every / full < 7  # every expert counted: about seven times the work at 4,096 tokens
    lora = flops_per_token(QWEN3_30B_A3B, LORA, 4096, lora_r=16)
    adapters = adapter_params(QWEN3_30B_A3B, 16, None, active=True)
    assert lora == 4 * active_params(QWEN3_30B_A3B) + 6 * adapters + attention
    # Per layer: attention's adapters, and 8 of 128 experts' gate_up (2048 + 1536) and down (768 + 2048) pairs.
    attention_adapters = 16 * ((2048 + 4096) + 2 * (2048 + 512) + (4096 + 2048))
    assert adapters == 48 * (attention_adapters + 16 * 8 * ((2048 + 1536) + (768 + 2048)))


def test_the_scaled_qwen3_moe_counts_what_its_real_model_routes_a_token_through() -> None:
    real, every = real_active(SCALED, "qwen3_moe")
    # Qwen3's q and k norms (2 layers x 2 x head_dim 16) are the only parameters the count leaves out.
    assert active_params(SCALED) == real - 2 * 2 * 16
    assert real < every / 2  # 2 of 8 experts: most of the model idles for any one token
    assert flops_per_token(SCALED, FULL, 128) == 6 * active_params(SCALED) + 12 * 2 * 8 * 16 * 128


@pytest.mark.parametrize("method", [FULL, LORA], ids=str)
def test_a_dense_model_counts_every_parameter_but_the_input_embedding(method: Method) -> None:
    qwen25_05b = {
        "hidden_size": 896,
        "intermediate_size": 4864,
        "num_hidden_layers": 24,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
        "vocab_size": 151936,
        "tie_word_embeddings": True,
    }
    real, _ = real_active(qwen25_05b, "qwen2")
    assert abs(active_params(qwen25_05b) - real) / real < 0.002  # the q/k/v biases, left out
    assert active_params({**qwen25_05b, "tie_word_embeddings": False}) == active_params(qwen25_05b)
    base = 4 if method.trains_adapters else 6
    extra = 6 * adapter_params(qwen25_05b, 16, None) if method.trains_adapters else 0
    assert flops_per_token(qwen25_05b, method, 2048) == base * active_params(qwen25_05b) + extra + 12 * 24 * 896 * 2048
