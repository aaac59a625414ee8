"""What is trained and how: the `model` section (base model, chat template; `BUILTIN_MODELS`), `train` with its
`train.lora` subsection (the optimisation and checkpoint policy), and `deepspeed` (the engine's JSON).

Together because they describe one rank's work; the DeepSpeed JSON is resolved from `train` (config/deepspeed.py).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from config.methods import MethodField
from config.objectives import SUPERVISED_DATA, ObjectiveField
from config.sections.base import Section
from config.sections.preference import PreferenceConfig
from config.sections.rl import RlConfig

# Models Tandem builds itself (random weights, for tests and trying the pipeline): `tiny` has a small BPE trained
# on the sample data, `tiny-qwen2.5` Qwen's own BPE and vocabulary; both carry Qwen2.5's chat template.
BUILTIN_MODELS = ("tiny", "tiny-qwen2.5")


class ModelConfig(Section):
    """The base model."""

    name_or_path: str = Field(
        "tiny",
        min_length=1,
        description="Local Hugging Face model directory, or a built-in "
        "random Qwen2-shaped model: 'tiny' (small BPE) or 'tiny-qwen2.5' (Qwen's tokenizer).",
    )
    chat_template: str | None = Field(
        None,
        min_length=1,
        description="Chat template to use instead of the tokenizer's own, for staging, training and the export: a "
        "built-in name (qwen2.5) or a Jinja file; empty: the model's own.",
    )
    trust_remote_code: bool = Field(
        False,
        description="Run the Python code the model directory ships (config.json's auto_map: its own configuration, "
        "modeling or tokenizer classes), as Hugging Face's trust_remote_code does, in staging, on every rank and in "
        "the export. Only for a directory whose code you have read: it runs with the run's permissions. The code "
        "files are among the base model's checked files (base_model.json) and are copied into the export.",
    )
    freeze_vision_tower: bool = Field(
        True,
        description="Vision-language models: keep the vision tower's weights as they are (LoRA puts no adapter on "
        "it; full fine-tuning does not train it). LLaMA-Factory's name and default.",
    )
    freeze_multi_modal_projector: bool = Field(
        True,
        description="Vision-language models: keep the merger that projects image features into the language model "
        "(Qwen's visual.merger, and Qwen3-VL's deepstack mergers) as it is. LLaMA-Factory's name and default.",
    )
    freeze_language_model: bool = Field(
        False,
        description="Vision-language models: keep the language model (its embeddings, decoder layers and output "
        "layer) as it is, to train only the vision side. LLaMA-Factory's name and default.",
    )


class LoraConfig(Section):
    """LoRA adapter settings (PEFT), used by train.method lora and qlora."""

    r: int = Field(8, gt=0, description="Adapter rank.")
    alpha: int = Field(16, gt=0, description="Scaling numerator (scale = alpha / r).")
    dropout: float = Field(0.05, ge=0.0, lt=1.0, description="Dropout on the adapter input.")
    target_modules: list[str] | None = Field(
        None,
        min_length=1,
        description="Module names that get adapters; empty: every attention and MLP projection of the "
        "model family (q/k/v/o/gate/up/down_proj for Qwen2/Llama/Mistral, c_attn/c_proj/w1/w2 for Qwen-1); a "
        "mixture of experts' router gate is never a default target.",
    )
    target_parameters: list[str] | None = Field(
        None,
        description="Parameters (not modules) that get adapters, through PEFT's target_parameters: a mixture of "
        "experts' fused 3-D expert weights, by name or name suffix (mlp.experts.gate_up_proj, mlp.experts.down_proj); "
        "empty: every fused expert weight of the model (none in a dense model); []: none (with target_modules "
        "[q_proj, k_proj, v_proj, o_proj]: attention only). PEFT applies no dropout on these: train.lora.dropout is "
        "then 0 for the whole adapter.",
    )

    @field_validator("target_modules", "target_parameters")
    @classmethod
    def _names(cls, names: list[str] | None) -> list[str] | None:
        if names and not all(name.strip() for name in names):
            raise ValueError("names must not be empty: give module or parameter names such as q_proj")
        return names


class MoeConfig(Section):
    """A mixture of experts' router while training (Qwen3-MoE, Qwen2-MoE, Mixtral...; ignored for a dense model)."""

    aux_loss_coef: float | None = Field(
        None,
        ge=0.0,
        le=1.0,
        description="Weight of the router's load-balancing loss added to the training loss; empty: the model config's "
        "router_aux_loss_coef (0.001 for Qwen3-MoE); 0: off (the expert load is still measured and logged).",
    )


SIZE_UNITS = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}


def size_in_bytes(size: str) -> int:
    """`50GB`, `500MB`, `2GiB` as bytes (decimal units as Hugging Face reads them, binary ones with an i)."""
    number = size.rstrip("BKMGi ").strip()
    return int(float(number) * SIZE_UNITS[size[len(number) :].strip()])


class TrainConfig(Section):
    """Optimisation. Defaults mirror Qwen's finetune_lora_ds.sh."""

    method: MethodField = Field("lora", validate_default=True, description="Which parameters are trained.")
    learning_rate: float = Field(3e-4, gt=0.0, le=1.0, description="Peak learning rate.")
    max_steps: int | None = Field(None, gt=0, description="Optimizer steps to run; empty: from train.epochs.")
    epochs: float = Field(1.0, gt=0, le=1000, description="Passes over the train split, used when max_steps is empty.")
    save_steps: int = Field(1000, gt=0, description="Save a checkpoint every N steps (and at the end).")
    save_every_minutes: float | None = Field(
        None,
        gt=0,
        description="Also save when this many minutes passed since the last save (rank 0's clock, agreed "
        "by every rank at a step boundary); empty: by steps only. For spot machines, bounds the work a loss costs.",
    )
    async_save: bool = Field(
        True,
        description="Save checkpoints in the background: training waits only while this rank's state is copied to "
        "host memory (to local disk when memory is short), and a writer thread writes, digests and uploads it; "
        "false: every save blocks until COMPLETE. Either way a checkpoint counts only once COMPLETE is written.",
    )
    preempt_grace_s: int | None = Field(
        None,
        ge=1,
        le=30,
        description="On SIGTERM (a spot/preemptible machine's notice, sent to its torchrun agent), "
        "every rank stops at the next step boundary and saves an emergency checkpoint, which the retry resumes from; "
        "the save should finish within this many seconds (torchrun kills its ranks 30 s after forwarding the "
        "signal). Empty: SIGTERM stops without saving (unless launch.checkpoint_on_cancel).",
    )
    keep_latest_k: int | None = Field(
        None, ge=1, description="Keep only the newest k complete checkpoints; empty: keep all."
    )
    resume: str = Field(
        "auto",
        min_length=1,
        description="auto: continue from the run's newest complete checkpoint; never; or a checkpoint URL.",
    )
    export_merged: bool = Field(False, description="LoRA/Q-LoRA: also export base + adapter merged into full weights.")
    export_shard_size: str = Field(
        "50GB",
        pattern=r"^\d+(\.\d+)?\s*(B|KB|MB|GB|KiB|MiB|GiB)$",
        description="Largest safetensors file of an exported model (as save_pretrained's max_shard_size: 50GB, 5GB, "
        "500MB, 2GiB); a larger model is written in shards with model.safetensors.index.json.",
    )
    length_grouping: bool = Field(True, description="Group similar lengths into micro-batches (less padding).")
    straggler_check_steps: int = Field(10, gt=0, description="Compare per-rank step times every N steps.")
    straggler_factor: float = Field(
        1.5, gt=1.0, description="Warn when a rank's step time exceeds the median by this factor."
    )
    micro_batch_size: int = Field(2, gt=0, description="Examples per rank per forward pass.")
    gradient_accumulation_steps: int = Field(
        8, gt=0, description="Micro-batches per rank per optimizer step; not used when train.global_batch_size is set."
    )
    global_batch_size: int | None = Field(
        None,
        gt=0,
        description="Rows per optimizer step across all ranks (packed rows when packing is on). When set, "
        "gradient accumulation is derived (global / (micro_batch_size x world size)), so the steps, the learning-rate "
        "schedule and the loss are the same on any number of nodes; needed to continue on fewer or more nodes.",
    )
    weight_decay: float = Field(0.1, ge=0.0, description="AdamW weight decay.")
    adam_beta1: float = Field(0.9, gt=0.0, lt=1.0, description="AdamW beta1.")
    adam_beta2: float = Field(0.95, gt=0.0, lt=1.0, description="AdamW beta2.")
    adam_epsilon: float = Field(1e-8, gt=0.0, description="AdamW epsilon.")
    lr_scheduler: Literal["cosine", "linear"] = Field("cosine", description="Decay after warmup.")
    warmup_ratio: float = Field(0.01, ge=0.0, le=1.0, description="Share of max_steps spent warming up.")
    max_grad_norm: float = Field(1.0, gt=0.0, description="Gradient clipping norm.")
    seed: int = Field(42, ge=0, description="Base seed; rank r uses seed + r.")
    log_steps: int = Field(1, gt=0, description="Append to metrics.jsonl every N steps.")
    gradient_checkpointing: bool = Field(False, description="Recompute activations to save memory.")
    compile: bool = Field(
        False,
        description="Compile each decoder layer with torch.compile (regional compilation: the layers share their "
        "compiled code; the rest of the model stays eager), in place: checkpoints and exports keep their parameter "
        "names. The first step takes longer while it compiles (logged); the compiled code is cached in the node cache "
        "(launch.node_cache_dir), so a later run on the node compiles nothing. Pays where kernel launches, not "
        "arithmetic, bound a step. docs/performance.md.",
    )
    kernels: Literal["auto", "liger", "none"] = Field(
        "auto",
        description="Fused kernels (trainer/model/kernels.py): liger = Liger Kernel's RMSNorm, SwiGLU and RoPE in "
        "Qwen2, "
        "Qwen3, Qwen3-MoE and Llama models, and its fused linear cross-entropy as SFT's training loss (on a CUDA "
        "device, with liger-kernel installed; otherwise the run stops); none = the built-in path (the chunked loss, "
        "train.loss_chunk_tokens); auto = liger where it can run, else none. The run logs what it applied. "
        "docs/performance.md.",
    )
    attention: Literal["auto", "sdpa", "flash", "varlen", "flex"] = Field(
        "auto",
        description="The attention implementation (trainer/model/attention.py): flash = flash-attention's "
        "variable-length "
        "kernel (a CUDA device with flash-attn installed, else the run stops), SFT's micro-batch rows concatenated "
        "into one row without padding and the examples' boundaries computed on the host; varlen = the same with "
        "PyTorch's own variable-length flash attention (CUDA, nothing to install; sft only); flex = PyTorch's "
        "FlexAttention with a document mask (not on a CPU: it has no backward there); sdpa = PyTorch's "
        "scaled-dot-product attention, packed rows with a block-diagonal mask; auto = flash, else varlen (sft), "
        "where they can run and sequences are not split (train.sequence_parallel_size 1), else sdpa. The run logs "
        "what it applied. docs/performance.md.",
    )
    profile_steps: int = Field(
        0,
        ge=0,
        description="Profile this many optimizer steps with the PyTorch profiler, starting after the first three "
        "of the attempt (warm-up); each rank writes its table of the most expensive operations (by device and by "
        "CPU time) to {run}/profile/rank-{r}.txt, and metrics.jsonl gets a `profile` event naming the steps, "
        "whose times the profiler inflates. The window ends at the run's last step: a run with three steps or fewer "
        "left profiles nothing. 0: off.",
    )
    tiled_mlp: bool = Field(
        False,
        description="Compute each decoder layer's dense MLP a tile of about hidden_size tokens at a time (Arctic "
        "Long Sequence Training's tiled MLP, DeepSpeed's TiledMLP): its four intermediate-size tensors per token are "
        "no longer kept for backward, only its input, at the price of the MLP's forward computed again in backward. "
        "Pays on long sequences (thousands of tokens per rank), with or without sequence parallelism; "
        "mixture-of-experts blocks are left as they are. Not with train.compile. docs/long-sequences.md.",
    )
    loss_chunk_tokens: int = Field(
        1024,
        ge=0,
        description="The loss (training and evaluation), and the preference objectives' log-probabilities, take "
        "the logits of target tokens only, from the last hidden states (trainer/loss/chunked.py). A micro-batch "
        "whose target logits in float32 (target tokens x vocabulary x 4 bytes) would exceed 256 MiB is chunked: "
        "the output layer is applied to this many "
        "target tokens at a time and recomputed in backward, so its full-vocabulary logits never exist at once; a "
        "smaller one (any micro-batch of a small vocabulary) takes them in one pass, without recomputation. 0: the "
        "model's own full logits. Qwen2, Qwen3, Llama, Mistral and Gemma models only (others use full logits); "
        "under ZeRO-2 and ZeRO-3 alike.",
    )
    sequence_parallel_size: int = Field(
        1,
        ge=1,
        description="Split each sequence across this many ranks (DeepSpeed's Ulysses: all-to-all between sequence and "
        "head sharding around attention), for records longer than one rank's memory holds: activations per rank "
        "about 1 / size. The ranks of a sequence group read the same rows, so the global batch, the data order and "
        "resume count sequence groups (world size / size). Must divide the ranks per node (groups inside a node, "
        "data parallelism across nodes) or be a multiple of them, and divide the attention heads; sft only, "
        "train.micro_batch_size 1, unpacked rows. 1: off. docs/long-sequences.md.",
    )
    objective: ObjectiveField = Field(
        "sft",
        validate_default=True,
        description="sft: supervised fine-tuning (cross-entropy of the answers). Preference tuning, on preference "
        "rows (data.preference=pairs, which these imply): dpo (sigmoid loss on pairs), ipo (DPO's squared variant), "
        "kto (answers labelled desirable or not), orpo (pairs, no reference model). With lora and qlora, dpo, ipo and "
        "kto take the "
        "reference from the same model with its adapters disabled; with full, dpo and ipo take the base model's "
        "log-probabilities of every pair, computed once before the first step into {run}/reference/ (kto needs "
        "lora or qlora). Online RL, on prompts (data.preference=prompts, which it implies): grpo (completions sampled "
        "by the model as it trains, scored by train.rl.rewards, group-relative advantages; docs/online-rl.md).",
    )
    preference: PreferenceConfig = Field(default_factory=PreferenceConfig)
    rl: RlConfig = Field(default_factory=RlConfig)
    lora: LoraConfig = Field(default_factory=LoraConfig)
    moe: MoeConfig = Field(default_factory=MoeConfig)

    @model_validator(mode="after")
    def _split_attention(self) -> TrainConfig:
        if self.attention == "varlen" and self.objective.data != SUPERVISED_DATA:
            raise ValueError(
                f"train.attention=varlen with train.objective={self.objective.name}: its {self.objective.data.words} "
                "are not flattened into one row; set train.attention to auto, flash or sdpa"
            )
        if self.sequence_parallel_size > 1 and self.attention not in ("auto", "sdpa"):
            raise ValueError(
                f"train.attention={self.attention} with train.sequence_parallel_size={self.sequence_parallel_size}: "
                "DeepSpeed's Ulysses wraps sdpa attention here; set train.attention to auto or sdpa"
            )
        return self

    @model_validator(mode="after")
    def _tiled_mlp_eager(self) -> TrainConfig:
        if self.tiled_mlp and self.compile:
            raise ValueError(
                "train.tiled_mlp and train.compile: DeepSpeed's tiled MLP is not compiled with the layer around it; "
                "set one of them to false"
            )
        return self


class DeepSpeedSection(Section):
    """DeepSpeed engine configuration."""

    config: str = Field(
        "config/deepspeed/zero2.json",
        min_length=1,
        description="DeepSpeed JSON (ours or Qwen's, 'auto' values allowed; resolved from train).",
    )
    zero3_init: bool = Field(
        True,
        description="Under ZeRO-3, build the model partitioned (deepspeed.zero.Init) and load its checkpoint shard by "
        "shard into the partitions, so no rank holds the whole model (as accelerate's zero3_init_flag); false: "
        "every rank loads the whole model first, for a model whose own initialisation zero.Init cannot run.",
    )
