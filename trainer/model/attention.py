"""Attention (train.attention): which implementation a run's model computes attention with, resolved once, and the
micro-batch layout it takes.

- flash: flash-attention's variable-length kernel (`flash_attention_2`, PyPI `flash-attn`, CUDA). A micro-batch's
  rows are concatenated into one row with no padding at all (padding-free, as Hugging Face's
  `DataCollatorWithFlattening`), and the host hands the model the examples' boundaries (`cu_seq_lens_q/k`, the longest
  example's length) with it: transformers' flash path takes them as they are, instead of reading them back from the
  position ids in every layer (a device-to-host wait per layer, `_is_packed_sequence`).
- varlen: PyTorch's own variable-length flash attention (`torch.nn.attention.varlen.varlen_attn`, CUDA, nothing to
  install), the same padding-free layout and host-computed boundaries, through the attention function `varlen_attention`
  registered with transformers. No mask is built for it: the model's forward reads nothing back from the device.
- flex: PyTorch's FlexAttention with a document mask, which transformers builds from the restarting position ids of
  packed rows. Only when asked for: transformers compiles it for each new shape of a micro-batch, unmeasured here,
  and it has no backward pass on a CPU.
- sdpa: PyTorch's scaled-dot-product attention; packed rows get the block-diagonal causal mask transformers builds
  from their position ids (trainer/data.py). The CPU's path, and the one DeepSpeed's Ulysses wraps
  (train.sequence_parallel_size).

`auto` takes, on a CUDA device with sequences not split, flash where flash-attn imports, else varlen where this torch
has it; sdpa elsewhere.
"""

from __future__ import annotations

import enum
import importlib.util
import logging
from typing import Any

import torch

from core.errors import UserError

log = logging.getLogger(__name__)


class Attention(enum.Enum):
    """An attention implementation, by the name transformers' `attn_implementation` takes."""

    SDPA = "sdpa"
    FLASH = "flash_attention_2"
    VARLEN = "tandem_varlen"  # registered with transformers by `register`
    FLEX = "flex_attention"

    @property
    def varlen(self) -> bool:
        """Whether micro-batches are flattened into one padding-free row with their boundaries (trainer/data.py
        `collate_flat`)."""
        return self in (Attention.FLASH, Attention.VARLEN)


def flash_missing(device: torch.device) -> str | None:
    """Why flash-attention cannot run on `device` here, or None when it can."""
    if device.type != "cuda":
        return f"its kernels need a CUDA device, and this run's is {device.type}"
    if importlib.util.find_spec("flash_attn") is None:
        return "the flash-attn package is not installed"
    return None


def varlen_missing(device: torch.device) -> str | None:
    """Why PyTorch's variable-length attention cannot run on `device` here, or None when it can."""
    if device.type != "cuda":
        return f"its kernel needs a CUDA device, and this run's is {device.type}"
    if importlib.util.find_spec("torch.nn.attention.varlen") is None:
        return f"torch {torch.__version__} has no torch.nn.attention.varlen (PyTorch 2.10 or newer has)"
    return None


def resolve(setting: str, device: torch.device, sequence_parallel: int = 1, *, supervised: bool = True) -> Attention:
    """The attention of train.attention `setting` (auto, sdpa, flash, varlen, flex) on `device`; one that cannot run
    here is a UserError (the config refuses all but sdpa with sequence parallelism, and varlen for preference
    objectives, whose pairs are not flattened: `supervised` false, where auto never takes varlen)."""
    if setting == "sdpa" or (setting == "auto" and sequence_parallel > 1):
        return Attention.SDPA
    if setting == "flex":
        if device.type == "cpu":
            raise UserError(
                f"train.attention=flex cannot train on a CPU: torch {torch.__version__}'s FlexAttention has no "
                "backward pass there; set train.attention to auto or sdpa"
            )
        return Attention.FLEX
    flash, varlen = flash_missing(device), varlen_missing(device)
    if setting == "flash" and flash is not None:
        raise UserError(
            f"train.attention=flash cannot run: {flash}; set train.attention to auto (variable-length attention where "
            "it can run) or sdpa, or run on a CUDA device with flash-attn installed (pip install flash-attn "
            "--no-build-isolation)"
        )
    if setting == "varlen" and varlen is not None:
        raise UserError(
            f"train.attention=varlen cannot run: {varlen}; set train.attention to auto (variable-length attention "
            "where it can run) or sdpa"
        )
    if setting in ("flash", "auto") and flash is None:
        return Attention.FLASH
    if (setting == "varlen" or (setting == "auto" and supervised)) and varlen is None:
        return register()
    return Attention.SDPA


def register() -> Attention:
    """Make `varlen_attention` an attention implementation transformers can load a model with (idempotent)."""
    from transformers import AttentionInterface

    AttentionInterface.register(Attention.VARLEN.value, varlen_attention)
    return Attention.VARLEN


def varlen_kernel(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, **kwargs: Any) -> torch.Tensor:
    """PyTorch's variable-length flash attention (a name of its own so that a CPU test can stand in for it)."""
    from torch.nn.attention.varlen import varlen_attn

    out = varlen_attn(query, key, value, **kwargs)
    assert isinstance(out, torch.Tensor), "varlen_attn returns the output alone without return_aux"
    return out


def varlen_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """A transformers attention function: causal attention within each example of a flattened micro-batch (query
    (1, heads, tokens, dim), key and value with the model's key-value heads), by the boundaries the model was handed
    (`cu_seq_lens_q`, `max_length_q`: trainer/data.py `collate_flat`), with the layer's `scaling`, `dropout` and
    `sliding_window` among the keyword arguments; returns (1, tokens, heads, dim)."""
    bounds = kwargs.get("cu_seq_lens_q")
    scaling, dropout, sliding_window = kwargs.get("scaling"), kwargs.get("dropout", 0.0), kwargs.get("sliding_window")
    if bounds is None or query.shape[0] != 1 or attention_mask is not None:
        raise UserError(
            "train.attention=varlen: the model was called without a flattened micro-batch's boundaries (only "
            "supervised fine-tuning's micro-batches are flattened); set train.attention to sdpa"
        )
    if dropout:
        raise UserError(f"train.attention=varlen: the model's attention dropout is {dropout}; set it to 0 or use sdpa")
    # CUDA's flash kernels take 16-bit values; PEFT may hand float32 ones back (transformers' flash path casts the same
    # way). A CPU test's stand-in computes in the model's float32.
    dtype = query.dtype
    half = dtype if dtype in (torch.float16, torch.bfloat16) or not query.is_cuda else torch.bfloat16
    out = varlen_kernel(
        *(tensor[0].transpose(0, 1).to(half) for tensor in (query, key, value)),  # (tokens, heads, dim)
        cu_seq_q=bounds,
        cu_seq_k=kwargs.get("cu_seq_lens_k", bounds),
        max_q=kwargs["max_length_q"],
        max_k=kwargs.get("max_length_k", kwargs["max_length_q"]),
        scale=scaling,
        window_size=(sliding_window - 1, 0) if sliding_window else (-1, 0),
        enable_gqa=query.shape[1] != key.shape[1],
    )
    return out.to(dtype).unsqueeze(0), None


def announce(attention: Attention) -> None:
    """Say once which attention the run computes with, and the layout of its micro-batches."""
    layout = "micro-batches flattened into one padding-free row" if attention.varlen else "padded micro-batches"
    log.info("attention: %s (train.attention), %s", attention.value, layout)
