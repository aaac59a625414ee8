"""The line format of a rank's log and its parser, in one place: the trainer writes it (trainer/logging_setup.py),
the launcher reads a failed rank's error line back from a node's log (launch/diagnose.py)."""

from __future__ import annotations

import re

# The logger name of a rank's one-line error (trainer/harness.py logs a TandemError under it).
ERROR_LOGGER = "trainer"
RANK_ERROR = re.compile(rf"\[rank (\d+)/\d+ [^\]]*\] ERROR {ERROR_LOGGER}: (.*)")


def line_format(rank: int, world_size: int, host: str) -> str:
    """The logging format of one rank: every line carries the rank, so interleaved node logs stay readable."""
    return f"%(asctime)s [rank {rank}/{world_size} {host}] %(levelname)s %(name)s: %(message)s"


def crash_message(type_name: str, where: str | None, message: str) -> str:
    """A rank's uncaught exception as its one error line: `TypeError in build_engine (trainer/loop.py:108): ...`."""
    return f"{type_name}{f' in {where}' if where else ''}: {message}"


# An error line that crash_message wrote (an exception's type name first), not a TandemError's own sentence.
CRASH = re.compile(r"^[A-Z]\w*(?:Error|Exception|Exit|Interrupt|Failure)(?: in \S+ \([^)]*\))?: ")


def rank_errors(text: str) -> list[tuple[int, str]]:
    """(rank, message) of every rank error line in a node's log text, in order."""
    return [(int(rank), message) for rank, message in RANK_ERROR.findall(text)]
