"""DeepSpeed's JSON resolved for a run: Qwen's JSONs accepted unchanged with their "auto" values filled from `train` and
the runtime (or named when they cannot be), and ZeRO-3's limits from the model's shape: the layer size ModelShape
computes from config.json is the layer's real parameter count (a model built on the meta device, nothing allocated),
so "two layers" means two."""

from __future__ import annotations

import json

import pytest

from config.deepspeed import (
    ModelShape,
    read_deepspeed_json,
    resolve_from_model,
    resolve_from_runtime,
    resolve_from_train,
)
from config.sections.model_train import TrainConfig
from core.errors import UserError
from tests.published import QWEN3_06B, QWEN25_05B_INSTRUCT
from tests.qwen_configs import QWEN_ZERO2, QWEN_ZERO3


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


@pytest.mark.parametrize("qwen", [QWEN_ZERO2, QWEN_ZERO3], ids=["zero2", "zero3"])
def test_qwen_deepspeed_json_is_accepted_unchanged(tmp_path, qwen) -> None:
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(qwen))
    train = TrainConfig(micro_batch_size=2, gradient_accumulation_steps=8, learning_rate=3e-4, max_grad_norm=1.0)
    ds = resolve_from_train(read_deepspeed_json(str(path)), train, world_size=16)
    assert ds["train_batch_size"] == 2 * 8 * 16
    assert ds["optimizer"]["params"]["lr"] == 3e-4
    assert "scheduler" not in ds  # the schedule belongs to train.lr_scheduler
    final = resolve_from_runtime(ds, bf16=False, shape=ModelShape(64, 1000))
    assert final["bf16"]["enabled"] is False and final["fp16"]["enabled"] is False
    assert "auto" not in json.dumps(final)


def test_conflicting_explicit_batch_size_is_refused() -> None:
    ds = {"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": 2}}
    with pytest.raises(UserError, match="train_micro_batch_size_per_gpu=4 but train gives 2"):
        resolve_from_train(ds, TrainConfig(), world_size=1)


def test_unresolvable_auto_names_the_key() -> None:
    with pytest.raises(UserError, match=r"cannot resolve \"auto\" for zero_optimization.stage"):
        resolve_from_runtime({"zero_optimization": {"stage": "auto"}}, bf16=False, shape=ModelShape(8, 100))
