"""The memory plan's table for docs/memory-plan.md: Qwen2.5-7B, 14B and 72B (their published config.json values) by
method, ZeRO stage and node count, on nodes of 8 GPUs of 80 GB, and Qwen's "Q-LoRA 72B on 4 single-GPU nodes of
24 GB" claim.

    .venv/bin/python tools/memory_table.py          # prints the Markdown that the page holds between its markers

tests/unit/test_memory_plan.py checks that the page holds what this prints.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from config.deepspeed import read_deepspeed_json, resolve_from_train
from config.loader import load_config
from config.memory_plan import GB, PLAN_ERROR, plan

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


def planned(size: str, method: str, zero: int, nnodes: int, gpus: int) -> tuple[float, float]:
    """(device GB a rank, host GB a node) of one configuration."""
    cfg = load_config(
        None,
        [
            *SETTINGS,
            f"train.method={method}",
            f"launch.nnodes={nnodes}",
            f"launch.nproc_per_node={gpus}",
            f"deepspeed.config={ROOT / 'config' / 'deepspeed' / f'zero{zero}.json'}",
        ],
    )
    ds = resolve_from_train(read_deepspeed_json(cfg.deepspeed.config), cfg.train, cfg.world_size)
    memory = plan(cfg, ds, {**QWEN25[size], **COMMON}, on_gpu=True)
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


if __name__ == "__main__":
    print(table())
