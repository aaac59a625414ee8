"""Mixture-of-experts models on a rank: which expert weights LoRA adapts, what an adapter covers, and the router's
load balance while training (its auxiliary loss and the experts' load).

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
from dataclasses import dataclass, field
from typing import Any

import torch

from core.errors import UserError
from storage.adapters import AdapterSummary
from trainer.parallel.distributed import Dist, dist_sum

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


def refuse_qlora(model_path: str, config: dict[str, Any]) -> None:
    """Q-LoRA on a mixture of experts stops with one line: bitsandbytes quantizes Linear layers only, so the fused
    expert weights, nearly all of the model, would stay in full precision while the run claims 4-bit."""
    experts = config.get("num_experts") or config.get("num_local_experts")
    if experts:
        raise UserError(
            f"train.method qlora: {model_path} is a mixture of {experts} experts whose expert weights are fused 3-D "
            "parameters, which bitsandbytes does not quantize (Linear layers only), so 4-bit would leave nearly all "
            "of the model in full precision; use train.method lora (with ZeRO-3 to shard the experts)"
        )


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
    modules = config.target_modules or []
    # A regular expression (a vision-language model's targets: trainer/model/vision.py) is one entry, not a set.
    modules = [modules] if isinstance(modules, str) else sorted(modules)
    return AdapterSummary(modules, sorted(config.target_parameters or []), trainable, total)


@dataclass
class RouterBalance:
    """A mixture of experts' router while training: its load-balancing loss (the model's own, transformers'
    `load_balancing_loss_func` over every layer's router logits: Switch Transformer's experts x sum of token share x
    router probability) weighted by `coef`, and the tokens each expert of each layer received this step (padding left
    out), summed over the ranks at the step's end, so a collapsing router shows in metrics.jsonl."""

    coef: float
    experts: int
    top_k: int
    dist: Dist
    counts: torch.Tensor | None = None  # this step's tokens per (layer, expert) on this rank
    forward_kwargs: dict[str, Any] = field(default_factory=lambda: {"output_router_logits": True})

    @classmethod
    def of(cls, model_config: Any, configured: float | None, dist: Dist) -> RouterBalance | None:
        """The router's balance for a mixture of experts (`router_aux_loss_coef` in its config), None for a dense
        model; `configured` (train.moe.aux_loss_coef) replaces the config's coefficient when set."""
        experts = getattr(model_config, "num_experts", None) or getattr(model_config, "num_local_experts", None)
        if not experts or not hasattr(model_config, "router_aux_loss_coef"):
            return None
        coef = float(model_config.router_aux_loss_coef if configured is None else configured)
        top_k = int(model_config.num_experts_per_tok)
        log.info(
            "mixture of experts (%d experts, %d per token): load-balancing loss weighted %g (%s)",
            experts,
            top_k,
            coef,
            "train.moe.aux_loss_coef" if configured is not None else "the model config's router_aux_loss_coef",
        )
        return cls(coef, int(experts), top_k, dist)

    def observe(self, out: Any, attention_mask: torch.Tensor) -> torch.Tensor:
        """Count the micro-batch's routed tokens per layer and expert; its load-balancing loss (unweighted)."""
        with torch.no_grad():
            real = attention_mask.reshape(-1).bool().to(out.router_logits[0].device)
            layers = [
                torch.bincount(logits.topk(self.top_k, dim=-1).indices[real].reshape(-1), minlength=self.experts)
                for logits in out.router_logits
            ]
            counts = torch.stack(layers).double()
            self.counts = counts if self.counts is None else self.counts + counts
        return out.aux_loss

    def end_step(self) -> dict[str, float]:
        """The step's expert load over every rank: the busiest expert's tokens over the mean, in the worst layer
        (1.0 is even), and how many (layer, expert) pairs got no token. A collective: every rank calls it."""
        assert self.counts is not None, "observe runs before end_step"
        shape = self.counts.shape
        counts = torch.tensor(dist_sum(self.counts.flatten().tolist(), self.dist)).reshape(shape)
        self.counts = None
        mean = counts.mean(dim=1).clamp(min=1.0)
        return {
            "expert_load_max": float((counts.max(dim=1).values / mean).max()),
            "experts_idle": float((counts == 0).sum()),
        }


def per_expert_blocks(model: Any) -> list[type]:
    """The classes of the mixture-of-experts blocks that keep one module per expert (`experts` a ModuleList, as
    remote-code and older Qwen2-MoE and Mixtral layouts have it, or a ModuleDict, as transformers 5's Switch
    Transformers and NLLB-MoE do), in the model's order; [] for fused 3-D experts (one parameter per weight, gathered
    whole: every causal-LM family of transformers 5) and for a dense model."""
    classes: list[type] = []
    per_expert = (torch.nn.ModuleList, torch.nn.ModuleDict)
    for module in model.modules():
        if isinstance(getattr(module, "experts", None), per_expert) and type(module) not in classes:
            classes.append(type(module))
    return classes


def set_zero3_leaves(model: Any, stage: int) -> list[type]:
    """Under ZeRO-3 (`stage` 3), make every per-expert block a DeepSpeed leaf module (before deepspeed.initialize):
    its parameters are gathered whole when the block runs. Otherwise ZeRO-3 fetches an expert's weights when a token
    reaches it, and ranks routing to different experts wait on all-gathers the others never join: a hang. The
    classes set ([] where none is needed)."""
    classes = per_expert_blocks(model) if stage == 3 else []
    if classes:
        from deepspeed.utils import set_z3_leaf_modules

        set_z3_leaf_modules(model, classes)
        log.info("ZeRO-3 leaf modules (every expert gathered at once): %s", ", ".join(c.__name__ for c in classes))
    return classes
