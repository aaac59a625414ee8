"""The trainable part of the base model (trainer/model/adapters.py): LoRA adapters on the model family's projections
(or the configured ones, a missing one named), every weight for full fine-tuning, every Linear but the output layer for
a family we do not know."""

from __future__ import annotations

import pytest
import torch

from config.sections.model_train import LoraConfig, TrainConfig
from core.errors import UserError
from trainer.model import tiny
from trainer.model.adapters import LORA_TARGETS, lora_targets, make_trainable
from trainer.model.load import parameter_count


def small_model():
    return tiny.build_model(tiny.RECIPE["vocab_size"], pad_id=0, eos_id=1)


def test_lora_trains_the_adapters_of_every_projection_and_full_trains_everything() -> None:
    lora = make_trainable(small_model(), TrainConfig(method="lora"))
    trainable = {name for name, p in lora.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in name for name in trainable)
    assert {name.split(".")[-4] for name in trainable} == set(LORA_TARGETS["qwen2"])
    assert 0 < parameter_count(lora, trainable=True) < parameter_count(lora) // 5
    full = make_trainable(small_model(), TrainConfig(method="full"))
    assert parameter_count(full, trainable=True) == parameter_count(full)


def test_configured_targets_are_checked_against_the_model() -> None:
    only = make_trainable(small_model(), TrainConfig(lora=LoraConfig(target_modules=["q_proj"])))
    assert {name.split(".")[-4] for name, p in only.named_parameters() if p.requires_grad} == {"q_proj"}
    with pytest.raises(UserError, match=r"train.lora.target_modules: \['qkv'\] not found in the model; use module"):
        make_trainable(small_model(), TrainConfig(lora=LoraConfig(target_modules=["qkv"])))


def test_a_family_we_do_not_know_gets_every_linear_but_the_output_layer() -> None:
    class Unknown(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.config = type("Config", (), {"model_type": "somenet"})()
            self.attn, self.ffn, self.lm_head = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4), torch.nn.Linear(4, 8)

    assert lora_targets(Unknown(), None) == ["attn", "ffn"] and lora_targets(Unknown(), ["ffn"]) == ["ffn"]
