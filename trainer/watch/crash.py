"""An exception nobody caught on a rank, as the one line the launcher reports and the exit code that classifies it.

The line names the exception's type, the project function and file:line it was raised from (the innermost frame in
this project's code: where to look, not a library's internals) and the first line of its message; the traceback
stays in the node's log. The exit code follows the one table in docs/architecture.md: a transient failure (a lost
peer or a connection reset, a collective or store timeout, a network error) exits 75, since a retry that resumes may
get past it; anything else exits 2: the same code on the same model and data would fail the same way again.
"""

from __future__ import annotations

import contextlib
import json
import os
import traceback

import torch
import torch.distributed as torch_dist

from config.footprint import estimate
from core.checkout import PACKAGES, PROJECT_ROOT
from core.errors import EXIT_RETRYABLE, EXIT_USER_ERROR
from core.rank_log import crash_message
from storage import layout
from storage.full import StorageFull, free_bytes, storage_full, storage_full_message
from storage.location import is_local, local_path
from storage.spec import Spec

MAX_MESSAGE = 300
# How gloo and the TCP store say that a peer went away or stopped answering, in exceptions that carry no type of
# their own (a plain RuntimeError from gloo's transport).
TRANSIENT_TEXT = (
    "connection closed by peer",
    "connection reset by peer",
    "broken pipe",
    "timed out",
    "timeout",
    "connectfullmesh failed",
)


def crash_exit_code(exc: BaseException) -> int:
    """75 for a transient failure of the job's network or a peer, else 2."""
    if isinstance(exc, torch_dist.DistError | ConnectionError | TimeoutError):
        return EXIT_RETRYABLE
    text = str(exc).lower()
    if isinstance(exc, RuntimeError) and any(marker in text for marker in TRANSIENT_TEXT):
        return EXIT_RETRYABLE
    return EXIT_USER_ERROR


def crash_line(exc: BaseException) -> str:
    """`TypeError in build_engine (trainer/loop.py:108): message`, the frame being the innermost in our code."""
    where = project_frame(exc)
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()] or ["(no message)"]
    # A message that opens with a lead-in ("Parameter containing:", then a tensor) says what it means at its end.
    message = f"{lines[0]} … {lines[-1]}" if len(lines) > 1 and lines[0].endswith(":") else lines[0]
    if len(message) > MAX_MESSAGE:
        message = message[: MAX_MESSAGE - 3] + "..."
    return crash_message(type(exc).__name__, where, message)


def project_frame(exc: BaseException) -> str | None:
    """`function (package/file.py:line)` of the innermost frame of the traceback that is in this project's code."""
    ours = [
        frame
        for frame in traceback.extract_tb(exc.__traceback__)
        if (relative := os.path.relpath(frame.filename, PROJECT_ROOT)).split(os.sep)[0] in PACKAGES
        and not relative.startswith("..")
    ]
    if not ours:
        return None
    frame = ours[-1]
    return f"{frame.name} ({os.path.relpath(frame.filename, PROJECT_ROOT)}:{frame.lineno})"


# How torch.save says that a write failed: its C++ stream gives no errno. Read as a full disk only while the run's
# storage has less than LOW_FREE_BYTES left (a write that failed for another reason leaves free space).
WRITE_FAILED_TEXT = ("iostream error", "unexpected pos", "file write failed")
LOW_FREE_BYTES = 16 * 2**20


def storage_full_on_rank(exc: BaseException, spec: Spec | None) -> StorageFull | None:
    """A rank's uncaught exception as StorageFull when the run's storage was full (the errno, or torch's write
    failure on a nearly full local store), naming the file it was writing; else None. The partial file of a
    checkpoint that never got its COMPLETE is removed, so that the node's log and status.json still fit."""
    if spec is None:
        return None
    written = newest_file(spec)
    needed = checkpoint_bytes(spec)
    if (full := storage_full(exc, spec.run, file=written, needed=needed)) is None:
        texts = " ".join(str(err).lower() for err in (exc, exc.__cause__, exc.__context__) if err is not None)
        free = free_bytes(spec.run)
        if not any(marker in texts for marker in WRITE_FAILED_TEXT) or free is None or free >= LOW_FREE_BYTES:
            return None
        full = StorageFull(storage_full_message(spec.run, written, needed))
    if written is not None and partial(spec, written):
        with contextlib.suppress(OSError):
            os.unlink(written)
    return full


def newest_file(spec: Spec) -> str | None:
    """The run's most recently modified file outside nodes/ (the node logs grow all the time): on a full local
    store, the one whose write failed. None on an object store (a rank writes there from a local staging copy)."""
    if not is_local(spec.run):
        return None
    root, newest, when = local_path(spec.run), None, -1.0
    for dirpath, dirnames, names in os.walk(root):
        dirnames[:] = [d for d in dirnames if os.path.join(dirpath, d) != os.path.join(root, layout.NODES)]
        for name in names:
            path = os.path.join(dirpath, name)
            with contextlib.suppress(OSError):
                if (mtime := os.stat(path).st_mtime) > when:
                    newest, when = path, mtime
    return newest


def partial(spec: Spec, path: str) -> bool:
    """Whether a file lies in a checkpoint directory that has no COMPLETE (garbage for every reader)."""
    checkpoints = os.path.dirname(local_path(layout.checkpoint_dir(spec.run, 0)))
    relative = os.path.relpath(path, checkpoints)
    if relative.startswith(".."):
        return False
    step_dir = os.path.join(checkpoints, relative.split(os.sep)[0])
    return not os.path.exists(os.path.join(step_dir, layout.COMPLETE))


def checkpoint_bytes(spec: Spec) -> int | None:
    """One checkpoint's estimated bytes (config/footprint.py), None without an estimate."""
    try:
        with open(os.path.join(spec.model_path, "config.json"), encoding="utf-8") as handle:
            model = json.load(handle)
    except (OSError, ValueError):
        return None
    footprint = estimate(spec.config, model, spec.total_steps, spec.world_size, bf16=torch.cuda.is_available())
    return footprint.checkpoint if footprint is not None else None
