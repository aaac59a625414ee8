"""Fused kernels (train.kernels): which path a run takes, resolved once, and Liger Kernel's patch of the model.

Liger Kernel (PyPI `liger-kernel`, Triton kernels) replaces a model's RMSNorm, SwiGLU MLP and rotary embedding with
fused kernels, one call per model family, and its fused linear cross-entropy takes the loss from the last hidden
states without the full-vocabulary logits (trainer/loss/liger.py). Its kernels need a CUDA device: `auto` takes them
where the device is CUDA and the package imports, the built-in path (trainer/loss/chunked.py) elsewhere; `liger`
where they cannot run stops the run with the fix. Liger's own cross-entropy patches stay off: the trainer takes the
loss itself, from the hidden states the model hands back.
"""

from __future__ import annotations

import enum
import importlib
import importlib.util
import logging
from typing import Any

import torch

from core.errors import UserError

log = logging.getLogger(__name__)

# Model types Liger patches here, and the function of liger_kernel.transformers that does it.
LIGER_PATCHES = {
    "qwen2": "apply_liger_kernel_to_qwen2",
    "qwen3": "apply_liger_kernel_to_qwen3",
    "qwen3_moe": "apply_liger_kernel_to_qwen3_moe",
    "llama": "apply_liger_kernel_to_llama",
}


class Kernels(enum.Enum):
    """The kernels a run applies: Liger's fused ones, or the built-in path."""

    LIGER = "liger"
    BUILTIN = "none"


def liger_missing(device: torch.device) -> str | None:
    """Why Liger's kernels cannot run on `device` here, or None when they can."""
    if device.type != "cuda":
        return f"its Triton kernels need a CUDA device, and this run's is {device.type}"
    if importlib.util.find_spec("liger_kernel") is None:
        return "the liger-kernel package is not installed"
    return None


def resolve(setting: str, device: torch.device) -> Kernels:
    """The kernels of train.kernels `setting` (auto, liger, none) on `device`; `liger` where it cannot run is a
    UserError."""
    if setting == "none":
        return Kernels.BUILTIN
    missing = liger_missing(device)
    if missing is None:
        return Kernels.LIGER
    if setting == "liger":
        raise UserError(
            f"train.kernels=liger cannot run: {missing}; set train.kernels to auto (Liger where it can run) or none, "
            "or run on a CUDA device with liger-kernel installed (pip install liger-kernel)"
        )
    return Kernels.BUILTIN


def patch_model(model: Any, kernels: Kernels) -> str:
    """Apply Liger's RMSNorm, SwiGLU and RoPE kernels to `model` (a transformers causal LM, before PEFT wraps it)
    when `kernels` is LIGER and its family has a patch; returns what was applied, for the run's log."""
    if kernels is Kernels.BUILTIN:
        return "built-in (train.kernels)"
    model_type = getattr(model.config, "model_type", "")
    name = LIGER_PATCHES.get(model_type)
    if name is None:
        return f"no Liger model patch for {model_type!r} models (patched: {sorted(LIGER_PATCHES)})"
    apply = getattr(importlib.import_module("liger_kernel.transformers"), name)
    # The loss stays the trainer's (trainer/loss/liger.py): Liger's own cross-entropy patches engage only when the
    # model's forward computes the loss from labels, which ours never does.
    apply(rope=True, rms_norm=True, swiglu=True, cross_entropy=False, fused_linear_cross_entropy=False, model=model)
    return f"Liger's RMSNorm, SwiGLU and RoPE kernels ({name})"


def announce(model: Any, kernels: Kernels) -> None:
    """Patch the model (patch_model) and say once what the run applied."""
    log.info("kernels: %s", patch_model(model, kernels))
