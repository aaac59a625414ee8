"""Why a node failed: the failing rank and its own error line from a node's log, or the signal its torchrun agent died
of, the tail shown to the user, and the one rule that classifies a failure by exit code (2: retrying cannot help;
anything else may)."""

from __future__ import annotations

import re
import signal

from core.errors import EXIT_USER_ERROR, RetryableError, UserError
from core.rank_log import CRASH, rank_errors
from launch.job import Phase
from launch.signals import Death, agent_killed_by, killed_by
from storage import layout
from storage.fs import exists, read_bytes
from storage.location import Location, join

TAIL_LINES = 15
# How a rank says that a peer went away under it (gloo's and NCCL's words): its failure is an echo of another's.
RELAYED = re.compile(r"\bnode \d+ stopped: node \d+ on .+? failed: ")
LOST_PEER = re.compile(r"connection (?:reset|closed) by peer|broken pipe|remote process exited", re.IGNORECASE)
POINTER = re.compile(r" \((?:log|traceback): [^()]*\)$")
# torchrun's own report of a failed rank: its error line and traceback (unprefixed: a rank's lines carry
# `[rankN]:`), then the failures between two rules of `=`.
TORCHRUN_REPORT_START = re.compile(
    r"^(?:E\d{4} .*elastic/multiprocessing/api\.py:\d+\] failed|Traceback \(most recent|torch\.distributed\.elastic\.)"
)
TORCHRUN_REPORT_RULE = re.compile(r"^={20,}\s*$")
ROOT_CAUSE_HEADING = "Root Cause (first observed failure):"
ROOT_CAUSE = re.compile(r"rank\s+: (\d+) \(local_rank[^\n]*\n[^\n]*exitcode\s+: (-?\d+)")
# torchrun's last words when it caught SIGTERM, SIGINT or SIGHUP (it stops its ranks, then exits 1).
AGENT_SIGNALLED = re.compile(r"SignalException: Process (\d+) got signal: (\d+)")


def read_from(path: str, offset: int) -> str:
    """The text of a log file from a byte offset on."""
    try:
        with open(path, "rb") as handle:
            handle.seek(offset)
            return handle.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


def tail(text: str, lines: int = TAIL_LINES) -> str:
    """The last lines of a log text."""
    return "".join(text.splitlines(keepends=True)[-lines:])


def log_tail(run_url: Location, node_rank: int, lines: int = TAIL_LINES) -> str:
    """The end of a node's log on shared storage."""
    url = join(layout.node_dir(run_url, node_rank), layout.LOG)
    if not exists(url):
        return "(no log on storage)"
    return tail(without_torchrun_report(read_bytes(url).decode(errors="replace")), lines)


# How ranks say they cannot reach a peer: gloo's pair (local and remote ends), NCCL's socket, torch's store client.
_GLOO_ENDS = re.compile(r"local=\[([^\]]+)\]:(\d+), remote=\[([^\]]+)\]:(\d+)")
_CONNECT = (
    re.compile(r"Gloo connectFullMesh failed with \S+ (?P<why>[^\n]*?), remote=\[(?P<addr>[^\]]+)\]:(?P<port>\d+)"),
    re.compile(r"Connect to (?P<addr>[\w.:-]+)<(?P<port>\d+)> failed\s*:\s*(?P<why>[^\n]*)"),
    re.compile(r"failed to connect to \[?(?P<addr>[^\]\s]+?)\]?:(?P<port>\d+) \((?P<why>[^)\n]*)\)"),
)


def connect_diagnosis(text: str) -> str | None:
    """One line naming both ends of a connection a rank could not make, and the likely cause; None when the log
    shows no such failure."""
    found = next((m for pattern in _CONNECT if (m := pattern.search(text))), None)
    if found is None:
        return None
    addr, port, why = found["addr"], found["port"], found["why"].strip().rstrip(".")
    ends = [m for m in _GLOO_ENDS.findall(text) if m[2] == addr and m[3] == port.split("$")[0]]
    here = f" from {ends[-1][0]}:{ends[-1][1]}" if ends else ""
    if addr.startswith("127.") or addr in ("::1", "localhost"):
        cause = (
            "a node advertised a loopback address (its hostname resolves to 127.0.0.1): leave GLOO_SOCKET_IFNAME "
            "and NCCL_SOCKET_IFNAME unset so each node picks the interface that routes to node 0, or set them "
            "to that interface on every node"
        )
    elif "refused" in why.lower():
        cause = (
            "nothing listens there: the peer stopped, or it listens on another interface (check "
            "GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME on that node)"
        )
    else:
        cause = (
            "the traffic does not get through: a firewall between the nodes (open all TCP ports between them), "
            "or an address this node cannot route to (check GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME)"
        )
    return f"cannot connect to its peer at {addr}:{port.split('$')[0]}{here} ({why}); likely cause: {cause}"


def failure_summary(text: str) -> tuple[str, int | None]:
    """(one line saying which rank failed and why, that rank's exit code) from a node's log text.

    The rank that failed first (torchrun's report) says why in its own error line (a connection it could not make is
    said with both ends and the likely cause); a rank killed outright has no line, and its peers' lines are then
    echoes (a lost connection), not the cause. Ranks that torchrun itself terminated (SIGTERM, -15) after the first
    one failed are never the culprit.
    """
    summary, code, _ = culprit(text)
    return summary, code


def culprit(text: str, death: Death | None = None) -> tuple[str, int | None, str | None]:
    """failure_summary's (summary, exit code), and the failed rank's own error line when it wrote one.

    Which rank failed first cannot be read from the times: torchrun finds its ranks' exits at its next check, and
    names the lowest rank when several exited by then. So the cause is, in this order: a rank's own error line that
    is not a lost peer (an error of its own); a rank that exited without a line (killed outright: its peers' lost
    connections are echoes of it); a lost peer; torchrun's root cause."""
    errors = rank_errors(text)
    failures = ranks_failed(text)
    codes = dict(failures)
    causes = [(rank, line) for rank, line in errors if not LOST_PEER.search(line)]
    said = {rank for rank, _ in errors}
    killed = [(rank, code) for rank, code in failures if rank not in said and code != -signal.SIGTERM]
    if causes or (errors and not killed):
        rank, own = (causes or errors)[0]
        message = own
        # A rank that could not connect to a peer crashed with gloo's or the store's words: say it with both ends.
        if CRASH.match(own) and connect_diagnosis(own):
            message = connect_diagnosis(text) or own
        return f"rank {rank}: {message}", codes.get(rank, failures[0][1] if failures else None), own
    if killed or failures:
        rank, code = (killed or failures)[0]
        # A signal leaves no line of the rank's own: say which, and what it likely meant.
        if code != -signal.SIGTERM and (signalled := killed_by(code, death or Death())):
            return f"rank {rank} {signalled}", code, None
        diagnosis = connect_diagnosis(text)
        return f"rank {rank} exited with code {code}" + (f": {diagnosis}" if diagnosis else ""), code, None
    return "see the log", None, None


def ranks_failed(text: str) -> list[tuple[int, int]]:
    """(rank, exit code) of every failed rank in torchrun's report, its root cause first, each rank once."""
    root = ROOT_CAUSE.findall(text.rpartition(ROOT_CAUSE_HEADING)[2]) if ROOT_CAUSE_HEADING in text else []
    seen: dict[int, int] = {}
    for rank, code in root + ROOT_CAUSE.findall(text):
        seen.setdefault(int(rank), int(code))
    return list(seen.items())


def failure_message(phase: Phase, node_rank: int, text: str, log_url: Location, death: Death | None = None) -> str:
    """The error of a failed node from its log text: one line when a rank said why it failed (where its log, and a
    crash's traceback, are) or died by a signal (which, and the likely cause), else that line and the log's last
    lines without torchrun's report of the failure."""
    summary, code, own = culprit(text, death)
    headline = f"{phase} failed on node {node_rank}, {summary}"
    if own is not None:
        return f"{headline} ({'traceback' if CRASH.match(own) else 'log'}: {log_url})"
    if code is not None and code < 0 and code != -signal.SIGTERM:
        return f"{headline} (log: {log_url})"
    return f"{headline}\nlast lines of {log_url}:\n{tail(without_torchrun_report(text))}"


def agent_signal(pid: int, returncode: int | None, text: str) -> int | None:
    """The signal a node's torchrun agent (process `pid`) died of: its own exit code's (SIGKILL, or one it does not
    handle), or the one it reported before exiting 1 (SIGTERM, SIGINT, SIGHUP); None when it ended on its own."""
    if returncode is not None and returncode < 0:
        return -returncode
    said = [int(number) for agent, number in AGENT_SIGNALLED.findall(text) if int(agent) == pid]
    return said[-1] if returncode and said else None


def agent_failure_message(phase: Phase, node_rank: int, pid: int, number: int, log_url: Location, death: Death) -> str:
    """One line for a node whose torchrun agent died by signal `number`: the node, the agent, the signal, the step
    and what to check. The ranks' own lines, if any, are the echo: they were stopped with it."""
    return f"{phase} failed on node {node_rank}, {agent_killed_by(number, pid, death)} (log: {log_url})"


def is_one_line(headline: str) -> bool:
    """True when a node's error line already says where its log is (failure_message's one-line form)."""
    return POINTER.search(headline) is not None


def without_torchrun_report(text: str) -> str:
    """A node's log text without torchrun's own report of a failed rank (its traceback, then the block between two
    rules that ends with `traceback : To enable traceback see ...`): the rank's lines say what happened, and the
    report says it again with pointers to torchrun's documentation."""
    kept: list[str] = []
    rules = None  # inside a report: the rules seen so far
    for line in text.splitlines(keepends=True):
        if rules is None and TORCHRUN_REPORT_START.search(line):
            rules = 0
        if rules is None:
            kept.append(line)
        elif TORCHRUN_REPORT_RULE.match(line):
            rules += 1
            if rules == 2:
                rules = None
    return "".join(kept)


def relay_line(node_rank: int, peer_rank: int, peer_name: str, message: str) -> str:
    """A node's line when it stopped because a peer of its attempt failed and said so (launch/claim.py)."""
    return f"node {node_rank} stopped: node {peer_rank} on {peer_name} failed: {message}"


def relayed(error: BaseException) -> bool:
    """Whether a node's error only passes on a peer's failure (relay_line): the peer's own report is the cause."""
    return RELAYED.search(str(error).partition("\n")[0]) is not None


def lost_peer(error: BaseException) -> bool:
    """Whether a node's error says only that its ranks lost a peer (the echo of another node's failure)."""
    return LOST_PEER.search(str(error).partition("\n")[0]) is not None


def error_for(exit_code: int | None, message: str) -> UserError | RetryableError:
    """The error a failed node raises: by its exit code, UserError (not retried) or RetryableError."""
    return UserError(message) if exit_code == EXIT_USER_ERROR else RetryableError(message)
