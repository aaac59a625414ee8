"""The trainable part of a loaded base (train.method): every weight (full), or LoRA adapters on the family's
projections (LoRA, and Q-LoRA on the 4-bit base, prepared for k-bit training), gradient checkpointing on request; a
mixture of experts' fused expert weights through PEFT's `target_parameters` (trainer/parallel/moe.py)."""

from __future__ import annotations

import logging
from typing import Any

import torch

from config.sections.model_train import ModelConfig, TrainConfig
from core.errors import UserError
from trainer.model.load import parameter_count
from trainer.model.vision import freeze, is_vision_model, lora_pattern, unquantized_vision
from trainer.parallel.moe import adapter_summary, is_router, lora_target_parameters

log = logging.getLogger(__name__)
_PROJECTIONS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
# Every attention and MLP projection, as Qwen's and LLaMA-Factory's "all" targets do.
LORA_TARGETS = {
    "qwen2": _PROJECTIONS,
    "qwen3": _PROJECTIONS,
    "qwen2_moe": _PROJECTIONS,
    "qwen2_5_vl": _PROJECTIONS,  # the language model's; trainer/model/vision.py keeps them off the vision tower
    "qwen3_vl": _PROJECTIONS,
    "llama": _PROJECTIONS,
    "mistral": _PROJECTIONS,
    "gemma": _PROJECTIONS,
    "gemma2": _PROJECTIONS,
    "qwen": ["c_attn", "c_proj", "w1", "w2"],  # Qwen-1 (trust_remote_code), as in Qwen's finetune.py
    "gpt2": ["c_attn", "c_proj", "c_fc"],
}


def lora_targets(model: Any, configured: list[str] | None) -> list[str]:
    """The configured target modules, else the model family's default, else every Linear but lm_head and a router."""
    if configured:
        return list(configured)
    model_type = getattr(model.config, "model_type", "")
    if model_type in LORA_TARGETS:
        return LORA_TARGETS[model_type]
    names = {name.rsplit(".", 1)[-1] for name, module in model.named_modules() if isinstance(module, torch.nn.Linear)}
    return sorted(name for name in names - {"lm_head"} if not is_router(name))


def make_trainable(model: Any, train: TrainConfig, settings: ModelConfig | None = None) -> Any:
    """Wrap the base for the chosen method; returns the model whose trainable params DeepSpeed optimizes. A
    vision-language model's parts train as `settings` (the model section) freeze them (trainer/model/vision.py)."""
    if train.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.config.use_cache = False
    vision = settings if settings is not None and is_vision_model(model) else None
    if not train.method.trains_adapters:
        if vision is not None:
            freeze(model, vision)
        return model
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training

    if train.method.quantizes_base:
        dtype = next(p.dtype for p in model.parameters() if p.is_floating_point())
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=train.gradient_checkpointing)
        if vision is not None:
            unquantized_vision(model, dtype)
    targets = lora_targets(model, train.lora.target_modules)
    missing = [m for m in targets if not any(n.endswith(m) for n, _ in model.named_modules())]
    if missing:
        raise UserError(
            f"train.lora.target_modules: {missing} not found in the model; use module names such as q_proj, v_proj"
        )
    parameters = lora_target_parameters(model, train.lora.target_parameters)
    dropout = train.lora.dropout
    if parameters and dropout > 0:
        # PEFT's ParamWrapper adds B @ A to the weight itself, so no dropout can sit on its input.
        log.info("train.lora.dropout %g not applied: PEFT has no dropout on adapted parameters %s", dropout, parameters)
        dropout = 0.0
    config = LoraConfig(
        r=train.lora.r,
        lora_alpha=train.lora.alpha,
        lora_dropout=dropout,
        target_modules=lora_pattern(model, vision, targets) if vision is not None else targets,
        target_parameters=parameters or None,
        task_type="CAUSAL_LM",
    )
    peft_model = get_peft_model(model, config)
    summary = adapter_summary(peft_model, parameter_count(peft_model, trainable=True), parameter_count(peft_model))
    log.info("%s: %s", train.method, summary.describe())
    return peft_model
