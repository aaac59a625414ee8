"""Error types shared by every layer, and the exit codes that separate them.

A `UserError` means "retrying cannot help": the config, the data or a path is wrong and the message
says how to fix it. A `RetryableError` means a retry may help: a lost node, a timeout. Exit codes
keep the two apart across process boundaries (torchrun ranks, node agents, CLIs), so that Prefect
retries only what is worth retrying.
"""

from __future__ import annotations

EXIT_USER_ERROR = 2
EXIT_RETRYABLE = 75  # EX_TEMPFAIL from sysexits.h: "try again later"


class TandemError(Exception):
    """Base of the errors this project raises on purpose; its message is one line for the user."""

    exit_code = 1


class UserError(TandemError):
    """Bad config, bad data, a missing file: fix the input, a retry will not help."""

    exit_code = EXIT_USER_ERROR


class RetryableError(TandemError):
    """A lost node, a stall, a rendezvous timeout: a retry (resuming from a checkpoint) may help."""

    exit_code = EXIT_RETRYABLE


class TooFewNodes(RetryableError):
    """The cluster started only `nodes` of the attempt's nodes in time (its scheduler or its queue could place no
    more): an elastic run starts again on that many (launch.min_nnodes permitting); any other run retries."""

    def __init__(self, message: str, nodes: int) -> None:
        super().__init__(message)
        self.nodes = nodes
