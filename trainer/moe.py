"""Mixture-of-experts models on a rank: which expert weights LoRA adapts, and what an adapter covers.

transformers 5 holds a mixture of experts' weights (Qwen3-MoE, Qwen2-MoE, Mixtral, DeepSeek-V3...) as fused 3-D
parameters of one module per layer (`mlp.experts.gate_up_proj`: experts x 2 * moe_intermediate x hidden), not as one
`nn.Linear` per expert, so "every projection" finds attention only. PEFT adapts such a parameter through
`target_parameters` (its `ParamWrapper`: one rank-r pair per expert). A model that keeps one module per expert
(remote-code or older layouts: `experts.N.gate_proj`, Mixtral's `experts.N.w1`) gets its experts through
`target_modules` as a dense model's MLP does. The router (`mlp.gate`) is never a default target, as LLaMA-Factory,
axolotl and ms-swift leave it: adapting it moves the routing the experts were trained under.
"""

from __future__ import annotations

import logging
from typing import Any

from core.errors import UserError
from storage.adapters import AdapterSummary

log = logging.getLogger(__name__)


def _layer_suffix(name: str) -> str:
    """`model.layers.3.mlp.experts.gate_up_proj` -> `mlp.experts.gate_up_proj`: the name after the layer index, as
    PEFT matches target_parameters (by suffix)."""
    parts = name.split(".")
    numeric = [i for i, part in enumerate(parts) if part.isdigit()]
    return ".".join(parts[numeric[-1] + 1 :]) if numeric else name


def is_router(module_name: str) -> bool:
    """Whether a module's last name is a router's (`gate`, `router`, Qwen2-MoE's `shared_expert_gate`), not a
    projection such as `gate_proj`."""
    last = module_name.rsplit(".", 1)[-1]
    return last.endswith("gate") or "router" in last


def expert_parameters(model: Any) -> list[str]:
    """Name suffixes of the model's fused expert weights (its 3-D parameters), in the model's order; [] for a dense
    model. Under ZeRO-3 a partitioned parameter's own shape is empty: its real one is `ds_shape`."""
    found: list[str] = []
    for name, param in model.named_parameters():
        if len(getattr(param, "ds_shape", param.shape)) == 3 and (suffix := _layer_suffix(name)) not in found:
            found.append(suffix)
    return found


def lora_target_parameters(model: Any, configured: list[str] | None) -> list[str]:
    """The configured target parameters (each checked against the model), else every fused expert weight."""
    if configured is None:
        return expert_parameters(model)
    names = [name for name, _ in model.named_parameters()]
    missing = [t for t in configured if not any(n == t or n.endswith(f".{t}") for n in names)]
    if missing:
        found = expert_parameters(model)
        raise UserError(
            f"train.lora.target_parameters: {missing} not found in the model; "
            + (f"its fused expert weights are {found}" if found else "it has no fused expert weights: use []")
        )
    return list(configured)


def adapter_summary(peft_model: Any, trainable: int, total: int) -> AdapterSummary:
    """The summary of a PEFT model's one adapter (its config's targets, as PEFT resolved them: sets, so sorted)."""
    config = peft_model.peft_config["default"]
    return AdapterSummary(sorted(config.target_modules or []), sorted(config.target_parameters or []), trainable, total)
