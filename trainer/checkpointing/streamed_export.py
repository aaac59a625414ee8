"""Exports that never hold the whole model: a ZeRO-3 model written one gathered parameter at a time into safetensors
shards, and a LoRA adapter merged into its base one base shard at a time.

Both write Hugging Face's layout, so `from_pretrained` loads the result as it loads a published model: one
`model.safetensors`, or `model-0000i-of-0000n.safetensors` shards of at most `shard_bytes` each with
`model.safetensors.index.json` (`{"metadata": {"total_size"}, "weight_map": {name: shard}}`), as `save_pretrained` does.
Tied parameters are written once, under the name the model registered first (`model.embed_tokens.weight`; no
`lm_head.weight`), as `save_pretrained` writes them.

Memory: the ZeRO-3 export gathers one parameter at a time on every rank (a collective: every rank takes part, in the
same order) and rank 0 keeps at most one shard of copies; the merge reads one base shard, its LoRA pairs and writes
it before reading the next.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from typing import Any

import torch

from core.errors import UserError
from trainer.checkpointing.expert_merge import merge_expert_weight, split_expert_pairs

WEIGHTS = "model.safetensors"
INDEX = "model.safetensors.index.json"


class ShardWriter:
    """Tensors into numbered safetensors shards of at most `shard_bytes` (a larger tensor gets a shard of its own),
    named and indexed when closed."""

    def __init__(self, out: str, shard_bytes: int) -> None:
        self.out, self.shard_bytes = out, shard_bytes
        self.pending: dict[str, torch.Tensor] = {}
        self.pending_bytes = 0
        self.parts: list[list[str]] = []  # the names in each written part, in order
        self.total = 0

    def add(self, name: str, tensor: torch.Tensor) -> None:
        """Queue a tensor (a CPU copy the writer may keep), writing the current shard first when it would overflow."""
        size = tensor.numel() * tensor.element_size()
        if self.pending and self.pending_bytes + size > self.shard_bytes:
            self.flush()
        self.pending[name] = tensor.contiguous()
        self.pending_bytes += size
        self.total += size

    def flush(self) -> None:
        """Write the queued tensors as the next part."""
        from safetensors.torch import save_file

        if not self.pending:
            return
        save_file(self.pending, os.path.join(self.out, f".part-{len(self.parts)}"), metadata={"format": "pt"})
        self.parts.append(list(self.pending))
        self.pending, self.pending_bytes = {}, 0

    def close(self) -> list[str]:
        """Name the parts as Hugging Face does and write the index when there are several; the files written."""
        self.flush()
        count = len(self.parts)
        names = [WEIGHTS] if count == 1 else [f"model-{i + 1:05d}-of-{count:05d}.safetensors" for i in range(count)]
        for index, name in enumerate(names):
            os.replace(os.path.join(self.out, f".part-{index}"), os.path.join(self.out, name))
        if count > 1:
            weight_map = {tensor: names[i] for i, part in enumerate(self.parts) for tensor in part}
            index_doc = {"metadata": {"total_size": self.total}, "weight_map": dict(sorted(weight_map.items()))}
            with open(os.path.join(self.out, INDEX), "w", encoding="utf-8") as handle:
                json.dump(index_doc, handle, indent=2, sort_keys=True)
                handle.write("\n")
            names.append(INDEX)
        return names


def persistent_tensors(model: Any) -> Iterator[tuple[str, torch.nn.Parameter | torch.Tensor]]:
    """The model's parameters (tied ones once) and persistent buffers, in registration order, by state-dict name."""
    keys = set(model.state_dict().keys())
    yield from model.named_parameters()
    yield from ((name, buffer) for name, buffer in model.named_buffers() if name in keys)


def write_partitioned(model: Any, out: str, shard_bytes: int, is_main: bool) -> None:
    """Write a ZeRO-3 model's weights to `out` (rank 0), gathering one parameter at a time on every rank."""
    import deepspeed

    writer = ShardWriter(out, shard_bytes) if is_main else None
    for name, tensor in persistent_tensors(model):
        if isinstance(tensor, torch.nn.Parameter) and hasattr(tensor, "ds_id"):
            with deepspeed.zero.GatheredParameters([tensor], modifier_rank=None):
                if writer is not None:
                    writer.add(name, tensor.data.detach().to("cpu", copy=True))
        elif writer is not None:
            writer.add(name, tensor.detach().to("cpu", copy=True))
    if writer is not None:
        writer.close()


def base_tensors(model_path: str) -> Iterator[tuple[str, list[str]]]:
    """(safetensors file, the tensor names in it) of a model directory, in the order of its shards."""
    index = os.path.join(model_path, INDEX)
    if os.path.exists(index):
        with open(index, encoding="utf-8") as handle:
            weight_map: dict[str, str] = json.load(handle)["weight_map"]
        files: dict[str, list[str]] = {}
        for tensor, file in weight_map.items():
            files.setdefault(file, []).append(tensor)
        yield from ((os.path.join(model_path, file), names) for file, names in sorted(files.items()))
    elif os.path.exists(os.path.join(model_path, WEIGHTS)):
        yield os.path.join(model_path, WEIGHTS), []  # every tensor of the one file
    else:
        raise UserError(f"{model_path}: no {WEIGHTS} or {INDEX}; the merged export needs the base in safetensors")


def adapter_rank(adapter_dir: str) -> int:
    """The adapter's LoRA rank r (adapter_config.json)."""
    with open(os.path.join(adapter_dir, "adapter_config.json"), encoding="utf-8") as handle:
        return int(json.load(handle)["r"])


def lora_deltas(adapter_dir: str) -> dict[str, tuple[torch.Tensor, torch.Tensor, float]]:
    """{base module name: (A, B, scale)} of a PEFT LoRA adapter directory (scale alpha/r, alpha/sqrt(r) for rsLoRA)."""
    from safetensors.torch import load_file

    with open(os.path.join(adapter_dir, "adapter_config.json"), encoding="utf-8") as handle:
        config = json.load(handle)
    rank, alpha = int(config["r"]), float(config["lora_alpha"])
    scale = alpha / (rank**0.5 if config.get("use_rslora") else rank)
    weights = load_file(os.path.join(adapter_dir, "adapter_model.safetensors"))
    prefix = "base_model.model."
    out: dict[str, tuple[torch.Tensor, torch.Tensor, float]] = {}
    for key, a in weights.items():
        if ".lora_A." in key:
            module = key.split(".lora_A.")[0].removeprefix(prefix)
            out[module] = (a, weights[key.replace(".lora_A.", ".lora_B.")], scale)
    return out


def merge_streamed(
    model_path: str,
    adapter_dir: str,
    out: str,
    dtype: torch.dtype,
    shard_bytes: int,
    tied: bool,
    rename: Callable[[str], str] = str,
) -> None:
    """Base + LoRA adapter merged into plain weights at `out`, one base shard at a time: W + scale * B @ A (in float32,
    then `dtype`), every other tensor as the base has it (in `dtype`), under the base's own names. `rename`: a base
    tensor's name as the loaded model (and so the adapter) names it, where the two differ (Qwen2.5-VL's published
    checkpoints: trainer/model/vision.py `runtime_name`)."""
    from safetensors import safe_open

    deltas = lora_deltas(adapter_dir)
    experts = split_expert_pairs(deltas, adapter_rank(adapter_dir))
    if tied and "lm_head" in deltas:
        raise UserError(
            "train.export_merged: the adapter trains lm_head, whose weight the model ties to its input embeddings; "
            "merging it would change both: leave lm_head out of train.lora.target_modules, or export the adapter"
        )
    writer = ShardWriter(out, shard_bytes)
    merged = set()
    for file, names in base_tensors(model_path):
        with safe_open(file, "pt") as tensors:
            for name in names or list(tensors.keys()):
                weight = tensors.get_tensor(name)
                module = rename(name).removesuffix(".weight")
                if experts and (expert := merge_expert_weight(name, weight, experts)):
                    merged.add(expert[0])
                    weight = expert[1]
                elif module in deltas and name.endswith(".weight"):
                    a, b, scale = deltas[module]
                    weight = weight.float() + scale * (b.float() @ a.float())
                    merged.add(module)
                writer.add(name, weight.to(dtype))
    missing = sorted((set(deltas) | set(experts)) - merged)
    if missing:
        raise UserError(f"train.export_merged: adapter modules {missing[:3]} have no weight in {model_path}")
    writer.close()
