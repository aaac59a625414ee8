"""The exported model: {run}/final in Hugging Face format (a LoRA adapter or full weights, the tokenizer, with
`train.export_merged` a merged model), written by rank 0 and published with its manifest and COMPLETE last."""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
from typing import Any

from storage import layout
from storage.checkpoints import model_manifest
from storage.fs import Location, exists, join, read_json
from trainer import faults
from trainer.checkpointing.deepspeed_io import publish_dir
from trainer.distributed import Dist, barrier, gather_objects

log = logging.getLogger(__name__)


def export_final(
    engine: Any,
    *,
    run_url: Location,
    model_path: str,
    step: int,
    zero_stage: int,
    merged: bool,
    dist: Dist,
    algorithm: str,
    chat_template: str | None = None,
) -> Location:
    """Write the trained model to {run}/final in Hugging Face format (adapter or full), COMPLETE last; the
    tokenizer carries `chat_template` (model.chat_template's text) when given, so serving uses what staging used."""
    url = layout.final_dir(run_url)
    faults.maybe_late_export(dist.rank)
    done = exists(join(url, layout.COMPLETE)) and read_json(join(url, layout.MANIFEST)).get("step") == step
    # Rank 0's view decides, for every rank: a rank that looked only after rank 0 had published would return here
    # without the barrier below, and its next collective would meet rank 0's barrier.
    if gather_objects(done, dist)[0]:
        log.info("final model for step %d already exported at %s", step, url)
        return url
    model = engine.module
    gather: Any = contextlib.nullcontext()
    if zero_stage == 3:  # parameters are partitioned: gather them whole before saving
        import deepspeed

        # The last forward passes (the in-memory evaluation) can leave a prefetched parameter in flight: with tied
        # embeddings (Qwen2.5-0.5B/1.5B/3B), the one weight is both the first module's and the output layer's, and
        # leaving the gather below would then refuse to partition it. Wait for every fetch and release them first.
        engine.empty_partition_cache()
        gather = deepspeed.zero.GatheredParameters(list(model.parameters()), modifier_rank=None)
    staging = tempfile.mkdtemp(prefix="tandem-final-") if dist.is_main else ""
    with gather:
        if dist.is_main:
            model.save_pretrained(staging, safe_serialization=True)
    if dist.is_main:
        save_tokenizer(model_path, staging, chat_template)
        if merged and os.path.exists(os.path.join(staging, "adapter_config.json")):
            _merge_adapter(model_path, staging, os.path.join(staging, "merged"), chat_template)
        publish_dir(staging, url, algorithm, lambda files: model_manifest(step, algorithm, files))
    barrier()
    return url


def save_tokenizer(model_path: str, out: str, chat_template: str | None) -> None:
    """The base model's tokenizer, with `chat_template` replacing its own when given, saved to `out`."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    if chat_template is not None:
        tokenizer.chat_template = chat_template
    tokenizer.save_pretrained(out)


def _merge_adapter(model_path: str, adapter_dir: str, out: str, chat_template: str | None) -> None:
    """Base (full precision, even for Q-LoRA) + adapter merged into plain weights, saved to `out`."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(model_path)
    merged = PeftModel.from_pretrained(base, adapter_dir).merge_and_unload()
    merged.save_pretrained(out, safe_serialization=True)
    save_tokenizer(model_path, out, chat_template)
