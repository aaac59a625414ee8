"""An exception nobody caught on a rank, as the one line the launcher reports and the exit code that classifies it.

The line names the exception's type, the project function and file:line it was raised from (the innermost frame in
this project's code: where to look, not a library's internals) and the first line of its message; the traceback
stays in the node's log. The exit code follows the one table in docs/architecture.md: a transient failure (a lost
peer or a connection reset, a collective or store timeout, a network error) exits 75, since a retry that resumes may
get past it; anything else exits 2: the same code on the same model and data would fail the same way again.
"""

from __future__ import annotations

import os
import traceback

import torch.distributed as torch_dist

from core.checkout import PACKAGES, PROJECT_ROOT
from core.errors import EXIT_RETRYABLE, EXIT_USER_ERROR
from core.rank_log import crash_message

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
