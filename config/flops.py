"""FLOPs of training on one token, as torchtitan counts them, from a model's config.json: what MFU divides by.

Full fine-tuning: 6 x N + 12 x L x H x D x T; LoRA: 4 x N + 6 x N_lora + 12 x L x H x D x T (the frozen base computes
no weight gradients). N is the parameters one token goes through, without the input embedding (a lookup) and with the
LM head (tied or not); N_lora the adapters' it goes through; L layers, H attention heads, D the head dimension, T the
sequence length. A mixture of experts counts its active parameters: of each layer's experts only the
`num_experts_per_tok` a token is routed to (and their adapters), its router and any shared expert whole, so
Qwen3-30B-A3B's N is about 3.0B, not 30.2B: counting every expert would claim ten times the weights' work.
Biases are left out (0.1% of Qwen2.5-0.5B's parameters); recomputation (activation checkpointing, the chunked
loss) is not counted, as torchtitan and the MFU figures of papers count it.
"""

from __future__ import annotations

from typing import Any

from config.footprint import adapter_params, model_params
from config.methods import Method


def active_params(model: dict[str, Any]) -> int:
    """N: the parameters a token's forward pass multiplies by (the LM head counted, the input embedding not)."""
    return model_params({**model, "tie_word_embeddings": True}, active=True)


def flops_per_token(model: dict[str, Any], method: Method, seq: int, lora_r: int = 16) -> float:
    """Training FLOPs per token (the module docstring's count); a method that trains adapters has them on every
    projection and, for a mixture of experts, every expert weight (Tandem's default targets)."""
    heads = int(model["num_attention_heads"])
    head_dim = int(model.get("head_dim") or int(model["hidden_size"]) // heads)
    attention = 12 * int(model["num_hidden_layers"]) * heads * head_dim * seq
    if not method.trains_adapters:
        return float(6 * active_params(model) + attention)
    return float(4 * active_params(model) + 6 * adapter_params(model, lora_r, None, active=True) + attention)
