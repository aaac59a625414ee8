"""The exported model: {run}/final in Hugging Face format (a LoRA adapter or full weights in shards with an index,
the tokenizer, with `train.export_merged` a merged model), written by rank 0 and published with its manifest and
COMPLETE last. Under ZeRO-3 the weights are gathered one parameter at a time and a merge reads one base shard at a
time (trainer/checkpointing/streamed_export.py): no rank holds the whole model."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from config.vision import PROCESSOR_FILES, PROCESSOR_TEMPLATE, is_vision_language
from storage import layout
from storage.checkpoints import model_manifest
from storage.fs import exists, read_json
from storage.location import Location, join
from trainer.checkpointing.deepspeed_io import publish_dir
from trainer.checkpointing.streamed_export import merge_streamed, write_partitioned
from trainer.metrics import log_memory
from trainer.model.load import parameter_count
from trainer.model.vision import runtime_name
from trainer.parallel.distributed import Dist, barrier, gather_objects
from trainer.parallel.moe import adapter_summary
from trainer.watch.faults import NO_FAULTS, Faults

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ExportSettings:
    """How a run's final model is exported: the run's directory, the base model's directory (its tokenizer, its code),
    the ZeRO stage, whether a merged copy is written beside an adapter (train.export_merged), the weights' shard size,
    the digest algorithm, the chat template staging used (model.chat_template's text) and model.trust_remote_code."""

    run_url: Location
    model_path: str
    zero_stage: int
    merged: bool
    shard_bytes: int
    algorithm: str
    chat_template: str | None = None
    trust_remote_code: bool = False


def export_final(engine: Any, step: int, settings: ExportSettings, dist: Dist, faults: Faults = NO_FAULTS) -> Location:
    """Write the trained model to {run}/final in Hugging Face format (adapter or full, in shards of at most the shard
    size with an index), COMPLETE last; the tokenizer carries the chat template when given, so serving uses what staging
    used. With trust_remote_code full and merged weights carry the base directory's code files, so they load as the
    base does. Under ZeRO-3 no rank ever gathers the whole model."""
    s = settings
    url = layout.final_dir(s.run_url)
    faults.before_export(dist.rank)
    done = exists(join(url, layout.COMPLETE)) and read_json(join(url, layout.MANIFEST)).get("step") == step
    # Rank 0's view decides, for every rank: a rank that looked only after rank 0 had published would return here
    # without the barrier below, and its next collective would meet rank 0's barrier.
    if gather_objects(done, dist)[0]:
        log.info("final model for step %d already exported at %s", step, url)
        return url
    model = engine.module
    staging = tempfile.mkdtemp(prefix="tandem-final-") if dist.is_main else ""
    log_memory("exporting")
    save_weights(engine, model, staging, s.zero_stage, s.shard_bytes, dist.is_main)
    log_memory("weights exported")
    if dist.is_main:
        save_tokenizer(s.model_path, staging, s.chat_template, trust_remote_code=s.trust_remote_code)
        adapter = os.path.exists(os.path.join(staging, "adapter_config.json"))
        if s.trust_remote_code and not adapter:
            copy_model_code(s.model_path, staging)
        if s.merged and adapter:
            dtype = torch.bfloat16 if engine.device.type == "cuda" else torch.float32
            merged_dir = os.path.join(staging, "merged")
            merge_adapter(
                s.model_path,
                staging,
                merged_dir,
                s.chat_template,
                dtype,
                s.shard_bytes,
                trust_remote_code=s.trust_remote_code,
            )
        publish_dir(staging, url, s.algorithm, lambda files: model_manifest(step, s.algorithm, files))
    barrier()
    return url


def save_weights(engine: Any, model: Any, out: str, zero_stage: int, shard_bytes: int, is_main: bool) -> None:
    """The trained weights into `out` (rank 0): an adapter by PEFT's save_pretrained, full weights in shards. Under
    ZeRO-3 every rank takes part: full weights are gathered one parameter at a time (streamed_export.py), an adapter's
    own parameters only, and the frozen base stays partitioned."""
    adapter = hasattr(model, "peft_config")
    if adapter and is_main:
        write_adapter_summary(model, out)
    if zero_stage != 3:
        if is_main:
            model.save_pretrained(out, safe_serialization=True, **({} if adapter else {"max_shard_size": shard_bytes}))
        return
    import deepspeed

    # The last forward passes (the in-memory evaluation) can leave a prefetched parameter in flight: with tied
    # embeddings (Qwen2.5-0.5B/1.5B/3B), the one weight is both the first module's and the output layer's, and a
    # gather's end would then refuse to partition it. Wait for every fetch and release them first.
    engine.empty_partition_cache()
    if adapter:
        trained = [p for p in model.parameters() if p.requires_grad]
        with deepspeed.zero.GatheredParameters(trained, modifier_rank=None):
            if is_main:
                model.save_pretrained(out, safe_serialization=True)
        return
    write_partitioned(model, out, shard_bytes, is_main)
    if is_main:
        model.config.save_pretrained(out)
        if getattr(model, "generation_config", None) is not None:
            model.generation_config.save_pretrained(out)


def write_adapter_summary(model: Any, out: str) -> None:
    """{final}/adapters.json: the modules and parameters that got adapters and the trainable share (the model card's
    row), from the trained model itself."""
    summary = adapter_summary(model, parameter_count(model, trainable=True), parameter_count(model))
    with open(os.path.join(out, layout.ADAPTERS), "w", encoding="utf-8") as handle:
        json.dump(summary.to_json(), handle, indent=2)
        handle.write("\n")


def copy_model_code(model_path: str, out: str) -> list[str]:
    """The base directory's Python files (a remote-code model's configuration and modeling classes, which its
    config.json's auto_map names) copied into `out`: the exported config keeps the auto_map, so the export loads with
    `trust_remote_code=True` as the base does. The names copied."""
    names = sorted(path.name for path in Path(model_path).glob("*.py"))
    for name in names:
        shutil.copyfile(os.path.join(model_path, name), os.path.join(out, name))
    return names


def save_tokenizer(model_path: str, out: str, chat_template: str | None, *, trust_remote_code: bool = False) -> None:
    """The base model's tokenizer, with `chat_template` replacing its own when given, saved to `out`, and a
    vision-language model's processor files beside it (its image processor's config, its chat template: `chat_template`
    there too when given), so the export loads with AutoImageProcessor and AutoTokenizer as the base does."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path, trust_remote_code=trust_remote_code)
    if chat_template is not None:
        tokenizer.chat_template = chat_template
    tokenizer.save_pretrained(out)
    for name in PROCESSOR_FILES:
        if os.path.isfile(os.path.join(model_path, name)):
            shutil.copyfile(os.path.join(model_path, name), os.path.join(out, name))
    if chat_template is not None and os.path.isfile(os.path.join(out, PROCESSOR_TEMPLATE)):
        with open(os.path.join(out, PROCESSOR_TEMPLATE), "w", encoding="utf-8") as handle:
            json.dump({"chat_template": chat_template}, handle, indent=2)


def merge_adapter(
    model_path: str,
    adapter_dir: str,
    out: str,
    chat_template: str | None,
    dtype: torch.dtype,
    shard_bytes: int,
    *,
    trust_remote_code: bool = False,
) -> None:
    """Base (full precision, even for Q-LoRA, in the training dtype) + adapter merged into plain weights at `out`,
    one base shard at a time (streamed_export.merge_streamed), with the base's config and the tokenizer (and, with
    `trust_remote_code`, the base's code files)."""
    from transformers import AutoConfig, GenerationConfig

    os.makedirs(out, exist_ok=True)
    config = AutoConfig.from_pretrained(model_path, trust_remote_code=trust_remote_code)
    tied = bool(getattr(config, "tie_word_embeddings", False))
    rename = runtime_name if is_vision_language(config.to_dict()) else str
    merge_streamed(model_path, adapter_dir, out, dtype, shard_bytes, tied, rename)
    config.dtype = dtype
    config.save_pretrained(out)
    with contextlib.suppress(OSError):  # a base without generation_config.json
        GenerationConfig.from_pretrained(model_path).save_pretrained(out)
    save_tokenizer(model_path, out, chat_template, trust_remote_code=trust_remote_code)
    if trust_remote_code:
        copy_model_code(model_path, out)
