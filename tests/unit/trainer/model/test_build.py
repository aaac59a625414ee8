"""The model's construction (trainer/model/build.py) on the built-in tiny model: the base loaded as the choices say,
its pad id, the adapters of the method (LoRA: only the adapters train), ALST's tiled MLP with train.tiled_mlp; the
regional compile only with train.compile."""

from __future__ import annotations

import torch

from tests.specs import spec_for
from trainer.model.attention import Attention
from trainer.model.build import build_model, compile_model
from trainer.model.choices import Choices
from trainer.model.kernels import Kernels

CPU_CHOICES = Choices(Kernels.BUILTIN, Attention.SDPA, bf16=False, zero_stage=2)


def test_lora_builds_the_base_with_trainable_adapters_only(tmp_path, tiny_model) -> None:
    model, pad_id = build_model(spec_for(tmp_path, ["train.method=lora"], tiny_model), CPU_CHOICES, partitioned=False)
    trainable = [name for name, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in name for name in trainable)
    assert pad_id == model.config.pad_token_id and next(model.parameters()).dtype == torch.float32
    compile_model(model, spec_for(tmp_path, [], tiny_model))  # train.compile off: nothing compiled
    assert not any(type(m).__name__ == "OptimizedModule" for m in model.modules())


def test_full_fine_tuning_with_the_tiled_mlp_trains_every_weight(tmp_path, tiny_model) -> None:
    spec = spec_for(tmp_path, ["train.method=full", "train.tiled_mlp=true"], tiny_model)
    model, _ = build_model(spec, CPU_CHOICES, partitioned=False)
    assert all(p.requires_grad for p in model.parameters())
    mlp = model.model.layers[0].mlp
    assert mlp.forward.__func__.__name__ == "tiled_forward"  # DeepSpeed's TiledMLP bound to the dense MLP
