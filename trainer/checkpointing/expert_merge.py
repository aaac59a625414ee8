"""LoRA on a mixture of experts' fused weights merged into a base stored as published: one tensor per expert.

PEFT adapts a fused 3-D expert weight (`mlp.experts.gate_up_proj`: experts x out x in) with one `ParamWrapper`, its
`lora_A` (rank * experts, in) and `lora_B` (out, rank * experts); two adapted weights of one module nest, so the
adapter names them `mlp.experts.lora_A` and `mlp.experts.base_layer.lora_A`. The published checkpoint (what
`save_pretrained` writes, and what the merge reads one shard at a time) holds `mlp.experts.{e}.gate_proj.weight`,
`up_proj` and `down_proj` instead: expert e's delta is `scale * B_e @ A_e`, with A_e the rows e*r .. e*r+r-1 of A and
B_e the columns e, e+E, e+2E... of B (PEFT's layout), and the fused gate_up delta's first half is gate_proj's.
Which wrapper is which follows from the shapes alone: gate_up is (2 * moe_intermediate, hidden) and down_proj
(hidden, moe_intermediate), never equal.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch

# A published per-expert weight: `model.layers.0.mlp.experts.5.gate_proj.weight`.
EXPERT_WEIGHT = re.compile(r"^(?P<owner>.+)\.(?P<expert>\d+)\.(?P<proj>gate_proj|up_proj|down_proj)\.weight$")


@dataclass(frozen=True)
class ExpertDelta:
    """One adapted fused expert weight: its LoRA pair and scale, over `experts` experts."""

    a: torch.Tensor
    b: torch.Tensor
    scale: float
    experts: int

    @property
    def shape(self) -> tuple[int, int]:
        """(out, in) of one expert's weight."""
        return int(self.b.shape[0]), int(self.a.shape[1])

    def delta(self, expert: int) -> torch.Tensor:
        """Expert `expert`'s weight delta (out, in), in float32."""
        rank = self.a.shape[0] // self.experts
        a = self.a[expert * rank : (expert + 1) * rank].float()
        return self.scale * (self.b[:, expert :: self.experts].float() @ a)


def split_expert_pairs(
    pairs: dict[str, tuple[torch.Tensor, torch.Tensor, float]], rank: int
) -> dict[str, list[ExpertDelta]]:
    """Take the fused expert pairs out of `pairs` (an adapter's {module: (A, B, scale)}; A has rank * experts rows
    there, rank for a plain module), as {experts module: its adapted weights}."""
    experts: dict[str, list[ExpertDelta]] = {}
    for module in [m for m, (a, _, _) in pairs.items() if a.shape[0] != rank]:
        a, b, scale = pairs.pop(module)
        owner = module.replace(".base_layer", "")
        experts.setdefault(owner, []).append(ExpertDelta(a, b, scale, a.shape[0] // rank))
    return experts


def _find(deltas: list[ExpertDelta], shape: tuple[int, int]) -> ExpertDelta | None:
    return next((d for d in deltas if d.shape == shape), None)


def merge_expert_weight(
    name: str, weight: torch.Tensor, experts: dict[str, list[ExpertDelta]]
) -> tuple[str, torch.Tensor] | None:
    """(the experts module, weight + its delta in float32) for a base tensor an expert adapter covers: a published
    per-expert weight, or a fused 3-D one; None otherwise."""
    match = EXPERT_WEIGHT.match(name)
    if match and match["owner"] in experts:
        out, into = weight.shape
        index, proj = int(match["expert"]), match["proj"]
        if proj == "down_proj":
            found = _find(experts[match["owner"]], (out, into))
            return None if found is None else (match["owner"], weight.float() + found.delta(index))
        found = _find(experts[match["owner"]], (2 * out, into))
        if found is None:
            return None
        half = found.delta(index)[:out] if proj == "gate_proj" else found.delta(index)[out:]
        return match["owner"], weight.float() + half
    owner = name.rsplit(".", 1)[0]
    if weight.dim() == 3 and owner in experts:
        found = _find(experts[owner], (weight.shape[1], weight.shape[2]))
        if found is not None:
            deltas = torch.stack([found.delta(e) for e in range(found.experts)])
            return owner, weight.float() + deltas
    return None
