"""LoRA's targets on a mixture of experts: Qwen3-30B-A3B as published, sizes scaled down (tests/published.py)."""

from __future__ import annotations

import logging

import pytest
import torch

from config.methods import FULL, LORA, QLORA
from config.sections.model_train import LoraConfig, TrainConfig
from core.errors import UserError
from trainer.model.adapters import lora_targets, make_trainable
from trainer.model.load import load_base
from trainer.parallel.moe import (
    expert_parameters,
    is_router,
    lora_target_parameters,
    per_expert_blocks,
    set_zero3_leaves,
)


def adapted(model) -> tuple[set[str], set[str]]:
    """(the modules, the parameters) a PEFT model holds adapters on, by their last names."""
    config = model.peft_config["default"]
    return set(config.target_modules or ()), set(config.target_parameters or ())


def test_lora_adapts_the_fused_experts_and_attention_by_default_never_the_router(qwen3_moe, caplog) -> None:
    caplog.set_level(logging.INFO, logger="trainer.model.adapters")
    model = make_trainable(load_base(qwen3_moe, method=LORA, bf16=False), TrainConfig(method="lora"))
    modules, parameters = adapted(model)
    assert modules == {"q_proj", "k_proj", "v_proj", "o_proj"}
    assert parameters == {"mlp.experts.gate_up_proj", "mlp.experts.down_proj"}
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    assert any(".mlp.experts.lora_A." in name for name in trainable)
    assert any(".mlp.experts.base_layer.lora_A." in name for name in trainable)  # the second fused weight, nested
    assert not any(".mlp.gate." in name for name in trainable)
    line = next(r.getMessage() for r in caplog.records if "trainable parameters of" in r.getMessage())
    assert line.startswith("lora: adapters on modules k_proj, o_proj, q_proj, v_proj; on parameters ")
    assert "parameters mlp.experts.down_proj, mlp.experts.gate_up_proj; 37,376 trainable parameters of " in line
    assert "train.lora.dropout 0.05 not applied" in caplog.text  # PEFT has no dropout for adapted parameters


def test_attention_only_is_an_explicit_choice(qwen3_moe) -> None:
    lora = LoraConfig(target_modules=["q_proj", "k_proj", "v_proj", "o_proj"], target_parameters=[])
    model = make_trainable(load_base(qwen3_moe, method=LORA, bf16=False), TrainConfig(lora=lora))
    assert adapted(model) == ({"q_proj", "k_proj", "v_proj", "o_proj"}, set())
    assert model.peft_config["default"].lora_dropout == 0.05  # dropout stays where PEFT can apply it


def test_configured_parameters_are_checked_and_the_error_names_the_experts(qwen3_moe) -> None:
    base = load_base(qwen3_moe, method=LORA, bf16=False)
    assert lora_target_parameters(base, ["mlp.experts.down_proj"]) == ["mlp.experts.down_proj"]
    with pytest.raises(
        UserError,
        match=r"train.lora.target_parameters: \['experts.w1'\] not found in the model; its "
        r"fused expert weights are \['mlp.experts.gate_up_proj', 'mlp.experts.down_proj'\]",
    ):
        lora_target_parameters(base, ["experts.w1"])


def test_a_dense_model_has_no_expert_parameters_and_a_per_expert_layout_gets_its_experts_as_modules() -> None:
    class PerExpert(torch.nn.Module):  # Mixtral's older layout: one module per expert, a Linear router `gate`
        def __init__(self) -> None:
            super().__init__()
            self.config = type("Config", (), {"model_type": "mixtral_remote"})()
            self.gate = torch.nn.Linear(8, 4)
            self.experts = torch.nn.ModuleList(torch.nn.ModuleDict({"w1": torch.nn.Linear(8, 8)}) for _ in range(4))
            self.shared_expert_gate = torch.nn.Linear(8, 1)

    model = PerExpert()
    assert expert_parameters(model) == []
    with pytest.raises(UserError, match="it has no fused expert weights: use \\[\\]"):
        lora_target_parameters(model, ["experts.gate_up_proj"])
    assert lora_targets(model, None) == ["w1"]  # the experts, never a router
    assert is_router("mlp.gate") and is_router("shared_expert_gate") and not is_router("gate_proj")


def test_qlora_on_a_mixture_of_experts_is_refused_in_one_line_saying_why(qwen3_moe) -> None:
    with pytest.raises(
        UserError,
        match=r"^train.method qlora: .* is a mixture of 8 experts whose expert weights are "
        r"fused 3-D parameters, which bitsandbytes does not quantize .*use train.method lora",
    ):
        load_base(qwen3_moe, method=QLORA, bf16=False)


def test_qlora_quantizes_the_experts_of_a_model_whose_own_code_keeps_one_linear_each(tmp_path) -> None:
    """A remote-code mixture of experts (tests/published.py per_expert_moe_scaled) keeps each expert's projections as
    Linear layers, which bitsandbytes quantizes: Q-LoRA is not refused, and the experts are 4-bit."""
    from tests.published import per_expert_moe_scaled

    model = load_base(str(per_expert_moe_scaled(tmp_path / "moe")), method=QLORA, bf16=False, trust_remote_code=True)
    experts = model.model.layers[0].mlp.experts
    assert {type(getattr(expert, name)).__name__ for expert in experts for name in ("gate_proj", "down_proj")} == {
        "Linear4bit"
    }


class SparseMoeBlock(torch.nn.Module):
    """Mixtral's older (and remote-code) layout: a router and one module per expert in a ModuleList."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = torch.nn.Linear(8, 4)
        self.experts = torch.nn.ModuleList(torch.nn.Linear(8, 8) for _ in range(4))


def test_zero3_makes_every_per_expert_block_a_leaf_module_and_leaves_fused_experts_alone(qwen3_moe) -> None:
    """DeepSpeed's own flag (deepspeed.utils.z3_leaf_module) read back on each module: set on the blocks that keep one
    module per expert under ZeRO-3 only; transformers 5's Switch Transformers (a ModuleDict of experts) is one;
    Qwen3-MoE's fused 3-D experts are gathered whole without it."""
    from deepspeed.utils import z3_leaf_module
    from transformers import SwitchTransformersConfig, SwitchTransformersForConditionalGeneration

    per_expert = torch.nn.Sequential(SparseMoeBlock(), torch.nn.Linear(8, 8), SparseMoeBlock())
    assert set_zero3_leaves(per_expert, 2) == [] and not any(z3_leaf_module(m) for m in per_expert.modules())
    assert set_zero3_leaves(per_expert, 3) == [SparseMoeBlock]
    assert [z3_leaf_module(m) for m in per_expert] == [True, False, True]
    small = {"d_model": 8, "d_ff": 16, "d_kv": 4, "num_heads": 2, "num_layers": 2, "num_decoder_layers": 2}
    switch = SwitchTransformersForConditionalGeneration(
        SwitchTransformersConfig(vocab_size=32, num_experts=2, num_sparse_encoder_layers=1, **small)
    )
    assert [c.__name__ for c in set_zero3_leaves(switch, 3)] == ["SwitchTransformersSparseMLP"]
    fused = load_base(qwen3_moe, method=FULL, bf16=False)
    assert per_expert_blocks(fused) == [] and set_zero3_leaves(fused, 3) == []
