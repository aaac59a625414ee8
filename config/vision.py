"""Vision-language models as every layer knows them, without torch: whether a model's config.json is one, the
language model's view of it (the keys every other formula reads), its vision tower's size, and how many tokens an
image becomes (Qwen's processor: the image resized to a multiple of patch x merge pixels within the min and max
pixels, one token per merge x merge patches).

Qwen2.5-VL publishes the language model's keys at the top of config.json and the vision tower's under
`vision_config`; Qwen3-VL (and transformers 5's own `to_dict`) puts the language model's under `text_config`.
`language_view` gives both as one flat dict, so config/deepspeed.py, config/footprint.py and config/memory_plan.py
read a vision-language model as they read a causal LM; `vision_params` adds the tower and its merger.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

VISION_CONFIG = "vision_config"
# The model types whose images Tandem stages and trains: their processors expand an image into
# grid_t x grid_h x grid_w / merge^2 `<|image_pad|>` tokens between `<|vision_start|>` and `<|vision_end|>`.
VISION_MODEL_TYPES = ("qwen2_5_vl", "qwen3_vl")
# The processor's files a model directory ships beside the tokenizer's (loaded by AutoImageProcessor, carried into
# the export); `preprocessor_config.json` is the one a vision-language model cannot do without.
PREPROCESSOR_CONFIG = "preprocessor_config.json"
PROCESSOR_TEMPLATE = "chat_template.json"  # the processor's chat template ({"chat_template": text})
PROCESSOR_FILES = (PREPROCESSOR_CONFIG, PROCESSOR_TEMPLATE, "video_preprocessor_config.json", "processor_config.json")
IMAGE_PLACEHOLDER = "<image>"  # LLaMA-Factory's placeholder for one image in a turn's text
MAX_ASPECT_RATIO = 200  # Qwen's processor refuses an image whose long side is more than 200 times its short side


def is_vision_language(config: dict[str, Any]) -> bool:
    """Whether a config.json describes a vision-language model (a `vision_config` beside the language model)."""
    return isinstance(config.get(VISION_CONFIG), dict)


def language_view(config: dict[str, Any]) -> dict[str, Any]:
    """The config with the language model's keys at the top (a `text_config`'s over the top level's, the model's own
    `model_type` kept): what the formulas of a causal LM read. A causal LM's config.json is returned as it is."""
    text = config.get("text_config")
    if not isinstance(text, dict):
        return config
    return {**config, **text, "model_type": config.get("model_type", text.get("model_type"))}


def unsupported(config: dict[str, Any]) -> str | None:
    """Why a vision-language config.json is not one Tandem trains (None when it is, or when it is a causal LM)."""
    if not is_vision_language(config):
        return None
    kind = config.get("model_type")
    if kind in VISION_MODEL_TYPES:
        return None
    trained = ", ".join(VISION_MODEL_TYPES)
    return f"model type {kind!r} is a vision-language model Tandem does not train; it trains {trained}"


def vision_params(config: dict[str, Any]) -> int:
    """Parameters of the vision tower and its merger(s) (biases and norms left out, as config/footprint.py counts);
    0 for a causal LM."""
    tower, projector = vision_parts(config)
    return tower + projector


def vision_parts(config: dict[str, Any]) -> tuple[int, int]:
    """(vision tower, projector) parameters: the patch embedding, positions and blocks; the merger(s)."""
    if not is_vision_language(config):
        return 0, 0
    vision = config[VISION_CONFIG]
    hidden, depth = int(vision["hidden_size"]), int(vision["depth"])
    patch, temporal = int(vision.get("patch_size", 14)), int(vision.get("temporal_patch_size", 2))
    inter = int(vision.get("intermediate_size") or 4 * hidden)
    merged = hidden * int(vision.get("spatial_merge_size", 2)) ** 2
    out = int(vision.get("out_hidden_size") or language_view(config)["hidden_size"])
    qwen3 = config.get("model_type") == "qwen3_vl"
    mlp = (2 if qwen3 else 3) * hidden * inter  # Qwen3-VL's vision MLP is fc1/fc2, Qwen2.5-VL's gated
    block = 4 * hidden * hidden + mlp  # qkv and the output projection, then the MLP
    mergers = 1 + (len(vision.get("deepstack_visual_indexes") or []) if qwen3 else 0)
    positions = int(vision.get("num_position_embeddings") or 0) * hidden if qwen3 else 0
    tower = 3 * temporal * patch * patch * hidden + positions + depth * block
    return tower, mergers * (merged * merged + merged * out)


def frozen_params(config: dict[str, Any], frozen: tuple[bool, bool]) -> int:
    """Parameters full fine-tuning leaves untrained: the vision tower and the projector as `frozen` says
    (model.freeze_vision_tower, model.freeze_multi_modal_projector)."""
    tower, projector = vision_parts(config)
    return tower * frozen[0] + projector * frozen[1]


def vision_activation_bytes(config: dict[str, Any], w: int) -> int:
    """Bytes one vision block keeps for backward per patch (as a decoder layer's: norms, q/k/v, the attention output
    and the projection's input, the MLP's intermediates), times the blocks; 0 for a causal LM."""
    if not is_vision_language(config):
        return 0
    vision = config[VISION_CONFIG]
    hidden, depth = int(vision["hidden_size"]), int(vision["depth"])
    inter = int(vision.get("intermediate_size") or 4 * hidden)
    gated = config.get("model_type") != "qwen3_vl"
    per_block = 2 * (4 * hidden + 2 * w * hidden) + w * 5 * hidden + w * (4 if gated else 2) * inter
    return depth * per_block


@dataclass(frozen=True)
class Patches:
    """How a model's image processor cuts an image (its preprocessor_config.json): `patch` pixels a side per patch,
    `merge` x `merge` patches per token, `temporal` frames per patch (an image is repeated to fill them)."""

    patch: int = 14
    merge: int = 2
    temporal: int = 2

    @classmethod
    def of(cls, preprocessor: dict[str, Any]) -> Patches:
        """From a preprocessor_config.json's keys (Qwen's defaults where one is absent)."""
        return cls(
            int(preprocessor.get("patch_size") or 14),
            int(preprocessor.get("merge_size") or 2),
            int(preprocessor.get("temporal_patch_size") or 2),
        )

    @property
    def factor(self) -> int:
        """The side an image is resized to a multiple of: one token's pixels."""
        return self.patch * self.merge


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """(height, width) Qwen's image processor resizes an image to: multiples of `factor`, between `min_pixels` and
    `max_pixels` pixels, the aspect ratio kept as closely as that allows (transformers' `smart_resize`, the same
    arithmetic). The caller has refused an aspect ratio beyond MAX_ASPECT_RATIO."""
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def image_grid(height: int, width: int, patches: Patches, min_pixels: int, max_pixels: int) -> tuple[int, int, int]:
    """The (t, h, w) grid of patches the processor gives an image (its `image_grid_thw`): one temporal patch."""
    resized_h, resized_w = smart_resize(height, width, patches.factor, min_pixels, max_pixels)
    return 1, resized_h // patches.patch, resized_w // patches.patch


def grid_tokens(grid: tuple[int, int, int], patches: Patches) -> int:
    """The `<|image_pad|>` tokens an image of this grid is expanded to (grid_t x grid_h x grid_w / merge^2)."""
    t, h, w = grid
    return t * h * w // (patches.merge * patches.merge)
