"""config/vision.py: a vision-language config.json's language view and vision tower size, and an image's tokens,
against transformers' own arithmetic and models."""

from __future__ import annotations

import pytest

from config.deepspeed import ModelShape
from config.footprint import model_params
from config.vision import (
    Patches,
    grid_tokens,
    image_grid,
    is_vision_language,
    language_view,
    smart_resize,
    unsupported,
    vision_parts,
)
from tests.published_vision import QWEN3_VL_4B_INSTRUCT, QWEN25_VL_3B_INSTRUCT, QWEN25_VL_7B_INSTRUCT

SIZES = [(240, 320), (32, 32), (14, 2000), (3000, 4000), (97, 1003), (28, 28), (56, 5600)]


@pytest.mark.parametrize(("height", "width"), SIZES)
@pytest.mark.parametrize(("factor", "low", "high"), [(28, 1024, 589824), (28, 3136, 12845056), (32, 65536, 16777216)])
def test_the_resize_is_transformers_own(height: int, width: int, factor: int, low: int, high: int) -> None:
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize as theirs

    assert smart_resize(height, width, factor, low, high) == theirs(height, width, factor, low, high)


def test_a_320_by_240_picture_is_99_tokens_at_the_published_pixels() -> None:
    patches = Patches.of({"patch_size": 14, "merge_size": 2, "temporal_patch_size": 2})
    grid = image_grid(240, 320, patches, 3136, 12845056)
    assert grid == (1, 18, 22) and grid_tokens(grid, patches) == 99
    assert Patches.of({}) == Patches(14, 2, 2) and Patches.of({"patch_size": 16}).factor == 32


def test_the_language_view_reads_both_layouts_as_a_causal_lm() -> None:
    flat, nested = language_view(QWEN25_VL_7B_INSTRUCT), language_view(QWEN3_VL_4B_INSTRUCT)
    assert flat is QWEN25_VL_7B_INSTRUCT  # Qwen2.5-VL publishes the language model's keys at the top
    assert (nested["hidden_size"], nested["num_hidden_layers"], nested["model_type"]) == (2560, 36, "qwen3_vl")
    assert ModelShape.of(QWEN3_VL_4B_INSTRUCT).hidden_size == 2560  # was: KeyError('hidden_size')
    assert all(is_vision_language(c) for c in (QWEN25_VL_3B_INSTRUCT, QWEN3_VL_4B_INSTRUCT))
    assert not is_vision_language({"hidden_size": 8})
    assert unsupported(QWEN25_VL_3B_INSTRUCT) is None and unsupported({"hidden_size": 8}) is None
    assert "qwen2_vl" in str(unsupported({**QWEN25_VL_3B_INSTRUCT, "model_type": "qwen2_vl"}))


@pytest.mark.parametrize("published", [QWEN25_VL_3B_INSTRUCT, QWEN3_VL_4B_INSTRUCT], ids=["qwen2.5-vl", "qwen3-vl"])
def test_the_vision_tower_and_merger_sizes_are_the_models_weights(published: dict) -> None:
    import torch
    from transformers import AutoConfig

    config = AutoConfig.for_model(**{k: v for k, v in published.items() if k not in ("architectures",)})
    with torch.device("meta"):
        from transformers import AutoModelForImageTextToText

        model = AutoModelForImageTextToText.from_config(config)
    visual = model.model.visual
    # Biases and norms are left out of the count (as config/footprint.py counts a causal LM).
    weights = {n: p.numel() for n, p in visual.named_parameters() if p.ndim > 1}
    merger = sum(v for n, v in weights.items() if n.startswith(("merger.", "deepstack_merger_list.")))
    tower, projector = vision_parts(language_view(published))
    assert (tower, projector) == (sum(weights.values()) - merger, merger)
    assert model_params(language_view(published)) > tower + projector  # the language model beside them


def test_qwen25_vl_7b_is_8_3_billion_parameters() -> None:
    total = model_params(language_view(QWEN25_VL_7B_INSTRUCT))
    assert 8.2e9 < total < 8.35e9  # 8.29B as published (biases and norms left out)
