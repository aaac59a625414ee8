"""Resume: pick a checkpoint (`train.resume: auto|never|URL`), verify it and check it fits (loading it is
trainer/checkpointing/deepspeed_io.py's).

`auto` takes the run's newest checkpoint that is complete and whose every file matches its digest;
a checkpoint that fails verification is skipped with a warning naming the file, and so is any newer
directory that is not complete. One that had been committed (it has COMPLETE) but whose manifest or
marker no longer match is damaged, not unfinished: it is moved aside for inspection like a corrupt one,
rather than left for the next save of that step to delete. An explicit URL that
fails is an error. A checkpoint written with another world size is loaded through its universal form
(trainer/checkpointing/reshard.py); one written with another ZeRO stage or method is refused with what differs and what
to do: the trained parameters and the optimizer's layout differ, so there is nothing to convert.
"""

from __future__ import annotations

import logging
import time

from config.methods import METHODS, Method
from core.errors import UserError
from storage import layout
from storage.checkpoints import CompleteCheckpoint, inspect, read_complete, step_dirs
from storage.digest import digest_url
from storage.fs import exists, filesystem
from storage.location import Location, join
from trainer.parallel.distributed import Dist, barrier, gather_objects

log = logging.getLogger(__name__)


def verify_shared(ckpt: CompleteCheckpoint, dist: Dist) -> str | None:
    """Full digest check, the files split across ranks; the first problem (same on every rank) or None."""
    algorithm = ckpt.manifest["digest_algorithm"]
    problem = None
    for entry in ckpt.manifest["files"][dist.rank :: dist.world_size]:
        url = join(ckpt.url, entry["path"])
        try:
            actual, _ = digest_url(url, algorithm)
        except FileNotFoundError:
            problem = f"{url}: missing"
            break
        if actual != entry["digest"]:
            problem = f"{url}: {algorithm} digest {actual} != {entry['digest']} in its manifest"
            break
    return next((p for p in gather_objects(problem, dist) if p), None)


def check_compatible(ckpt: CompleteCheckpoint, *, zero_stage: int, method: Method) -> None:
    """Refuse a checkpoint that cannot be converted to this run (another ZeRO stage or method), saying what differs
    and what to do; another world size is fine (trainer/checkpointing/reshard.py)."""
    written = METHODS.get(ckpt.manifest["method"], ckpt.manifest["method"])  # the manifest names its method
    differs = [
        f"{what} {have} (this run: {want})"
        for what, have, want in (
            ("ZeRO stage", ckpt.manifest["zero_stage"], zero_stage),
            ("train.method", written, method),
        )
        if have != want
    ]
    if differs:
        raise UserError(
            f"{ckpt.url} cannot resume this run: its {' and '.join(differs)} differ; resume with the same DeepSpeed "
            f"stage and train.method, or set train.resume=never to start over"
        )


def quarantine(url: Location) -> Location:
    """Move a checkpoint that failed verification aside (kept for inspection, invisible to readers)."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    parent, name = str(url).rstrip("/").rsplit("/", 1)
    target = join(url.with_url(parent), f"corrupt-{name}-{stamp}")
    fs, source = filesystem(url)
    fs.mv(source, filesystem(target)[1], recursive=True)
    return target


def choose_checkpoint(resume: str, run_url: Location, dist: Dist) -> CompleteCheckpoint | None:
    """The verified checkpoint to resume from, or None to start at step 0."""
    if resume == "never":
        return None
    if resume == "auto":
        candidates = auto_candidates(run_url, dist)
    else:
        explicit = read_complete(run_url.with_url(resume))  # reached with the run's storage options
        if explicit is None:
            raise UserError(
                f"train.resume={resume}: not a complete checkpoint (no {layout.COMPLETE} matching "
                f"its {layout.MANIFEST}); pass a checkpoints/step-N directory, auto or never"
            )
        candidates = [explicit]
    for ckpt in candidates:
        problem = verify_shared(ckpt, dist)
        if problem is None:
            return ckpt
        if resume != "auto":
            raise UserError(f"train.resume={resume}: {problem}; the checkpoint is corrupt, pick another one")
        log.warning("not resuming from step %d: %s", ckpt.step, problem)
        if dist.is_main:
            log.warning("moved the corrupt checkpoint to %s", quarantine(ckpt.url))
        barrier()
    return None


def auto_candidates(run_url: Location, dist: Dist) -> list[CompleteCheckpoint]:
    """The run's complete checkpoints, newest first; newer directories that are not complete are reported,
    and moved aside when they had been committed once (COMPLETE there) and are damaged now."""
    found, damaged = [], []
    for step, url in step_dirs(run_url):
        checked = inspect(url)
        if isinstance(checked, CompleteCheckpoint):
            found.append(checked)
        elif not found:  # older leftovers are retention's business
            log.warning("not resuming from step %d: %s", step, checked)
            if exists(join(url, layout.COMPLETE)):
                damaged.append(url)
    if damaged:
        barrier()  # every rank has looked before rank 0 moves anything
        if dist.is_main:
            for url in damaged:
                log.warning("moved the damaged checkpoint to %s", quarantine(url))
        barrier()
    return found
