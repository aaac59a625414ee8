"""The memory plan's tables for docs/memory-plan.md: Qwen2.5-7B, 14B and 72B (their published config.json values) by
method, ZeRO stage and node count, on nodes of 8 GPUs of 80 GB, and Qwen's "Q-LoRA 72B on 4 single-GPU nodes of
24 GB" claim (`table`); the plan beside the memory Qwen measured for its own scripts (`published_table`).

    .venv/bin/python tools/memory_table.py            # prints the Markdown of both tables, as the page holds them
    .venv/bin/python tools/memory_table.py --longest  # docs/long-sequences.md's longest-row table

tests/unit/config/test_memory_plan.py checks that the page holds what this prints.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from config.deepspeed import read_deepspeed_json, resolve_from_train
from config.loader import load_config
from config.memory_plan import GB, PLAN_ERROR, longest_length, plan
from config.schema import FinetuneConfig
from config.sequence_parallel import heads_problem

ROOT = Path(__file__).resolve().parents[1]
# config.json of Qwen/Qwen2.5-7B, -14B and -72B (the -Instruct models have the same shapes).
QWEN25 = {
    "7B": {"hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28, "num_attention_heads": 28,
           "num_key_value_heads": 4},
    "14B": {"hidden_size": 5120, "intermediate_size": 13824, "num_hidden_layers": 48, "num_attention_heads": 40,
            "num_key_value_heads": 8},
    "72B": {"hidden_size": 8192, "intermediate_size": 29568, "num_hidden_layers": 80, "num_attention_heads": 64,
            "num_key_value_heads": 8},
}  # fmt: skip
COMMON = {"vocab_size": 152064, "tie_word_embeddings": False}
# config.json of Qwen/Qwen3-30B-A3B and Qwen/Qwen3-235B-A22B (mixtures of 128 experts, 8 per token).
QWEN3_MOE = {
    "30B-A3B": {"hidden_size": 2048, "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4,
                "moe_intermediate_size": 768, "intermediate_size": 6144},
    "235B-A22B": {"hidden_size": 4096, "num_hidden_layers": 94, "num_attention_heads": 64, "num_key_value_heads": 4,
                  "moe_intermediate_size": 1536, "intermediate_size": 12288},
}  # fmt: skip
QWEN3_MOE_COMMON = {
    "vocab_size": 151936, "tie_word_embeddings": False, "head_dim": 128, "num_experts": 128, "num_experts_per_tok": 8,
}  # fmt: skip
# The settings of every row: a micro-batch of one 2,048-token row, gradient checkpointing on, LoRA r 16 on every
# projection without dropout, background saves on.
SETTINGS = [
    "data.max_length=2048",
    "train.micro_batch_size=1",
    "train.gradient_checkpointing=true",
    "train.lora.r=16",
    "train.lora.dropout=0",
]
GPU_GB = 80


def configured(
    size: str, method: str, zero: int, nnodes: int, gpus: int, *extra: str
) -> tuple[FinetuneConfig, dict[str, Any], dict[str, Any]]:
    """(config, resolved DeepSpeed JSON, config.json) of one configuration (a Qwen2.5 size, or a Qwen3-MoE one)."""
    cfg = load_config(
        None,
        [
            *SETTINGS,
            f"train.method={method}",
            f"launch.nnodes={nnodes}",
            f"launch.nproc_per_node={gpus}",
            f"deepspeed.config={ROOT / 'config' / 'deepspeed' / f'zero{zero}.json'}",
            *extra,
        ],
    )
    ds = resolve_from_train(read_deepspeed_json(cfg.deepspeed.config), cfg.train, cfg.world_size)
    model = {**QWEN25[size], **COMMON} if size in QWEN25 else {**QWEN3_MOE[size], **QWEN3_MOE_COMMON}
    return cfg, ds, model


def planned(size: str, method: str, zero: int, nnodes: int, gpus: int) -> tuple[float, float]:
    """(device GB a rank, host GB a node) of one configuration."""
    memory = plan(*configured(size, method, zero, nnodes, gpus), on_gpu=True)
    assert memory is not None
    return memory.device_bytes / GB, memory.node_host_bytes / GB


def verdict(device: float, gpu_gb: float) -> str:
    """ "yes" when even the plan plus its error fits, "no" when even the plan less its error does not (what preflight
    refuses), "tight" between."""
    if device * (1 - PLAN_ERROR) > gpu_gb:
        return "no"
    return "yes" if device * (1 + PLAN_ERROR) <= gpu_gb else "tight"


def table() -> str:
    lines = [
        f"| model | method | ZeRO | 1 node: GB a GPU | 2 nodes | 4 nodes | fits {GPU_GB} GB (1 / 2 / 4 nodes) |",
        "| --- | --- | --- | ---: | ---: | ---: | --- |",
    ]
    for size in QWEN25:
        for method in ("lora", "qlora", "full"):
            for zero in (2, 3):
                device = [planned(size, method, zero, n, 8)[0] for n in (1, 2, 4)]
                fits = " / ".join(verdict(d, GPU_GB) for d in device)
                sizes = " | ".join(f"{d:.1f}" for d in device)
                lines.append(f"| Qwen2.5-{size} | {method} | {zero} | {sizes} | {fits} |")
    lines.append("")
    lines.append("Qwen's claim, Q-LoRA of a 72B model on 4 nodes of one 24 GB GPU each:")
    lines.append("")
    for zero in (2, 3):
        device, host = planned("72B", "qlora", zero, 4, 1)
        fits = verdict(device, 24)
        lines.append(f"- ZeRO-{zero}: {device:.1f} GB a GPU ({fits} for 24 GB), {host:.1f} GB of host memory a node")
    return "\n".join(lines)


# Qwen (the first generation) measured its own fine-tuning scripts, on A100-SXM4-80G GPUs with flash attention 2, a
# micro-batch of 1, gradient accumulation 8 (QwenLM/Qwen's README, "Profiling of Memory and Speed"): GB at 256, 2,048
# and 8,192 tokens. Its models' shapes as Qwen2 config.json values (multi-head attention; Qwen's intermediate_size
# counts both halves of the gated MLP, halved here).
QWEN1 = {
    "1.8B": {"hidden_size": 2048, "intermediate_size": 5504, "num_hidden_layers": 24, "num_attention_heads": 16,
             "vocab_size": 151936},
    "7B": {"hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32, "num_attention_heads": 32,
           "vocab_size": 151936},
    "14B": {"hidden_size": 5120, "intermediate_size": 13696, "num_hidden_layers": 40, "num_attention_heads": 40,
            "vocab_size": 152064},
    "72B": {"hidden_size": 8192, "intermediate_size": 24576, "num_hidden_layers": 80, "num_attention_heads": 64,
            "vocab_size": 152064},
}  # fmt: skip
SEQUENCES = (256, 2048, 8192)
# (model, method, nodes, GPUs a node, ZeRO) -> Qwen's GB; its multi-GPU figures are read as the sum over the GPUs.
QWEN_MEASURED = {
    ("1.8B", "lora", 1, 1, 2): (6.7, 11.0, 21.8),
    ("1.8B", "qlora", 1, 1, 2): (5.8, 7.8, 15.8),
    ("1.8B", "full", 1, 1, 2): (43.5, 43.5, 48.3),
    ("7B", "lora", 1, 1, 2): (20.1, 23.8, 36.6),
    ("7B", "qlora", 1, 1, 2): (11.5, 13.9, 23.5),
    ("7B", "lora", 2, 2, 2): (74.7, 95.1, 155.5),
    ("14B", "lora", 1, 1, 2): (34.6, 37.4, 55.2),
    ("14B", "qlora", 1, 1, 2): (18.7, 19.9, 27.9),
    ("72B", "lora", 1, 4, 3): (215.4, 228.8, 289.2),
    ("72B", "qlora", 1, 1, 2): (61.4, 64.1, 75.6),
}
# Qwen's scripts' settings: LoRA r 64 (dropout 0.05) on every projection, gradient checkpointing, the loss over full
# logits (the HF model's).
QWEN_SETTINGS = [
    "train.micro_batch_size=1",
    "train.gradient_accumulation_steps=8",
    "train.gradient_checkpointing=true",
    "train.lora.r=64",
    "train.lora.dropout=0.05",
    "train.loss_chunk_tokens=0",
]


def planned_qwen1(size: str, method: str, nnodes: int, gpus: int, zero: int, seq: int) -> float:
    """The plan's GB a GPU for one of Qwen's measured configurations."""
    cfg = load_config(
        None,
        [
            *QWEN_SETTINGS,
            f"data.max_length={seq}",
            f"train.method={method}",
            f"launch.nnodes={nnodes}",
            f"launch.nproc_per_node={gpus}",
            f"deepspeed.config={ROOT / 'config' / 'deepspeed' / f'zero{zero}.json'}",
        ],
    )
    ds = resolve_from_train(read_deepspeed_json(cfg.deepspeed.config), cfg.train, cfg.world_size)
    memory = plan(cfg, ds, {**QWEN1[size], "tie_word_embeddings": False}, on_gpu=True)
    assert memory is not None
    return memory.device_bytes / GB


def published_table() -> str:
    lines = [
        "| Qwen model | method | GPUs (ZeRO) | 256 tokens: measured / planned | 2,048 | 8,192 |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for (size, method, nnodes, gpus, zero), measured in QWEN_MEASURED.items():
        world = nnodes * gpus
        cells = []
        for seq, total in zip(SEQUENCES, measured, strict=True):
            mine, theirs = planned_qwen1(size, method, nnodes, gpus, zero, seq), total / world
            cells.append(f"{theirs:.1f} / {mine:.1f} ({(mine - theirs) / theirs:+.0%})")
        where = f"{nnodes} x {gpus}" if nnodes > 1 else str(gpus)
        lines.append(f"| Qwen-{size} | {method} | {where} ({zero}) | {' | '.join(cells)} |")
    return "\n".join(lines)


def moe_table() -> str:
    """Qwen3-30B-A3B and Qwen3-235B-A22B by method, ZeRO stage and node count, on nodes of 8 x 80 GB (Q-LoRA is
    refused for a mixture of experts)."""
    lines = [
        f"| model | method | ZeRO | 1 node: GB a GPU | 2 nodes | 4 nodes | fits {GPU_GB} GB (1 / 2 / 4 nodes) |",
        "| --- | --- | --- | ---: | ---: | ---: | --- |",
    ]
    for size in QWEN3_MOE:
        for method in ("lora", "full"):
            for zero in (2, 3):
                device = [planned(size, method, zero, n, 8)[0] for n in (1, 2, 4)]
                fits = " / ".join(verdict(d, GPU_GB) for d in device)
                lines.append(
                    f"| Qwen3-{size} | {method} | {zero} | {' | '.join(f'{d:.1f}' for d in device)} | {fits} |"
                )
    return "\n".join(lines)


# The longest row by sequence-parallel size: ZeRO-3, one row a micro-batch (as sequence parallelism needs), unpacked,
# the rest as SETTINGS; 7B and 14B on one node of 8 GPUs, 72B on 4 (its full fine-tuning's states need them).
LONGEST_NODES = {"7B": 1, "14B": 1, "72B": 4}
SP_SIZES = (1, 2, 4, 8)


def longest_cell(size: str, method: str, sp: int) -> str:
    """The longest row the plan fits in 80 GB, and with the plan's error as a margin (80 / 1.25 GB), or the
    refusal's reason."""
    shape = QWEN25[size]
    if heads_problem(sp, shape["num_attention_heads"], shape["num_key_value_heads"]):
        return f"refused ({shape['num_attention_heads']} heads)"
    cfg, ds, model = configured(
        size, method, 3, LONGEST_NODES[size], 8, "data.packing=false", f"train.sequence_parallel_size={sp}"
    )
    longest = [longest_length(cfg, ds, model, int(gb * GB)) for gb in (GPU_GB, GPU_GB / (1 + PLAN_ERROR))]
    return " / ".join(f"{n:,}" if n is not None else "?" for n in longest)


def longest_table() -> str:
    """docs/long-sequences.md's table: the longest data.max_length (multiples of 1,024 tokens) by size."""
    lines = [
        "| model | method | nodes x 8 GPUs | " + " | ".join(f"size {sp}" for sp in SP_SIZES) + " |",
        "| --- | --- | ---: | " + " | ".join("---:" for _ in SP_SIZES) + " |",
    ]
    for size in QWEN25:
        for method in ("lora", "full"):
            cells = " | ".join(longest_cell(size, method, sp) for sp in SP_SIZES)
            lines.append(f"| Qwen2.5-{size} | {method} | {LONGEST_NODES[size]} | {cells} |")
    return "\n".join(lines)


if __name__ == "__main__":
    if sys.argv[1:] == ["--longest"]:
        print(longest_table())
        sys.exit(0)
    print(table())
    print()
    print(moe_table())
    print()
    print(published_table())
