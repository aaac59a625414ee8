"""A vision-language model's loading and trainable part (Qwen2.5-VL, Qwen3-VL): its three parts as LLaMA-Factory
names them, the vision tower (`model.visual`'s patch embedding, positions and blocks), the multi-modal projector
(`model.visual.merger`, and Qwen3-VL's `deepstack_merger_list`) and the language model (`model.language_model` and
`lm_head`), each frozen or trained as model.freeze_vision_tower, model.freeze_multi_modal_projector and
model.freeze_language_model say.

- Full fine-tuning trains every parameter of the parts that are not frozen.
- LoRA and Q-LoRA put adapters on the language model's projections (train.lora.target_modules, else q/k/v/o and
  gate/up/down), and on every linear layer of the vision tower or the projector only when that part is not frozen:
  one regular expression over the module names, so a vision block's own `gate_proj` never takes the language
  model's adapter by its name alone.
- Q-LoRA quantizes the language model alone: the vision tower and the projector stay in the compute dtype.
- A part that trains, or ZeRO-3's collective forward, needs the vision tower to run in every micro-batch on every
  rank, also in those without an image: `run_vision_always` passes a blank 2 x 2 patch image through it and adds
  its output, times zero, to the language model's input (the loss and every gradient unchanged).
"""

from __future__ import annotations

import logging
import re
from typing import Any

import torch

from config.sections.model_train import ModelConfig
from config.vision import is_vision_language

log = logging.getLogger(__name__)
VISION_TOWER = re.compile(r"(?:.*\.)?model\.visual\.(?!merger|deepstack_merger_list)")
PROJECTOR = re.compile(r"(?:.*\.)?model\.visual\.(?:merger|deepstack_merger_list)(?:\.|$)")
LANGUAGE_MODEL = re.compile(r"(?:.*\.)?(?:model\.language_model|lm_head)(?:\.|$)")
# Q-LoRA leaves these whole (bitsandbytes' modules not to convert): the vision side, and the output layer as for
# a causal LM.
NOT_QUANTIZED = ["model.visual", "lm_head"]  # bitsandbytes matches a name from its start, or as a suffix


def part_of(name: str) -> str | None:
    """Which part a parameter or module belongs to: `vision_tower`, `projector`, `language_model` (None: neither)."""
    if PROJECTOR.match(name):
        return "projector"
    if VISION_TOWER.match(name):
        return "vision_tower"
    if LANGUAGE_MODEL.match(name):
        return "language_model"
    return None


def frozen_parts(model: ModelConfig) -> set[str]:
    """The parts the model section freezes."""
    flags = {
        "vision_tower": model.freeze_vision_tower,
        "projector": model.freeze_multi_modal_projector,
        "language_model": model.freeze_language_model,
    }
    return {part for part, frozen in flags.items() if frozen}


def is_vision_model(model: Any) -> bool:
    """Whether a loaded model (or a PEFT model or engine around one) is a vision-language model."""
    inner = getattr(model, "module", model)
    config = getattr(inner, "config", None)
    return config is not None and is_vision_language(config.to_dict())


def freeze(model: Any, settings: ModelConfig) -> None:
    """Full fine-tuning: the frozen parts' parameters stop asking for gradients; says what trains."""
    frozen = frozen_parts(settings)
    counts = {"vision_tower": 0, "projector": 0, "language_model": 0}
    for name, parameter in model.named_parameters():
        part = part_of(name)
        if part in frozen:
            parameter.requires_grad_(False)
        elif part is not None:
            counts[part] += getattr(parameter, "ds_numel", parameter.numel())  # ZeRO-3's partitions counted whole
    if not any(counts.values()):
        raise_everything_frozen()
    log.info("vision-language model: trained %s", ", ".join(f"{p} {n:,}" for p, n in counts.items() if n) or "none")


def raise_everything_frozen() -> None:
    """The one line for a model section that freezes every part."""
    from core.errors import UserError

    raise UserError(
        "model.freeze_vision_tower, model.freeze_multi_modal_projector and model.freeze_language_model freeze every "
        "part of the model: nothing would train; set one of them to false"
    )


def lora_pattern(model: Any, settings: ModelConfig, names: list[str]) -> str:
    """The regular expression of the modules that get adapters (see the module's docstring): the language model's
    linear layers named in `names`, and every linear layer of an unfrozen vision tower or projector."""
    frozen = frozen_parts(settings)
    shapes: set[str] = set()
    for name, module in model.named_modules():
        part = part_of(name)
        if part is None or part in frozen or not isinstance(module, torch.nn.Linear) or name.endswith("lm_head"):
            continue
        if part == "language_model" and name.rsplit(".", 1)[-1] not in names:
            continue
        shapes.add(re.escape(re.sub(r"\.\d+\.", ".N.", name)).replace(r"\.N\.", r"\.\d+\."))
    if not shapes:
        raise_everything_frozen()
    return "^(?:" + "|".join(sorted(shapes)) + ")$"


def runtime_name(name: str) -> str:
    """A tensor's name in a vision-language checkpoint as the loaded model names it: Qwen2.5-VL publishes its vision
    tower as `visual.*` and its language model as `model.*`, which transformers loads as `model.visual.*` and
    `model.language_model.*` (Qwen3-VL's checkpoints already use these)."""
    if name.startswith("visual."):
        return "model." + name
    if name.startswith("model.") and not name.startswith(("model.language_model.", "model.visual.")):
        return "model.language_model." + name.removeprefix("model.")
    return name


def quantization_skips(config: dict[str, Any]) -> list[str] | None:
    """The modules Q-LoRA leaves in the compute dtype for a vision-language model (None for a causal LM)."""
    return NOT_QUANTIZED if is_vision_language(config) else None


def unquantized_vision(model: Any, dtype: torch.dtype) -> None:
    """Q-LoRA: the vision side back in the compute dtype (PEFT's k-bit preparation casts every unquantized weight to
    float32; the language model's norms and embeddings keep that)."""
    visual = getattr(getattr(model, "model", None), "visual", None)
    if visual is not None:
        visual.to(dtype)


def trains_vision(model: Any) -> bool:
    """Whether a parameter of the vision tower or the projector asks for a gradient."""
    return any(p.requires_grad and part_of(n) in ("vision_tower", "projector") for n, p in model.named_parameters())


def core_of(model: Any) -> Any:
    """The model that holds both towers (`Qwen2_5_VLModel`, `Qwen3VLModel`), under a PEFT wrapper or not."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    return inner.model


def language_model(model: Any) -> Any:
    """The language model of a vision-language model (its decoder layers: what ALST's tiled MLP tiles)."""
    return core_of(model).language_model


def run_vision_always(model: Any) -> None:
    """Make the vision tower run in every forward pass (see the module's docstring): where the model that holds both
    towers was called without images, a pre-hook on its language model adds the blank image's output, times zero, to
    the input embeddings. Called there, between the embedding and the language model, the tower runs where a pass
    with images runs it: ZeRO-3 gathers each module's weights as it is called (and checks that every rank calls them
    in the same order), then reduces their gradients in the order backward reaches them, the same order again."""
    core = core_of(model)
    visual = core.visual
    width = visual.config.in_channels * visual.config.temporal_patch_size * visual.config.patch_size**2
    images = {"given": False}

    def note(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        images["given"] = kwargs.get("pixel_values") is not None

    def add_blank(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        embeds = kwargs.get("inputs_embeds")
        if images["given"] or embeds is None:
            return None
        blank = torch.zeros(4, width, dtype=visual.dtype, device=embeds.device)
        features = visual(blank, grid_thw=torch.tensor([[1, 2, 2]], device=embeds.device))
        pooled = features.pooler_output if hasattr(features, "pooler_output") else features[0]
        return args, {**kwargs, "inputs_embeds": embeds + 0.0 * pooled.float().sum().to(embeds)}

    core.register_forward_pre_hook(note, with_kwargs=True)
    core.language_model.register_forward_pre_hook(add_blank, with_kwargs=True)
    log.info("vision-language model: the vision tower runs in every pass (a blank image where a batch has none)")
