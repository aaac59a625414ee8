"""The model's construction on a rank: the base loaded (partitioned under ZeRO-3 while a `PartitionedLoad` is alive)
with the attention the run chose, its pad id, the kernels patched in, the trainable part (full, LoRA, Q-LoRA) and ALST's
tiled MLP; and the regional compile, the last step before the engine. trainer/build.py calls them in order."""

from __future__ import annotations

import logging

import torch

from storage.node_cache import cache_root
from storage.spec import Spec
from trainer.metrics import log_memory
from trainer.model import attention, compiled, kernels, tiled_mlp
from trainer.model.adapters import make_trainable
from trainer.model.choices import Choices
from trainer.model.load import ensure_pad_token_id, load_base
from trainer.model.vision import is_vision_model, language_model, run_vision_always, trains_vision

log = logging.getLogger(__name__)


def build_model(spec: Spec, choices: Choices, *, partitioned: bool) -> tuple[torch.nn.Module, int]:
    """(the trainable model, the pad id) of the spec's base for its method, computing with `choices`; `partitioned`:
    whether ZeRO-3 partitions it as it loads (for the log)."""
    train, remote = spec.config.train, spec.config.model.trust_remote_code
    log_memory("before loading the model")
    base = load_base(
        spec.model_path,
        method=train.method,
        bf16=choices.bf16,
        zero3=choices.zero3,
        trust_remote_code=remote,
        attention=choices.load_attention,
    )
    attention.announce(choices.attention)
    log_memory("model loaded" + (" (partitioned by ZeRO-3)" if partitioned else ""))
    pad_id = ensure_pad_token_id(base, spec.model_path, trust_remote_code=remote)
    kernels.announce(base, choices.kernels)  # on the transformers model, before PEFT wraps it
    model = make_trainable(base, train, spec.config.model)
    vision = is_vision_model(base)
    if vision and (choices.zero3 or trains_vision(model)):
        run_vision_always(model)  # every rank's every pass runs the tower: ZeRO-3's gathers, its gradients
    if train.tiled_mlp:
        tiled_mlp.tile_mlps(language_model(model) if vision else model)
    return model, pad_id


def compile_model(model: torch.nn.Module, spec: Spec) -> None:
    """With train.compile, each decoder layer compiled (lazily: at its first call), its caches on the node."""
    if spec.config.train.compile:
        compiled.compile_layers(model, cache_root(spec.config.launch.node_cache_dir))
