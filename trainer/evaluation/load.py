"""The model to evaluate, from an exported directory (final/) or from a complete sharded checkpoint.

An export is loaded as users load it: `PeftModel.from_pretrained` on the spec's base for an adapter,
`from_pretrained` for full weights. A checkpoint is reassembled with DeepSpeed's zero_to_fp32 (ZeRO-2
and ZeRO-3 alike): its fp32 trainable weights are loaded onto a fresh base (+ the same LoRA wrapper
the trainer built), so the frozen base that LoRA checkpoints leave out comes from model.name_or_path.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from typing import Any

import torch

from config.methods import METHODS
from core.errors import UserError
from storage import layout
from storage.checkpoints import CompleteCheckpoint, read_complete
from storage.fs import exists, filesystem, find_sizes, get_file, read_json
from storage.location import Location, is_local, join, local_path
from storage.spec import Spec
from trainer.checkpointing.deepspeed_io import deepspeed_layout
from trainer.checkpointing.resume import verify_shared
from trainer.model.load import auto_class, model_config
from trainer.parallel.distributed import Dist

log = logging.getLogger(__name__)
DS_TAG = "merged"


def load_for_eval(model_url: Location, spec: Spec, device: torch.device, dist: Dist | None = None) -> Any:
    """The model at `model_url` (a checkpoints/step-N directory or an export with COMPLETE), in eval mode."""
    if is_checkpoint(model_url):
        ckpt = read_complete(model_url)
        if ckpt is None:
            raise UserError(
                f"--model {model_url}: the checkpoint is not complete (no {layout.COMPLETE} matching its "
                f"{layout.MANIFEST}); evaluate a complete checkpoint or final/"
            )
        return load_checkpoint_for_eval(ckpt, spec, device, dist)
    if not exists(join(model_url, layout.COMPLETE)):
        raise UserError(
            f"--model {model_url}: no {layout.COMPLETE} marker; only complete checkpoints "
            "(checkpoints/step-N) and exports (final/) can be evaluated"
        )
    return load_export(model_url, spec, device)


def is_checkpoint(model_url: Location) -> bool:
    """True when `model_url` holds a sharded checkpoint (its manifest says so), not an export."""
    try:
        return read_json(join(model_url, layout.MANIFEST)).get("schema") == layout.CHECKPOINT_SCHEMA
    except (FileNotFoundError, ValueError):
        return False


def eval_dtype(device: torch.device) -> torch.dtype:
    """bf16 on GPU, fp32 on CPU (as in training)."""
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def load_export(model_url: Location, spec: Spec, device: torch.device) -> Any:
    """A PEFT adapter on the spec's base, or full weights, through `from_pretrained`."""
    if is_local(model_url):
        return _from_pretrained(local_path(model_url), spec, device)
    # from_pretrained reads local directories only: an export on an object store is copied next to the
    # rank first, then dropped (the weights are in memory by then).
    root = tempfile.mkdtemp(prefix="tandem-export-")
    try:
        _, path = filesystem(model_url)
        for remote in find_sizes(model_url):
            relative = os.path.relpath(remote, path)
            target = os.path.join(root, relative)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            get_file(join(model_url, relative), target)
        return _from_pretrained(root, spec, device)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _from_pretrained(directory: str, spec: Spec, device: torch.device) -> Any:
    dtype = eval_dtype(device)
    remote = spec.config.model.trust_remote_code  # an export of a remote-code model carries its code files
    auto = auto_class(model_config(spec.model_path, trust_remote_code=remote))  # a vision-language model's own
    model: Any
    if os.path.exists(os.path.join(directory, "adapter_config.json")):
        from peft import PeftModel

        base = auto.from_pretrained(spec.model_path, dtype=dtype, trust_remote_code=remote)
        model = PeftModel.from_pretrained(base, directory)
    else:
        model = auto.from_pretrained(directory, dtype=dtype, trust_remote_code=remote)
    return model.to(device).eval()


def load_checkpoint_for_eval(ckpt: CompleteCheckpoint, spec: Spec, device: torch.device, dist: Dist | None) -> Any:
    """Base model (+ LoRA wrapper) with the checkpoint's trained weights loaded into it."""
    from trainer.model.adapters import make_trainable
    from trainer.model.load import load_base

    written, method = ckpt.manifest["method"], spec.config.train.method  # the manifest names its method
    if METHODS.get(written) is not method:
        raise UserError(
            f"--model {ckpt.url}: a {written} checkpoint, but the spec trains {method}; "
            "evaluate it with the spec.json of the run that wrote it"
        )
    if dist is not None:
        problem = verify_shared(ckpt, dist)
        if problem is not None:
            raise UserError(f"--model {ckpt.url}: {problem}; the checkpoint is corrupt, evaluate another one")
    state = trained_state_dict(ckpt)
    # Q-LoRA's adapter is evaluated on the full-precision base, exactly as its final/ export is.
    train = spec.config.train.model_copy(update={"method": method.evaluated_as, "gradient_checkpointing": False})
    remote = spec.config.model.trust_remote_code
    base = load_base(spec.model_path, method=train.method, bf16=False, trust_remote_code=remote)
    model = make_trainable(base, train, spec.config.model)
    expected = {name for name, p in model.named_parameters() if p.requires_grad}
    missing, extra = sorted(expected - set(state)), sorted(set(state) - set(model.state_dict()))
    if extra or (missing and not tied_only(model, missing)):
        raise UserError(
            f"--model {ckpt.url}: its weights do not fit the spec's model (missing {missing[:3]}, "
            f"unexpected {extra[:3]}); evaluate it with the spec.json of the run that wrote it"
        )
    model.load_state_dict(state, strict=False)
    log.info(
        "loaded %d trained tensors from %s (step %d, ZeRO-%d)",
        len(state),
        ckpt.url,
        ckpt.step,
        ckpt.manifest["zero_stage"],
    )
    return model.to(device=device, dtype=eval_dtype(device)).eval()


def tied_only(model: Any, missing: list[str]) -> bool:
    """True when the only missing weights are an output layer tied to the input embeddings."""
    return bool(getattr(model.config, "tie_word_embeddings", False)) and all(
        n.endswith("lm_head.weight") for n in missing
    )


def trained_state_dict(ckpt: CompleteCheckpoint) -> dict[str, torch.Tensor]:
    """fp32 trained weights of a checkpoint (frozen ones excluded), merged from every rank's shard."""
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    root = deepspeed_layout(ckpt, DS_TAG, lambda path: path.endswith(("_model_states.pt", "_optim_states.pt")))
    try:
        return get_fp32_state_dict_from_zero_checkpoint(root, tag=DS_TAG, exclude_frozen_parameters=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
