"""DeepSpeed's ZeRO-3 limits from the model's shape: the layer size ModelShape computes from config.json is the
layer's real parameter count (a model built on the meta device, nothing allocated), so "two layers" means two."""

from __future__ import annotations

import pytest

from config.deepspeed import ModelShape, resolve_from_model
from tests.published import QWEN3_06B, QWEN25_05B_INSTRUCT


@pytest.mark.parametrize("published", [QWEN25_05B_INSTRUCT, QWEN3_06B], ids=["qwen2.5-0.5b", "qwen3-0.6b"])
def test_the_layer_size_is_the_real_layers(published: dict) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = {k: v for k, v in published.items() if k not in ("architectures", "transformers_version", "torch_dtype")}
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**{**fields, "num_hidden_layers": 1}))
    real = sum(p.numel() for name, p in model.named_parameters() if ".layers.0." in name and not name.endswith("bias"))
    # Within 0.1%: Qwen3's per-head query and key norms (2 x 128 weights a layer) are not counted.
    assert ModelShape.of(published).layer_params == pytest.approx(real, rel=1e-3)


def test_the_limits_are_two_layers_unless_the_json_sets_them() -> None:
    shape = ModelShape.of(QWEN25_05B_INSTRUCT)
    ds = {"zero_optimization": {"stage": 3, "stage3_max_live_parameters": "auto", "stage3_max_reuse_distance": 1e9}}
    zero = resolve_from_model(ds, shape)["zero_optimization"]
    assert zero["stage3_max_live_parameters"] == 2 * shape.layer_params == 2 * 14_911_232
    assert zero["stage3_max_reuse_distance"] == 1e9  # a user's explicit value stands
