"""What a run will hold in memory, per rank on its device and per node on the host, from the config, the DeepSpeed
JSON and the model's config.json alone, before anything loads (docs/memory-plan.md).

Every term is counted from first principles, bytes per parameter or per token by dtype, ZeRO stage and offload, not
fitted to measurements: the measurements check it (tests/unit/config/test_memory_plan.py). The shapes are those of
config/footprint.py (a decoder-only transformer with grouped-KV attention and a gated MLP). What the terms assume:

- Training dtype: bf16 on GPUs, fp32 on CPU ranks. DeepSpeed keeps a float32 master copy of the trained parameters
  and Adam's two float32 moments, partitioned over the ranks from ZeRO stage 1; gradients in the training dtype,
  partitioned from stage 2; the parameters themselves from stage 3, where the largest tensor (the embedding) is
  gathered whole while it computes and, when trained, its gradient is whole before it is reduce-scattered. Before
  the step the gradients are converted to float32 (bf16 training): that copy and the activations never coexist.
- Q-LoRA: the projections' weights in nf4 with double quantization (0.5 + 0.127 / 8 bytes per parameter); the
  rest (embeddings, norms) in float32, which PEFT's prepare_model_for_kbit_training casts them to.
- Activations per token of a decoder layer, as eager PyTorch keeps them for backward with SDPA attention (no
  sequence-squared term), over this rank's tokens (with train.sequence_parallel_size, its part of each row): two
  RMSNorms (their float32 input and two outputs in the training dtype), the rotated query, key and value, the
  attention output and the output projection's input, and the MLP's gate, activation, up and product (four
  intermediate-size tensors; with train.tiled_mlp none of them, and one tile's, about hidden-size tokens, while
  backward recomputes it). LoRA dropout keeps each adapter's dropped input and mask. With gradient
  checkpointing, each layer's input and one layer's activations while it is recomputed.
- A mixture of experts (config/footprint.py `moe_experts`): the weights, gradients and optimizer states of every
  expert; the activations of the experts a token is routed to (each one's four intermediate tensors, its gathered
  input and weighted output) and the router's float32 logits and probabilities over every expert.
- The loss: the target logits in the training dtype, their float32 copy and its gradient, over
  train.loss_chunk_tokens tokens at a time when chunked (above 256 MiB of float32 target logits), else over the whole
  micro-batch.
- A vision-language model (config/vision.py): the vision tower's and the projector's weights (kept in the compute
  dtype by Q-LoRA), and its activations per image patch (a decoder layer's terms at its width), over the patches of
  a micro-batch's images: at most its rows' tokens all image tokens, each merge x merge patches. They are kept for
  backward only when a vision part trains; a frozen tower holds one block's while it runs.
- Online RL (train.objective=grpo): a row is a prompt and its completion, the loss keeps the completions' logits, and
  the rollouts are a phase of their own (config/rl_memory.py).
- Host memory per rank: the process itself (Python, torch, transformers, DeepSpeed: 0.31 GB measured on CPU ranks),
  the model while it loads (whole in the training dtype, or under ZeRO-3's partitioned load its share plus the
  largest tensor), offloaded states, and a background save's copy of the rank's checkpoint share. CPU ranks hold
  their "device" terms in host memory too.

Not counted: the CUDA context and the allocator's cache (outside torch's allocated bytes; preflight leaves a margin
for them), DeepSpeed's communication buckets, and anything of a model shape these formulas do not know (no plan is
made then, not a guess).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any

from config.deepspeed import zero_stage
from config.footprint import (
    PROJECTIONS,
    adapter_params,
    estimate,
    full_trained,
    model_params,
    moe_experts,
    projection_shapes,
)
from config.rl_memory import RawTerm, is_rl, loss_logits_bytes, rl_terms, row_tokens
from config.schema import FinetuneConfig
from config.sections.run_data import MAX_LENGTH
from config.vision import is_vision_language, vision_activation_bytes, vision_params

GB = 1e9
PROCESS_BYTES = int(0.31 * GB)  # a rank's own RssAnon before loading (docs/large-models.md, "Measured")
NF4_BYTES = 0.5 + 0.127 / 8  # 4 bits, plus double quantization's constants (bitsandbytes: 0.127 bits a parameter)
LOSS_CHUNK_ABOVE = 256 * 2**20  # float32 target logits above which the loss is chunked (trainer/loss/chunked.py)
# The relative error the plan states for itself (docs/memory-plan.md): preflight refuses only beyond it.
PLAN_ERROR = 0.25


class Phase(Enum):
    """When a term is held: always, or during one of the phases that come and go (never two of them at once)."""

    ALWAYS = "always"
    BACKWARD = "backward"  # activations, the loss's logits, the gradients as they are computed
    STEP = "step"  # the optimizer step
    GENERATE = "generate"  # online RL's rollouts (config/rl_memory.py)
    LOAD = "load"  # on the host, while the model loads


@dataclass(frozen=True)
class Term:
    """One part of a peak: what it is, its bytes, when it is held and the setting that shrinks it."""

    what: str
    bytes: int
    phase: Phase
    shrink: str


@dataclass(frozen=True)
class MemoryPlan:
    """The peak memory of one rank on its device, and of one rank on its host; the node's host peak is the host
    peak times the ranks per node."""

    device: list[Term]
    host: list[Term]
    on_gpu: bool
    nproc_per_node: int

    @staticmethod
    def peak(terms: list[Term], *, besides: int = 0) -> int:
        """What is always held, plus the largest of the phases that come and go (`besides`: one more such phase)."""
        always = sum(t.bytes for t in terms if t.phase is Phase.ALWAYS)
        phases = {t.phase for t in terms} - {Phase.ALWAYS}
        return always + max([besides, *(sum(t.bytes for t in terms if t.phase is p) for p in phases)])

    @property
    def device_bytes(self) -> int:
        """Per rank, on its GPU (on CPU ranks: in host memory, counted in host_bytes too)."""
        return self.peak(self.device)

    @property
    def host_bytes(self) -> int:
        """Per rank, in host memory. On CPU ranks training's peak comes after the load's, in the same memory."""
        return self.peak(self.host, besides=0 if self.on_gpu else self.device_bytes)

    @property
    def node_host_bytes(self) -> int:
        return self.host_bytes * self.nproc_per_node

    def largest(self, terms: list[Term]) -> Term:
        return max(terms, key=lambda t: t.bytes)


def _layer_activation_bytes(model: dict[str, Any], w: int, lora_dropout: bool, tiled_mlp: bool = False) -> int:
    """Bytes one decoder layer keeps for backward per token (the module docstring's list); with train.tiled_mlp a
    dense MLP keeps none of its intermediate tensors (its input is the norm's output, counted)."""
    shapes = projection_shapes(model)
    hidden = int(model["hidden_size"])
    q_out, kv_out = shapes["q_proj"][1], shapes["k_proj"][1]
    inter = shapes["gate_proj"][1] if "gate_proj" in shapes else 0
    norms = 2 * (4 * hidden + 2 * w * hidden)
    attention = w * (2 * q_out + 2 * kv_out + hidden)  # rotated q, k and v, the attention output, o_proj's input
    experts = moe_experts(model)
    mlp = 0 if tiled_mlp and experts is None else w * 4 * inter
    if experts is not None:
        # The routed experts a token goes to: each one's four intermediate tensors, its gathered input and weighted
        # output; the router's float32 logits and probabilities over every expert.
        k = experts.per_token
        mlp += w * (4 * k * experts.intermediate + 2 * k * hidden) + 8 * experts.count
        lora_dropout = False  # PEFT applies none with expert weights adapted (trainer/model/load.py)
    dropout = (w + 1) * sum(shapes[p][0] for p in PROJECTIONS if p in shapes) if lora_dropout else 0
    return norms + attention + mlp + dropout


@dataclass(frozen=True)
class Shape:
    """What the terms are computed from: the model's sizes, the run's settings resolved."""

    cfg: FinetuneConfig
    model: dict[str, Any]
    params: int
    trained: int
    projections: int  # parameters of the decoder layers' projections (Q-LoRA's 4-bit ones)
    embedding: int
    w: int  # bytes of the training dtype
    stage: int
    world: int
    offload_optimizer: bool
    offload_params: bool


def resolve_shape(cfg: FinetuneConfig, ds: dict[str, Any], model: dict[str, Any], on_gpu: bool) -> Shape:
    """The sizes and settings the terms need (KeyError and the like for a config.json of another shape)."""
    params = model_params(model)
    method, lora = cfg.train.method, cfg.train.lora
    stage = zero_stage(ds)
    zero = ds.get("zero_optimization", {})
    return Shape(
        cfg=cfg,
        model=model,
        params=params,
        trained=adapter_params(model, lora.r, lora.target_modules, lora.target_parameters)
        if method.trains_adapters
        else full_trained(cfg, model),
        projections=int(model["num_hidden_layers"]) * sum(i * o for i, o in projection_shapes(model).values()),
        embedding=int(model["vocab_size"]) * int(model["hidden_size"]),
        w=2 if on_gpu else 4,
        stage=stage,
        world=cfg.world_size,
        offload_optimizer=str(zero.get("offload_optimizer", {}).get("device", "none")) == "cpu",
        offload_params=stage == 3 and str(zero.get("offload_param", {}).get("device", "none")) == "cpu",
    )


def weight_terms(s: Shape) -> tuple[list[Term], list[Term]]:
    """(device, host) terms of the weights."""
    if s.cfg.train.method.quantizes_base:
        vision = vision_params(s.model)  # not quantized, and back in the compute dtype (trainer/model/vision.py)
        weights = int(s.projections * NF4_BYTES) + (s.params - s.projections - vision) * 4 + vision * s.w
        what = "base weights (nf4 projections, float32 embeddings and norms" + (", the vision side)" if vision else ")")
    else:
        weights = s.params * s.w
        what = f"weights ({'bf16' if s.w == 2 else 'float32'})"
    share = weights // s.world if s.stage == 3 else weights
    if s.offload_params:
        return [], [Term(f"{what}, offloaded", share, Phase.ALWAYS, "more ranks")]
    if s.stage < 3:
        return [Term(what, share, Phase.ALWAYS, "deepspeed.config: ZeRO-3 (zero3.json), or train.method qlora")], []
    embedding = s.embedding * (4 if s.cfg.train.method.quantizes_base else s.w)
    return [
        Term(f"{what}, this rank's share", share, Phase.ALWAYS, "more ranks"),
        Term("the embedding gathered whole", embedding, Phase.ALWAYS, "a smaller vocabulary"),
    ], []


def optimizer_terms(s: Shape) -> tuple[list[Term], list[Term]]:
    """(device, host) terms of the optimizer's states and the gradients."""
    divide = s.world if s.stage >= 1 else 1
    moved: list[Term] = [
        Term("float32 master copy and Adam's moments", s.trained * 12 // divide, Phase.ALWAYS, "more ranks, or offload")
    ]
    if s.w == 2:
        moved.append(Term("float32 gradients for the step", s.trained * 4 // divide, Phase.STEP, "more ranks"))
    gradients = s.trained * s.w // (s.world if s.stage >= 2 else 1)
    device = [
        Term("gradients", gradients, Phase.BACKWARD, "deepspeed.config: ZeRO-2 or 3"),
        Term("gradients", gradients, Phase.STEP, "deepspeed.config: ZeRO-2 or 3"),
    ]
    if s.stage == 3 and not s.cfg.train.method.trains_adapters:
        device.append(
            Term("the embedding's gradient, whole", s.embedding * s.w, Phase.BACKWARD, "a smaller vocabulary")
        )
    return (device, moved) if s.offload_optimizer else (device + moved, [])


def batch_terms(s: Shape) -> list[Term]:
    """The activations and the loss's logits of one micro-batch."""
    train = s.cfg.train
    # A sequence-parallel rank holds its part of each row (attention, between two all-to-alls, the whole row's
    # positions for its share of the heads: as many numbers), and takes the loss of its part's targets.
    tokens = -(-train.micro_batch_size * row_tokens(s.cfg) // train.sequence_parallel_size)
    layers, hidden, vocab = (int(s.model[k]) for k in ("num_hidden_layers", "hidden_size", "vocab_size"))
    per_layer = _layer_activation_bytes(s.model, s.w, train.lora.dropout > 0, train.tiled_mlp)
    # A tiled MLP's one tile of intermediates while backward recomputes it (trainer/model/tiled_mlp.py: hidden-size
    # tiles).
    inter = projection_shapes(s.model).get("gate_proj", (0, 0))[1]
    tile = hidden * s.w * 4 * inter if train.tiled_mlp and moe_experts(s.model) is None else 0
    if train.gradient_checkpointing:
        kept = layers * tokens * hidden * s.w + tokens * per_layer + tile
        activations = Term("activations (checkpointed)", kept, Phase.BACKWARD, "train.micro_batch_size")
    else:
        shrink = "train.gradient_checkpointing=true, train.micro_batch_size or train.sequence_parallel_size"
        activations = Term("activations", layers * tokens * per_layer + tile, Phase.BACKWARD, shrink)
    chunked = train.loss_chunk_tokens > 0 and tokens * vocab * 4 > LOSS_CHUNK_ABOVE
    loss_tokens = min(tokens, train.loss_chunk_tokens) if chunked else tokens
    shrink = "train.loss_chunk_tokens" if chunked or train.loss_chunk_tokens == 0 else "train.micro_batch_size"
    what = "the loss's logits" + (" (chunked)" if chunked else "")
    if is_rl(s.cfg):  # the completions' positions, whole (trainer/objectives/rl/loss.py)
        logits = Term("the loss's logits (completions)", loss_logits_bytes(s.cfg, vocab, s.w), Phase.BACKWARD, shrink)
        return [activations, logits]
    return [activations, Term(what, loss_tokens * vocab * (s.w + 8), Phase.BACKWARD, shrink), *vision_terms(s)]


def vision_terms(s: Shape) -> list[Term]:
    """A vision-language model's activations over a micro-batch's image patches (module docstring); none else."""
    if not is_vision_language(s.model):
        return []
    vision = s.model["vision_config"]
    merge = int(vision.get("spatial_merge_size", 2))
    patches = s.cfg.train.micro_batch_size * s.cfg.data.max_length * merge * merge
    per_patch = vision_activation_bytes(s.model, s.w)
    shrink = "data.image_max_pixels or train.micro_batch_size"
    if not s.cfg.model.freeze_vision_tower:  # its blocks train: each keeps its activations for backward
        return [
            Term(
                "the vision tower's activations (a micro-batch's image patches)",
                patches * per_patch,
                Phase.BACKWARD,
                shrink,
            )
        ]
    block = per_patch // max(int(vision["depth"]), 1)
    return [
        Term(
            "the frozen vision tower's activations while it runs (one block's)", patches * block, Phase.BACKWARD, shrink
        )
    ]


def host_terms(s: Shape) -> list[Term]:
    """The process, the model while it loads, and a background save's copy."""
    if s.stage == 3 and s.cfg.deepspeed.zero3_init and s.cfg.train.method.loads_partitioned:
        load = s.params * s.w // s.world + s.embedding * s.w
    else:  # whole in the training dtype (Q-LoRA's base too: bitsandbytes quantizes it as it moves to the GPU)
        load = s.params * s.w
    terms = [
        Term("the process (Python, torch, DeepSpeed)", PROCESS_BYTES, Phase.ALWAYS, ""),
        Term("the model while it loads", load, Phase.LOAD, "deepspeed.config: ZeRO-3 (partitioned load)"),
    ]
    footprint = estimate(s.cfg, s.model, 1, s.world, bf16=s.w == 2) if s.cfg.train.async_save else None
    if footprint is not None:
        copy = "a background save's copy of this rank's checkpoint share"
        terms.append(Term(copy, footprint.checkpoint // s.world, Phase.ALWAYS, "train.async_save=false"))
    return terms


def plan(cfg: FinetuneConfig, ds: dict[str, Any], model: dict[str, Any], *, on_gpu: bool) -> MemoryPlan | None:
    """The run's memory plan, or None when the config.json is not of a shape these formulas know."""
    try:
        s = resolve_shape(cfg, ds, model, on_gpu)
        weights, offloaded_weights = weight_terms(s)
        optimizer, offloaded_states = optimizer_terms(s)
        batch = batch_terms(s)
        rl_device, rl_host = rl_terms(cfg, model, (s.params, s.w, s.stage, s.world))
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return None
    device = weights + optimizer + batch + terms_of(rl_device)
    host = host_terms(s) + offloaded_weights + offloaded_states + terms_of(rl_host)
    return MemoryPlan(device, host, on_gpu, cfg.launch.nproc_per_node)


def terms_of(raw: list[RawTerm]) -> list[Term]:
    """Terms from their plain form (config/rl_memory.py)."""
    return [Term(what, size, Phase(phase), shrink) for what, size, phase, shrink in raw]


def longest_length(
    cfg: FinetuneConfig, ds: dict[str, Any], model: dict[str, Any], budget: int, *, step: int = 1024
) -> int | None:
    """The longest data.max_length, a multiple of `step` up to the schema's limit, at which the plan's peak on a GPU
    is at most `budget` bytes (0: not even `step` tokens fit; None: a shape the plan does not know). Every term grows
    with the length or stays (module docstring), so the peak is monotonic and a bisection over multiples finds it."""

    def fits(length: int) -> bool:
        data = cfg.data.model_copy(update={"max_length": length})
        memory = plan(cfg.model_copy(update={"data": data}), ds, model, on_gpu=True)
        if memory is None:
            raise ValueError("a shape the plan does not know")
        return memory.device_bytes <= budget

    low, high = 0, MAX_LENGTH // step  # multiples of step: `low` fits (0 trivially), above `high` is not asked
    try:
        if fits(high * step):
            return high * step
        while high - low > 1:  # invariant: low fits, high does not
            middle = (low + high) // 2
            low, high = (middle, high) if fits(middle * step) else (low, middle)
    except ValueError:
        return None
    return low * step


def table(p: MemoryPlan) -> str:
    """The plan as text: each term with its phase, and the peaks."""
    where = "GPU" if p.on_gpu else "CPU rank (host memory)"
    lines = [f"per rank, on its {where}:"]
    lines += [f"  {t.bytes / GB:9.2f} GB  {t.phase.value:<8}  {t.what}" for t in p.device]
    lines.append(f"  {p.device_bytes / GB:9.2f} GB  peak")
    lines.append("per rank, host memory beside it:" if p.on_gpu else "per rank, host memory besides:")
    lines += [f"  {t.bytes / GB:9.2f} GB  {t.phase.value:<8}  {t.what}" for t in p.host]
    lines.append(f"  {p.host_bytes / GB:9.2f} GB  peak per rank; {p.node_host_bytes / GB:.2f} GB per node")
    return "\n".join(lines)
