"""Vision-language model directories laid out as Qwen publishes them, with random weights: `config.json` with every key
of the published one (Qwen2.5-VL-3B/7B-Instruct: the language model's keys at the top, the vision tower's under
`vision_config`; Qwen3-VL-4B-Instruct: both nested), `preprocessor_config.json` and `chat_template.json` as
published, `generation_config.json`, bf16 weights in shards with `model.safetensors.index.json`, and the tokenizer.
The sizes are scaled down for CPU ranks (`*_SCALED`), and the token ids are the given tokenizer's (the built-in tiny
model's carries Qwen2.5's added tokens, the vision ones among them). Nothing is downloaded.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

# Qwen2.5-VL-3B-Instruct's config.json as published.
QWEN25_VL_3B_INSTRUCT: dict[str, Any] = {
    "architectures": ["Qwen2_5_VLForConditionalGeneration"],
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "vision_start_token_id": 151652,
    "vision_end_token_id": 151653,
    "vision_token_id": 151654,
    "image_token_id": 151655,
    "video_token_id": 151656,
    "hidden_act": "silu",
    "hidden_size": 2048,
    "initializer_range": 0.02,
    "intermediate_size": 11008,
    "max_position_embeddings": 128000,
    "max_window_layers": 70,
    "model_type": "qwen2_5_vl",
    "num_attention_heads": 16,
    "num_hidden_layers": 36,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "sliding_window": 32768,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.41.2",
    "use_cache": True,
    "use_sliding_window": False,
    "vision_config": {
        "depth": 32,
        "hidden_act": "silu",
        "hidden_size": 1280,
        "intermediate_size": 3420,
        "num_heads": 16,
        "in_chans": 3,
        "out_hidden_size": 2048,
        "patch_size": 14,
        "spatial_merge_size": 2,
        "spatial_patch_size": 14,
        "window_size": 112,
        "fullatt_block_indexes": [7, 15, 23, 31],
        "tokens_per_second": 2,
        "temporal_patch_size": 2,
    },
    "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
    "vocab_size": 151936,
}
# Qwen2.5-VL-7B-Instruct's differs in its sizes and in untied embeddings.
QWEN25_VL_7B_INSTRUCT: dict[str, Any] = {
    **QWEN25_VL_3B_INSTRUCT,
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "max_window_layers": 28,
    "num_attention_heads": 28,
    "num_hidden_layers": 28,
    "num_key_value_heads": 4,
    "tie_word_embeddings": False,
    "vision_config": {**QWEN25_VL_3B_INSTRUCT["vision_config"], "out_hidden_size": 3584},
    "vocab_size": 152064,
}
QWEN25_VL_PREPROCESSOR: dict[str, Any] = {
    "min_pixels": 3136,
    "max_pixels": 12845056,
    "patch_size": 14,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "image_mean": [0.48145466, 0.4578275, 0.40821073],
    "image_std": [0.26862954, 0.26130258, 0.27577711],
    "image_processor_type": "Qwen2VLImageProcessor",
    "processor_class": "Qwen2_5_VLProcessor",
}
# Qwen2-VL's and Qwen2.5-VL's chat template (their chat_template.json and tokenizer_config.json).
QWEN2_VL_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "{% endif %}<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}{{ message['content'] }}"
    "<|im_end|>\n{% else %}{% for content in message['content'] %}{% if content['type'] == 'image' or 'image' in "
    "content or 'image_url' in content %}{% set image_count.value = image_count.value + 1 %}{% if add_vision_id %}"
    "Picture {{ image_count.value }}: {% endif %}<|vision_start|><|image_pad|><|vision_end|>{% elif content['type'] "
    "== 'video' or 'video' in content %}{% set video_count.value = video_count.value + 1 %}{% if add_vision_id %}"
    "Video {{ video_count.value }}: {% endif %}<|vision_start|><|video_pad|><|vision_end|>{% elif 'text' in content %}"
    "{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n{% endif %}{% endfor %}{% if add_generation_prompt %}"
    "<|im_start|>assistant\n{% endif %}"
)
QWEN25_VL_GENERATION: dict[str, Any] = {
    "bos_token_id": 151643,
    "pad_token_id": 151643,
    "do_sample": True,
    "eos_token_id": [151645, 151643],
    "repetition_penalty": 1.05,
    "temperature": 1e-06,
    "transformers_version": "4.49.0",
}
# Its sizes scaled down for CPU ranks: the language model as the built-in tiny model's (head_dim 64: mrope_section
# sums to 32), a vision tower of 2 blocks 64 wide (its second full-attention), every other key as published.
QWEN25_VL_SCALED: dict[str, Any] = {
    "hidden_size": 128,
    "intermediate_size": 384,
    "max_position_embeddings": 4096,
    "max_window_layers": 2,
    "num_attention_heads": 2,
    "num_hidden_layers": 2,
    "num_key_value_heads": 1,
    "sliding_window": 4096,
    "rope_scaling": {"type": "mrope", "mrope_section": [8, 12, 12]},
}
VISION_SCALED: dict[str, Any] = {"depth": 2, "hidden_size": 64, "intermediate_size": 128, "num_heads": 2}

# Qwen3-VL-4B-Instruct's config.json as published.
QWEN3_VL_4B_INSTRUCT: dict[str, Any] = {
    "architectures": ["Qwen3VLForConditionalGeneration"],
    "image_token_id": 151655,
    "model_type": "qwen3_vl",
    "text_config": {
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 151643,
        "dtype": "bfloat16",
        "eos_token_id": 151645,
        "head_dim": 128,
        "hidden_act": "silu",
        "hidden_size": 2560,
        "initializer_range": 0.02,
        "intermediate_size": 9728,
        "max_position_embeddings": 262144,
        "model_type": "qwen3_vl_text",
        "num_attention_heads": 32,
        "num_hidden_layers": 36,
        "num_key_value_heads": 8,
        "rms_norm_eps": 1e-06,
        "rope_scaling": {"mrope_interleaved": True, "mrope_section": [24, 20, 20], "rope_type": "default"},
        "rope_theta": 5000000,
        "tie_word_embeddings": True,
        "use_cache": True,
        "vocab_size": 151936,
    },
    "tie_word_embeddings": True,
    "transformers_version": "4.57.0.dev0",
    "video_token_id": 151656,
    "vision_config": {
        "deepstack_visual_indexes": [5, 11, 17],
        "depth": 24,
        "hidden_act": "gelu_pytorch_tanh",
        "hidden_size": 1024,
        "in_channels": 3,
        "initializer_range": 0.02,
        "intermediate_size": 4096,
        "model_type": "qwen3_vl",
        "num_heads": 16,
        "num_position_embeddings": 2304,
        "out_hidden_size": 2560,
        "patch_size": 16,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
    },
    "vision_end_token_id": 151653,
    "vision_start_token_id": 151652,
}
QWEN3_VL_PREPROCESSOR: dict[str, Any] = {
    "size": {"longest_edge": 16777216, "shortest_edge": 65536},
    "patch_size": 16,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
    "processor_class": "Qwen3VLProcessor",
    "image_processor_type": "Qwen2VLImageProcessorFast",
}
QWEN3_VL_TEXT_SCALED: dict[str, Any] = {
    "head_dim": 64,
    "hidden_size": 128,
    "intermediate_size": 384,
    "max_position_embeddings": 4096,
    "num_attention_heads": 2,
    "num_hidden_layers": 2,
    "num_key_value_heads": 1,
    "rope_scaling": {"mrope_interleaved": True, "mrope_section": [12, 10, 10], "rope_type": "default"},
}
QWEN3_VISION_SCALED: dict[str, Any] = {**VISION_SCALED, "deepstack_visual_indexes": [1], "num_position_embeddings": 256}


def token_ids(tokenizer: Any) -> dict[str, int]:
    """The tokenizer's ids for the published config's token keys."""
    names = {
        "bos_token_id": "<|endoftext|>",
        "eos_token_id": "<|im_end|>",
        "vision_start_token_id": "<|vision_start|>",
        "vision_end_token_id": "<|vision_end|>",
        "vision_token_id": "<|vision_pad|>",
        "image_token_id": "<|image_pad|>",
        "video_token_id": "<|video_pad|>",
    }
    return {key: int(tokenizer.convert_tokens_to_ids(token)) for key, token in names.items()}


def scaled_config(
    published: dict[str, Any], tokenizer: Any, vision_scale: dict[str, Any] | None = None
) -> dict[str, Any]:
    """A published config with its sizes scaled down (the vision tower's to `vision_scale` when given) and its token
    ids and vocabulary the tokenizer's."""
    vision_scale = vision_scale or {}
    ids, vocab = token_ids(tokenizer), max(len(tokenizer), 128)
    config = copy.deepcopy(published)
    if "text_config" in config:  # Qwen3-VL: the language model's keys nested
        text = {**config["text_config"], **QWEN3_VL_TEXT_SCALED, "vocab_size": vocab}
        text.update({k: ids[k] for k in ("bos_token_id", "eos_token_id")})
        vision = {
            **config["vision_config"],
            **QWEN3_VISION_SCALED,
            **vision_scale,
            "out_hidden_size": text["hidden_size"],
        }
        top = {k: ids[k] for k in ids if k in config}
        return {**config, **top, "text_config": text, "vision_config": vision}
    vision = {**config["vision_config"], **VISION_SCALED, "fullatt_block_indexes": [1], **vision_scale}
    vision["out_hidden_size"] = QWEN25_VL_SCALED["hidden_size"]
    return {**config, **QWEN25_VL_SCALED, **ids, "vocab_size": vocab, "vision_config": vision}


def write_vision_published(
    out: Path,
    tokenizer_dir: Path,
    published: dict[str, Any] = QWEN25_VL_3B_INSTRUCT,
    *,
    max_shard_size: str = "300KB",
    seed: int = 0,
    vision_scale: dict[str, Any] | None = None,
) -> Path:
    """A vision-language model directory at `out` as published (see the module docstring), its tokenizer the one in
    `tokenizer_dir` with the VL chat template; `vision_scale` replaces the scaled vision tower's sizes (a benchmark's
    larger one)."""
    import torch
    from transformers import AutoConfig, AutoModelForImageTextToText, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    config = scaled_config(published, tokenizer, vision_scale)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    torch.manual_seed(seed)
    model = AutoModelForImageTextToText.from_config(AutoConfig.from_pretrained(out), dtype=torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True, max_shard_size=max_shard_size)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    qwen3 = "text_config" in config
    preprocessor = QWEN3_VL_PREPROCESSOR if qwen3 else QWEN25_VL_PREPROCESSOR
    (out / "preprocessor_config.json").write_text(json.dumps(preprocessor, indent=2) + "\n")
    (out / "chat_template.json").write_text(json.dumps({"chat_template": QWEN2_VL_TEMPLATE}, indent=2) + "\n")
    ids = token_ids(tokenizer)
    generation = {**QWEN25_VL_GENERATION, "bos_token_id": ids["bos_token_id"], "pad_token_id": tokenizer.pad_token_id}
    generation["eos_token_id"] = [ids["eos_token_id"], ids["bos_token_id"]]
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    tokenizer.chat_template = QWEN2_VL_TEMPLATE
    tokenizer.save_pretrained(out)
    return out
