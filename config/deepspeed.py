"""Fill DeepSpeed's `"auto"` values, the way Hugging Face's integration does, from one source of truth.

Qwen's `ds_config_zero2.json` / `ds_config_zero3.json` are accepted unchanged. Resolution happens in
two places because the values come from two places:
- in the flow, before spec.json is written (so that spec.json records them): batch sizes, optimizer and clipping
  from `train` and the world size (`resolve_from_train`), ZeRO's bucket sizes and ZeRO-3's limits on gathered
  parameters from the model's shape in its config.json (`resolve_from_model`);
- on each rank (`resolve_from_runtime`): precision from the hardware (and the model's shape for a spec written
  without it).
Anything still `"auto"` after both is an error naming its key.

ZeRO-3's `stage3_max_live_parameters` and `stage3_max_reuse_distance` ("auto" in config/deepspeed/zero3.json) become
two decoder layers' parameters: a rank keeps at most about that much gathered beyond the module it computes, so its
memory follows the layer, not the model (DeepSpeed's own default, 1e9, is more than a whole 0.5B model).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from config.batch import accumulation_steps
from config.sections.model_train import TrainConfig
from config.vision import language_view
from core.errors import UserError

AUTO = "auto"


def read_deepspeed_json(path: str) -> dict[str, Any]:
    """The DeepSpeed config file as a dict, or a UserError naming the file and line."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise UserError(f"deepspeed.config {path}:{exc.lineno}: invalid JSON ({exc.msg})") from None
    except OSError as exc:
        raise UserError(f"deepspeed.config {path}: cannot read ({exc.strerror})") from None
    if not isinstance(data, dict):
        raise UserError(f"deepspeed.config {path}: must hold a JSON object")
    return data


def _set_auto(section: dict[str, Any], key: str, value: Any) -> None:
    if section.get(key) == AUTO:
        section[key] = value


def resolve_from_train(ds: dict[str, Any], train: TrainConfig, world_size: int) -> dict[str, Any]:
    """Fill the `"auto"` values that come from `train` and the world size; check explicit ones agree."""
    out = copy.deepcopy(ds)
    # DeepSpeed counts a batch over the ranks that read different rows: one per sequence group.
    readers = max(world_size // train.sequence_parallel_size, 1)
    accumulation = accumulation_steps(
        train.global_batch_size, train.micro_batch_size, train.gradient_accumulation_steps, readers
    )
    wanted = {
        "train_micro_batch_size_per_gpu": train.micro_batch_size,
        "gradient_accumulation_steps": accumulation,
        "train_batch_size": train.micro_batch_size * accumulation * readers,
    }
    for key, value in wanted.items():
        if key not in out or out[key] == AUTO:
            out[key] = value
        elif out[key] != value:
            raise UserError(
                f"deepspeed.config sets {key}={out[key]} but train gives {value}; "
                f'set it to "auto" or change train.micro_batch_size/gradient_accumulation_steps/global_batch_size'
            )
    _set_auto(out, "gradient_clipping", train.max_grad_norm)
    out.setdefault("gradient_clipping", train.max_grad_norm)
    optimizer = out.setdefault("optimizer", {"type": "AdamW", "params": {}})
    params = optimizer.setdefault("params", {})
    from_train: dict[str, Any] = {
        "lr": train.learning_rate,
        "betas": [train.adam_beta1, train.adam_beta2],
        "eps": train.adam_epsilon,
        "weight_decay": train.weight_decay,
    }
    for key, setting in from_train.items():
        if params.get(key, AUTO) == AUTO:
            params[key] = setting
    # The schedule is owned by train.lr_scheduler/warmup_ratio (applied by the trainer), so a
    # DeepSpeed scheduler block (Qwen's configs carry WarmupLR with "auto") is dropped, not obeyed twice.
    out.pop("scheduler", None)
    return out


@dataclass(frozen=True)
class ModelShape:
    """What DeepSpeed's size settings depend on: the hidden size and the parameters of one decoder layer."""

    hidden_size: int
    layer_params: int

    @classmethod
    def of(cls, config: dict[str, Any]) -> ModelShape:
        """From a Hugging Face config.json (a decoder-only transformer: grouped-KV attention, a gated MLP; a
        vision-language model's language model)."""
        config = language_view(config)
        try:
            hidden = int(config["hidden_size"])
            heads = int(config["num_attention_heads"])
            kv_heads = int(config.get("num_key_value_heads") or heads)
            head_dim = int(config.get("head_dim") or hidden // heads)
            intermediate = int(config.get("intermediate_size") or 4 * hidden)
        except (KeyError, TypeError, ValueError) as exc:
            raise UserError(
                f"model config.json: cannot read the model's shape ({exc!r}); is it a causal LM or a vision-language "
                "model (Qwen2.5-VL, Qwen3-VL)?"
            ) from None
        attention = hidden * head_dim * (2 * heads + 2 * kv_heads)  # q and o, k and v
        return cls(hidden, attention + 3 * hidden * intermediate + 2 * hidden)


def resolve_from_model(ds: dict[str, Any], shape: ModelShape) -> dict[str, Any]:
    """Fill ZeRO's bucket sizes from the hidden size (as Hugging Face's integration does) and ZeRO-3's live and reuse
    limits from the layer size (two layers' parameters)."""
    out = copy.deepcopy(ds)
    zero = out.get("zero_optimization", {})
    hidden = shape.hidden_size
    _set_auto(zero, "reduce_bucket_size", hidden * hidden)
    _set_auto(zero, "stage3_prefetch_bucket_size", int(0.9 * hidden * hidden))
    _set_auto(zero, "stage3_param_persistence_threshold", 10 * hidden)
    _set_auto(zero, "stage3_max_live_parameters", 2 * shape.layer_params)
    _set_auto(zero, "stage3_max_reuse_distance", 2 * shape.layer_params)
    return out


def resolve_from_runtime(ds: dict[str, Any], *, bf16: bool, shape: ModelShape) -> dict[str, Any]:
    """Fill precision (and the model's sizes, for a spec written without them), then refuse any `"auto"` left
    over."""
    out = resolve_from_model(ds, shape)
    bf16_section = out.setdefault("bf16", {})
    _set_auto(bf16_section, "enabled", bf16)
    fp16_section = out.get("fp16")
    if isinstance(fp16_section, dict):
        _set_auto(fp16_section, "enabled", False)
    leftover = list(_auto_keys(out))
    if leftover:
        raise UserError(f'deepspeed.config: cannot resolve "auto" for {", ".join(leftover)}; give explicit values')
    return out


def zero_stage(ds: dict[str, Any]) -> int:
    """The ZeRO stage of a DeepSpeed config (0 when absent)."""
    return int(ds.get("zero_optimization", {}).get("stage", 0))


def _auto_keys(tree: Any, prefix: str = "") -> Iterator[str]:
    if isinstance(tree, dict):
        for key, value in tree.items():
            yield from _auto_keys(value, f"{prefix}{key}.")
    elif tree == AUTO:
        yield prefix.rstrip(".")
