"""Which host runs which node, and why every node should stop: every node process claims `nodes/{r}/claim.json` on
shared storage for as long as it runs (renewed every few seconds), so that two hosts started with the same
NODE_RANK find out within seconds, and both are named, instead of the job hanging until the rendezvous timeout.

A claim is live while renewed within LEASE_S (host clocks must agree to a few seconds, as NTP keeps them). Of two
nodes with one rank, the later one finds the live claim and stops. A node that fails for any reason (that one
among them) leaves `nodes/stop.json`, which every node of the run checks while it runs: nodes started by hand,
with no launcher to stop them, then stop within seconds of a peer's failure instead of waiting on it forever.
Node 0 removes an old note when it starts, and a note written before a node started is ignored (a retry's node
may start before node 0 does; a note of this attempt is written after every node started, on any clock within
that margin). A claim by the same host whose process is gone is stale (a retry takes it over at once). The local
backend's nodes are threads of one process: they share its pid, never a rank, so each holds a claim of its own.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from core.errors import EXIT_USER_ERROR, TandemError, UserError
from core.processes import pid_alive
from launch.diagnose import LOST_PEER, error_for, relay_line
from storage import layout
from storage.fs import exists, read_json, remove, write_json_atomic
from storage.location import Location, join

LEASE_S = 15.0
RENEW_S = 2.0
# A peer's note that only says its ranks lost a peer is an echo: the peer they lost may be this node's rank, killed
# outright, whose agent notices a moment later. This node's own failure gets this long (on its own clock) to come.
ECHO_GRACE_S = 15.0
# A node whose failure a retry cannot help reads its stop note back after this long and writes it again if a peer's
# retryable note (its ranks lost this node's rank) replaced it: the peer checks before it writes, but both may check
# in the same moment.
NOTE_SETTLE_S = 0.5
CLAIM = "claim.json"
STOP = "stop.json"


def node_name(addr: str) -> str:
    """How a node is named in these messages: its hostname and the address it reaches node 0 from."""
    host = socket.gethostname()
    return f"{host} ({addr})" if addr and addr != host else host


@dataclass
class NodeClaim:
    """This process's claim on one node rank; `poll` renews it and raises when another host holds the rank."""

    run_url: Location
    node_rank: int
    nnodes: int
    addr: str  # the address this node reaches node 0 from ("" when unknown)
    token: str = field(default_factory=lambda: uuid.uuid4().hex)
    started: float = field(default_factory=time.time)
    _renewed: float = 0.0
    stopped_by_peer: bool = False  # poll raised because another node failed (that node told the others)
    _echo_seen: float | None = None  # when poll first read a peer's note that is an echo (monotonic)

    @property
    def name(self) -> str:
        return node_name(self.addr)

    @property
    def url(self) -> Location:
        return join(layout.node_dir(self.run_url, self.node_rank), CLAIM)

    @property
    def stop_url(self) -> Location:
        return join(self.run_url, layout.NODES, STOP)

    def body(self) -> dict[str, Any]:
        return {
            "node_rank": self.node_rank,
            "name": self.name,
            "host": socket.gethostname(),
            "addr": self.addr,
            "pid": os.getpid(),
            "token": self.token,
            "renewed_at": time.time(),
        }

    def take(self) -> None:
        """Claim the rank, or raise (and leave the note for the others) when another live node holds it."""
        if self.node_rank == 0 and exists(self.stop_url):
            remove(self.stop_url)  # node 0 starts a new attempt of the job: an old note is void
        holder = read_json(self.url) if exists(self.url) else None
        if holder is not None and _live(holder) and not _stale_here(holder, self.addr):
            self._duplicate(holder["name"])
        self._renewed = time.monotonic()
        write_json_atomic(self.url, self.body())

    def poll(self) -> None:
        """Renew the claim every RENEW_S; raise when another node took this rank or any rank is held twice."""
        if time.monotonic() - self._renewed < RENEW_S:
            return
        self._renewed = time.monotonic()
        if (stopped := self.stopped_by()) is not None and not self._echo_in_grace():
            self.stopped_by_peer = True
            raise stopped
        holder = read_json(self.url) if exists(self.url) else None
        if holder is not None and holder["token"] != self.token and _live(holder):
            self._duplicate(holder["name"])
        write_json_atomic(self.url, self.body())

    def note(self) -> dict[str, Any] | None:
        """The stop note of this attempt left by another node, if any."""
        note = read_json(self.stop_url) if exists(self.stop_url) else None
        if note is None or note["token"] == self.token or note["at"] < self.started:
            return None
        return note

    def stopped_by(self) -> TandemError | None:
        """The error to stop with when another node of this attempt failed and told the others (else None)."""
        if (note := self.note()) is None:
            return None
        return error_for(
            note["exit_code"],
            relay_line(self.node_rank, note["node_rank"], note["name"], note["message"]),
        )

    def _echo_in_grace(self) -> bool:
        """Whether the peer's note is an echo (its ranks lost a peer) read less than ECHO_GRACE_S ago: this node keeps
        following its own agent meanwhile, so that a rank of its own that died is reported as the cause."""
        note = self.note()
        if note is None or note["exit_code"] == EXIT_USER_ERROR or not LOST_PEER.search(note["message"]):
            return False
        if self._echo_seen is None:
            self._echo_seen = time.monotonic()
        return time.monotonic() - self._echo_seen < ECHO_GRACE_S

    def release(self) -> None:
        """Give the rank up (the node finished or failed)."""
        with contextlib.suppress(Exception):
            if exists(self.url) and read_json(self.url)["token"] == self.token:
                remove(self.url)

    def stop_all(self, message: str, exit_code: int) -> None:
        """Tell every node of this attempt to stop: this one failed (best effort: its own error matters more). A note
        already there that a retry cannot help (exit 2: a peer's bad data, a bug) is the cause and stays: this node's
        retryable failure (its ranks lost that peer) may come a moment after it."""
        with contextlib.suppress(Exception):
            if (
                exit_code != EXIT_USER_ERROR
                and (note := self.note()) is not None
                and note["exit_code"] == EXIT_USER_ERROR
            ):
                return
            body = {
                "node_rank": self.node_rank,
                "name": self.name,
                "message": message,
                "exit_code": exit_code,
                "token": self.token,
                "at": time.time(),
            }
            write_json_atomic(self.stop_url, body)
            if exit_code == EXIT_USER_ERROR:
                time.sleep(NOTE_SETTLE_S)
                if read_json(self.stop_url)["exit_code"] != EXIT_USER_ERROR:
                    write_json_atomic(self.stop_url, body)

    def _duplicate(self, other: str) -> None:
        raise UserError(
            f"duplicate NODE_RANK={self.node_rank}: nodes on {other} and on {self.name} were both "
            f"started as node {self.node_rank}; give every node a unique NODE_RANK in "
            f"0..{self.nnodes - 1} and start the job again"
        )


def wait_for_claims(run_url: Location, nnodes: int, info: Callable[[str], None], limit_s: float) -> None:
    """Before a pipeline starts a phase's nodes: while a node of another process (an earlier pipeline's, which stops
    on its own: launch/liveness.py) still holds a live claim, wait, up to `limit_s`; a claim still live then is
    left for the new node to report as a duplicate rank."""
    deadline = time.monotonic() + limit_s
    told = False
    while time.monotonic() < deadline:
        held = [r for r in range(nnodes) if (holder := _claim_of(run_url, r)) is not None and _foreign(holder)]
        if not held:
            return
        if not told:
            info(f"waiting up to {limit_s:.0f} s for the nodes of an earlier pipeline to stop (node ranks {held})")
            told = True
        time.sleep(RENEW_S)


def _claim_of(run_url: Location, node_rank: int) -> dict[str, Any] | None:
    url = join(layout.node_dir(run_url, node_rank), CLAIM)
    try:
        return read_json(url) if exists(url) else None
    except Exception:  # noqa: BLE001 - unreadable now: the node's own take() decides
        return None


def _foreign(holder: dict[str, Any]) -> bool:
    """A live claim that is not this process's own and not a dead process's on this host."""
    if not _live(holder):
        return False
    if holder.get("host") != socket.gethostname():
        return True
    return holder.get("pid") != os.getpid() and not _stale_here(holder, holder.get("addr", ""))


def _live(holder: dict[str, Any]) -> bool:
    return time.time() - holder["renewed_at"] < LEASE_S


def _stale_here(holder: dict[str, Any], addr: str) -> bool:
    """A claim by this host (same name and address: hostnames alone repeat across machines) whose process is gone,
    or by this very process (a retry: the attempt before it, in this process, has stopped its nodes)."""
    if holder["host"] != socket.gethostname() or holder["addr"] != addr:
        return False
    return holder["pid"] == os.getpid() or not pid_alive(holder["pid"])
