"""What a run will write, estimated from the base model's config.json and the method, before anything is written: a
checkpoint's bytes, the export's, the merged export's, and how many checkpoints are on storage at once.

The basis (docs/operations.md, "Disk space"): the parameters of a decoder-only transformer with grouped-KV attention
and a gated MLP (embeddings, and the output layer unless tied; per layer q, k, v, o, gate, up, down and two norms),
times the bytes DeepSpeed keeps per trained parameter: its weight in the training dtype (bf16 on GPUs, fp32 on CPU
ranks), an fp32 master copy and Adam's two fp32 moments. Full fine-tuning saves every parameter so; LoRA and Q-LoRA
save the adapters alone (the frozen base is model.name_or_path already), r x (in + out) per targeted projection.
Biases are left out (0.1% of Qwen2.5-0.5B); DeepSpeed's scripts, the RNG states and the pickles' bookkeeping are a
fixed allowance per checkpoint and per rank. A model
of another shape (no `num_attention_heads`, say) makes no estimate: the check is then skipped, not guessed.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from typing import Any

from config.schema import FinetuneConfig
from config.vision import frozen_params, is_vision_language, language_view, vision_params

FP32_MASTER = 4
ADAM_MOMENTS = 8  # two fp32 moments
# What a checkpoint holds besides the parameters' states, measured on the tiny model (tests/distributed/
# test_footprint.py): DeepSpeed's zero_to_fp32.py and zero_to_torch.py and our manifest (about 43 KB), and per rank
# trainer_state.pt (RNG states, 14.5 KB) and the pickles' own bookkeeping (up to 23 KB), rounded up.
CHECKPOINT_OVERHEAD = 64 * 2**10
RANK_OVERHEAD = 48 * 2**10
# The projections of one decoder layer, as (name, in features, out features) in units resolved below.
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class Footprint:
    """The bytes a run writes: one checkpoint, the export, the merged export (0 unless train.export_merged), and the
    most checkpoints on storage at once (retention removes the oldest only after a new save completed)."""

    params: int
    trained: int
    checkpoint: int
    export: int
    merged: int
    checkpoints_kept: int

    @property
    def storage(self) -> int:
        """Bytes the run needs on run.storage at its fullest."""
        return self.checkpoints_kept * self.checkpoint + self.export + self.merged


def staged_on_node(footprint: Footprint, nproc_per_node: int, world_size: int, *, node0: bool) -> int:
    """Bytes a node stages on its own disk for a run.storage that is not local: its ranks' share of a checkpoint,
    written there before upload, and on node 0 the export (and the merged export) staged before it is published."""
    share = footprint.checkpoint * nproc_per_node // world_size
    return share + (footprint.export + footprint.merged if node0 else 0)


MODEL_CONFIG = "config.json"


def read_model_json(model_path: str) -> dict[str, Any] | None:
    """A local model directory's config.json as a dict, None when it cannot be read (the estimates are then skipped,
    not guessed); a vision-language model's with its language model's keys at the top (config/vision.py
    `language_view`), its `vision_config` beside them."""
    try:
        with open(os.path.join(model_path, MODEL_CONFIG), encoding="utf-8") as handle:
            model = json.load(handle)
    except (OSError, ValueError):
        return None
    return language_view(model) if isinstance(model, dict) else None


@dataclass(frozen=True)
class Experts:
    """A mixture of experts' MLP (every layer's, as Qwen3-MoE and Mixtral have it): its experts, how many a token
    goes to, and one expert's intermediate size."""

    count: int
    per_token: int
    intermediate: int


def moe_experts(model: dict[str, Any]) -> Experts | None:
    """The experts of a mixture of experts' config.json (`num_experts` or Mixtral's `num_local_experts`); None for a
    dense model."""
    count = model.get("num_experts") or model.get("num_local_experts")
    if not count:
        return None
    inter = model.get("moe_intermediate_size") or model["intermediate_size"]
    return Experts(int(count), int(model["num_experts_per_tok"]), int(inter))


def projection_shapes(model: dict[str, Any]) -> dict[str, tuple[int, int]]:
    """(in, out) features of each projection of one decoder layer (`Linear` modules: a mixture of experts' MLP
    projections are those of its shared expert, when it has one; its experts are expert_params')."""
    hidden = int(model["hidden_size"])
    heads = int(model["num_attention_heads"])
    kv_heads = int(model.get("num_key_value_heads") or heads)
    head_dim = int(model.get("head_dim") or hidden // heads)
    attention = {
        "q_proj": (hidden, heads * head_dim),
        "k_proj": (hidden, kv_heads * head_dim),
        "v_proj": (hidden, kv_heads * head_dim),
        "o_proj": (heads * head_dim, hidden),
    }
    inter = int(model.get("intermediate_size") or 4 * hidden)
    if moe_experts(model) is not None:
        inter = int(model.get("shared_expert_intermediate_size") or 0)
        if not inter:
            return attention
    return {**attention, "gate_proj": (hidden, inter), "up_proj": (hidden, inter), "down_proj": (inter, hidden)}


def expert_params(model: dict[str, Any], *, active: bool = False) -> int:
    """One layer's expert weights and router (0 for a dense model); `active`: those one token uses."""
    experts = moe_experts(model)
    if experts is None:
        return 0
    hidden = int(model["hidden_size"])
    used = experts.per_token if active else experts.count
    return used * 3 * hidden * experts.intermediate + hidden * experts.count


def model_params(model: dict[str, Any], *, active: bool = False) -> int:
    """Parameters of the whole model (biases left out), a vision-language model's vision tower and projector among
    them; `active`: those one token uses (a mixture of experts' routed experts only)."""
    hidden, vocab, layers = int(model["hidden_size"]), int(model["vocab_size"]), int(model["num_hidden_layers"])
    layer = sum(i * o for i, o in projection_shapes(model).values()) + expert_params(model, active=active) + 2 * hidden
    embeddings = vocab * hidden * (1 if model.get("tie_word_embeddings") else 2)
    return layers * layer + embeddings + hidden + vision_params(model)


def full_trained(cfg: FinetuneConfig, model: dict[str, Any]) -> int:
    """Parameters full fine-tuning trains: every one, but a vision-language model's frozen parts (model.freeze_*)."""
    params, settings = model_params(model), cfg.model
    frozen = frozen_params(model, (settings.freeze_vision_tower, settings.freeze_multi_modal_projector))
    if is_vision_language(model) and settings.freeze_language_model:
        frozen += params - vision_params(model)
    return params - frozen


def adapter_params(
    model: dict[str, Any],
    r: int,
    targets: list[str] | None,
    parameters: list[str] | None = None,
    *,
    active: bool = False,
) -> int:
    """LoRA parameters: r x (in + out) per targeted projection of every layer (every projection by default), and a
    mixture of experts' adapted fused weights, r x experts x (in + out) each (`parameters`: train.lora.
    target_parameters; every expert weight by default, as trainer/parallel/moe.py chooses); `active`: those one token
    uses
    (its routed experts' adapters only)."""
    shapes = projection_shapes(model)
    names = [name for name in (targets or PROJECTIONS) if name in shapes]
    per_layer = sum(r * sum(shapes[name]) for name in names)
    experts = moe_experts(model)
    if experts is not None:
        hidden, inter = int(model["hidden_size"]), experts.intermediate
        fused = {"gate_up_proj": hidden + 2 * inter, "down_proj": inter + hidden}
        chosen = (
            fused if parameters is None else {k: v for k, v in fused.items() if any(p.endswith(k) for p in parameters)}
        )
        per_layer += r * (experts.per_token if active else experts.count) * sum(chosen.values())
    return int(model["num_hidden_layers"]) * per_layer


def saves(cfg: FinetuneConfig, total_steps: int) -> int:
    """Checkpoints on storage at once: keep_latest_k + 1 while a new save completes, else every save of the run
    (each train.save_steps and the last step; train.save_every_minutes may add more)."""
    every = math.ceil(total_steps / cfg.train.save_steps)
    keep = cfg.train.keep_latest_k
    return every if keep is None else min(keep + 1, every)


def estimate(
    cfg: FinetuneConfig, model: dict[str, Any], total_steps: int, world_size: int, *, bf16: bool
) -> Footprint | None:
    """The run's footprint on `world_size` ranks, or None when the config.json is not of a shape this estimate
    knows."""
    try:
        params = model_params(model)
        lora = cfg.train.method.trains_adapters
        lora_cfg = cfg.train.lora
        trained = (
            adapter_params(model, lora_cfg.r, lora_cfg.target_modules, lora_cfg.target_parameters)
            if lora
            else full_trained(cfg, model)
        )
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return None
    weight = 2 if bf16 else 4
    return Footprint(
        params=params,
        trained=trained,
        checkpoint=trained * (weight + FP32_MASTER + ADAM_MOMENTS) + CHECKPOINT_OVERHEAD + world_size * RANK_OVERHEAD,
        export=trained * weight,
        merged=params * weight if lora and cfg.train.export_merged else 0,
        checkpoints_kept=saves(cfg, total_steps),
    )
