"""Resume on another world size: a checkpoint written by N ranks loaded by M, through DeepSpeed's universal checkpoint.

Why DeepSpeed's universal form and not our own re-partitioning of the gathered fp32 state: ZeRO-1/2/3 flatten, pad
and align each parameter group differently per stage and per world size, and the optimizer state (Adam's moments, its
step) lives in those flat partitions. `ds_to_universal` already undoes that per parameter (fp32 weight, exp_avg,
exp_avg_sq, step: one file each, no world size in them) and every stage's optimizer loads it back into its own
partitions (`load_universal`). Our own version would re-implement DeepSpeed's private partition layout and break
with its next release; this way DeepSpeed owns its layout and Tandem owns the bytes on storage.

The conversion runs once, on rank 0, while the other ranks wait: the checkpoint's files in DeepSpeed's layout, the
converted form staged locally and published to `{checkpoint}/universal/` with its own manifest (tandem.universal/1,
naming the checkpoint it came from by its manifest digest) and COMPLETE. Every rank then verifies it like any
checkpoint before loading, and a later resume on another world size reuses it.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import random
import shutil
import tempfile
import time
from argparse import Namespace
from typing import Any

import numpy as np
import torch

from core.errors import RetryableError, UserError
from storage import layout
from storage.checkpoints import CompleteCheckpoint, read_universal, remove_dir, universal_manifest
from trainer.checkpointing.deepspeed_io import DS_TAG, TRAINER_STATE, deepspeed_layout, publish_dir
from trainer.checkpointing.resume import verify_shared
from trainer.parallel.distributed import Dist, barrier

log = logging.getLogger(__name__)


def convert(ckpt: CompleteCheckpoint, algorithm: str) -> tuple[int, float]:
    """Write the universal form of `ckpt` beside it (manifest and COMPLETE last); returns (bytes, seconds)."""
    from deepspeed.checkpoint import ds_to_universal

    started = time.perf_counter()
    source = deepspeed_layout(ckpt, DS_TAG, lambda path: not path.endswith(TRAINER_STATE))
    staging = tempfile.mkdtemp(prefix="tandem-universal-")
    args = Namespace(
        input_folder=os.path.join(source, DS_TAG),
        output_folder=staging,
        num_extract_workers=1,
        num_merge_workers=1,
        keep_temp_folder=False,
        strict=True,
        inject_missing_state=True,
    )
    chatter = io.StringIO()  # the converter prints its progress; keep it out of the rank's log unless it fails
    try:
        with contextlib.redirect_stdout(chatter), contextlib.redirect_stderr(chatter):
            ds_to_universal.main(args)
    except Exception:
        log.error("DeepSpeed's universal conversion of %s failed; its output:\n%s", ckpt.url, chatter.getvalue())
        shutil.rmtree(staging, ignore_errors=True)
        raise
    finally:
        shutil.rmtree(source, ignore_errors=True)
    size = publish_dir(
        staging, layout.universal_dir(ckpt.url), algorithm, lambda files: universal_manifest(ckpt, algorithm, files)
    )
    return size, time.perf_counter() - started


def universal_form(ckpt: CompleteCheckpoint, dist: Dist, algorithm: str) -> CompleteCheckpoint:
    """The verified universal form of `ckpt`: reused when complete, else converted by rank 0 first."""
    if dist.is_main and read_universal(ckpt) is None:
        size, seconds = convert(ckpt, algorithm)
        log.info(
            "converted checkpoint step %d from %d ranks to the universal form: %.1f MB in %.2f s (%.2f s/GB) at %s",
            ckpt.step,
            ckpt.manifest["world_size"],
            size / 1e6,
            seconds,
            seconds / max(size / 1e9, 1e-9),
            layout.universal_dir(ckpt.url),
        )
    elif dist.is_main:
        log.info("reusing the universal form of checkpoint step %d", ckpt.step)
    barrier()
    found = read_universal(ckpt)
    problem = "missing after the conversion" if found is None else verify_shared(found, dist)
    if problem or found is None:
        barrier()
        if dist.is_main:
            remove_dir(layout.universal_dir(ckpt.url))  # the retry converts again
        raise RetryableError(f"{layout.universal_dir(ckpt.url)}: {problem}; it was removed, a retry converts again")
    return found


def check_sequence_groups(manifest: dict[str, Any], dist: Dist) -> None:
    """A checkpoint of another world size is loaded through DeepSpeed's universal form, and neither end may have
    sequence-parallel groups: DeepSpeed records a writer's sequence groups as model parallelism, which its conversion
    cannot merge, and its universal loader asks the reader's groups for tensor parallelism, which Ulysses' groups lack.
    Refused before any conversion, naming both layouts. (On the world size that wrote it, any sequence-parallel size
    loads it: ZeRO partitions over every rank either way.) A manifest without `sequence_parallel_size` was written
    before sequence parallelism existed: size 1."""
    written_world, written_size = manifest["world_size"], manifest.get("sequence_parallel_size", 1)
    if written_world == dist.world_size or (written_size == 1 and dist.sequence_parallel == 1):
        return
    raise UserError(
        f"checkpoint step {manifest['step']} was written by {written_world} ranks at train.sequence_parallel_size="
        f"{written_size} and this run has {dist.world_size} ranks at {dist.sequence_parallel}; DeepSpeed converts a "
        "checkpoint to another world size only without sequence parallelism on either side: resume it on "
        f"{written_world} ranks (any train.sequence_parallel_size; one saved there at size 1 then resumes on any "
        "world size)"
    )


def load_resharded(
    engine: Any, ckpt: CompleteCheckpoint, dist: Dist, *, frozen_excluded: bool, algorithm: str, seed: int
) -> int:
    """Load a checkpoint of another world size (model, optimizer, scheduler) through its universal form; returns
    the step to continue from."""
    universal = universal_form(ckpt, dist, algorithm)
    root = deepspeed_layout(universal, DS_TAG, lambda path: True, flatten=False)
    engine._config.load_universal_checkpoint = True  # read by DeepSpeed at load time only
    try:
        path, _ = engine.load_checkpoint(
            root,
            tag=DS_TAG,
            load_module_strict=not frozen_excluded,
            load_optimizer_states=True,
            load_lr_scheduler_states=True,
        )
    finally:
        engine._config.load_universal_checkpoint = False
        shutil.rmtree(root, ignore_errors=True)
    if path is None:
        raise RetryableError(f"{universal.url}: DeepSpeed could not load the universal form; see the log above")
    reseed(seed, dist.rank, ckpt.step)
    log.info(
        "resumed from step %d written by %d ranks, now on %d (%s)",
        ckpt.step,
        ckpt.manifest["world_size"],
        dist.world_size,
        universal.url,
    )
    return ckpt.step


def reseed(seed: int, rank: int, step: int) -> None:
    """Per-rank random streams (dropout) after a change of world size: the old ranks' streams do not map onto the
    new ranks, so each rank starts one from (seed, rank, step), the same on every retry."""
    mixed = (seed * 1_000_003 + step) * 65_537 + rank
    random.seed(mixed)
    np.random.seed(mixed % 2**32)
    torch.manual_seed(mixed)
