"""trainer/model/vision.py: a vision-language model's three parts frozen or trained as LLaMA-Factory's switches say, its
LoRA targets on the language model's projections (never a vision block's own gate_proj by name), Q-LoRA leaving the
vision side whole, and the vision tower run in a pass without images without changing the loss."""

from __future__ import annotations

import pytest
import torch

from config.methods import FULL, LORA, QLORA
from config.sections.model_train import ModelConfig, TrainConfig
from core.errors import UserError
from trainer.model.adapters import make_trainable
from trainer.model.load import load_base
from trainer.model.vision import part_of, run_vision_always, runtime_name, trains_vision


def trained_parts(model: torch.nn.Module) -> set[str | None]:
    return {part_of(n.replace("base_model.model.", "")) for n, p in model.named_parameters() if p.requires_grad}


def test_every_parameter_belongs_to_one_part(qwen3_vl: str) -> None:
    base = load_base(qwen3_vl, method=FULL, bf16=False)
    parts = {name: part_of(name) for name, _ in base.named_parameters()}
    assert None not in parts.values()
    assert parts["model.visual.deepstack_merger_list.0.linear_fc1.weight"] == "projector"
    assert parts["model.visual.merger.linear_fc2.weight"] == "projector"
    assert (
        parts["model.visual.pos_embed.weight"] == parts["model.visual.blocks.1.mlp.linear_fc1.weight"] == "vision_tower"
    )
    assert parts["model.language_model.embed_tokens.weight"] == "language_model"


def test_lora_adapts_the_language_models_projections_only_by_default(qwen25_vl: str) -> None:
    model = make_trainable(load_base(qwen25_vl, method=LORA, bf16=False), TrainConfig(method="lora"), ModelConfig())
    adapted = {n.split(".lora_A")[0] for n, _ in model.named_parameters() if ".lora_A." in n}
    assert adapted and all(".language_model.layers." in n for n in adapted)
    assert {n.rsplit(".", 1)[-1] for n in adapted} == {
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        "gate_proj",
        "up_proj",
        "down_proj",
    }
    assert not trains_vision(model) and trained_parts(model) == {"language_model"}
    named = make_trainable(
        load_base(qwen25_vl, method=LORA, bf16=False),
        TrainConfig(method="lora", lora={"target_modules": ["q_proj", "v_proj"]}),
        ModelConfig(),
    )
    assert {n.split(".lora_A")[0].rsplit(".", 1)[-1] for n, _ in named.named_parameters() if ".lora_A." in n} == {
        "q_proj",
        "v_proj",
    }


def test_unfrozen_vision_parts_get_adapters_and_an_all_frozen_model_is_refused(qwen25_vl: str) -> None:
    settings = ModelConfig(freeze_vision_tower=False, freeze_multi_modal_projector=False, freeze_language_model=True)
    model = make_trainable(load_base(qwen25_vl, method=LORA, bf16=False), TrainConfig(method="lora"), settings)
    adapted = {n.split(".lora_A")[0] for n, _ in model.named_parameters() if ".lora_A." in n}
    assert any(".visual.blocks.0.mlp.gate_proj" in n for n in adapted)  # the vision block's own gate_proj
    assert any(".visual.merger.mlp.0" in n for n in adapted) and not any("language_model" in n for n in adapted)
    frozen = ModelConfig(freeze_language_model=True)
    with pytest.raises(UserError, match="freeze every part of the model: nothing would train"):
        make_trainable(load_base(qwen25_vl, method=LORA, bf16=False), TrainConfig(method="lora"), frozen)


@pytest.mark.parametrize(
    ("settings", "parts"),
    [
        ({}, {"language_model"}),
        ({"freeze_vision_tower": False}, {"language_model", "vision_tower"}),
        ({"freeze_language_model": True, "freeze_multi_modal_projector": False}, {"projector"}),
    ],
)
def test_full_fine_tuning_trains_the_parts_not_frozen(qwen25_vl: str, settings: dict, parts: set) -> None:
    model = make_trainable(
        load_base(qwen25_vl, method=FULL, bf16=False), TrainConfig(method="full"), ModelConfig(**settings)
    )
    assert trained_parts(model) == parts


def test_qlora_quantizes_the_language_model_and_keeps_the_vision_side_whole(qwen25_vl: str) -> None:
    pytest.importorskip("bitsandbytes")
    model = make_trainable(load_base(qwen25_vl, method=QLORA, bf16=False), TrainConfig(method="qlora"), ModelConfig())
    kinds = {name: type(module).__name__ for name, module in model.named_modules()}
    assert kinds["base_model.model.model.language_model.layers.0.self_attn.q_proj.base_layer"] == "Linear4bit"
    assert kinds["base_model.model.model.visual.blocks.0.attn.qkv"] == "Linear"
    assert kinds["base_model.model.model.visual.merger.mlp.0"] == "Linear"
    assert trained_parts(model) == {"language_model"}


def test_a_pass_without_images_runs_the_vision_tower_and_keeps_its_loss(qwen25_vl: str) -> None:
    model = make_trainable(
        load_base(qwen25_vl, method=FULL, bf16=False),
        TrainConfig(method="full"),
        ModelConfig(freeze_vision_tower=False),
    )
    ids = torch.tensor([[5, 6, 7, 8, 9, 10]])
    before = model(input_ids=ids, labels=ids, use_cache=False).loss
    calls = []
    model.model.visual.register_forward_hook(lambda *_: calls.append(1))
    run_vision_always(model)
    out = model(input_ids=ids, labels=ids, use_cache=False)
    assert calls == [1] and torch.equal(out.loss, before)
    out.loss.backward()
    grads = [p.grad for n, p in model.named_parameters() if n.startswith("model.visual.blocks.0.")]
    assert grads and all(g is not None and not g.any() for g in grads)  # reached, and zero


def test_a_published_qwen25_vl_checkpoints_names_are_the_loaded_models() -> None:
    assert runtime_name("visual.blocks.0.attn.qkv.weight") == "model.visual.blocks.0.attn.qkv.weight"
    assert runtime_name("model.layers.0.mlp.up_proj.weight") == "model.language_model.layers.0.mlp.up_proj.weight"
    assert runtime_name("model.language_model.norm.weight") == "model.language_model.norm.weight"  # Qwen3-VL's
    assert runtime_name("lm_head.weight") == "lm_head.weight"
