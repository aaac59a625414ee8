"""The one supervise loop: follow the members of a job (a node's torchrun agent, an ssh node process, a local node
thread, a node flow run) until every one ended well, or raise the error of the failure that caused the others.

Each turn calls the pollers first (progress and stalls, a node's claim, a launcher's stop), any of which may stop the
job by raising. When a rank dies, its peers' collectives fail too, and their members may end first; so after the first
member that ended non-zero, the others get SETTLE_S to end as well, and among the failures a member's own "retrying
cannot help" error (exit 2: bad data, out of memory, a diverged loss) wins over its peers' lost connections: such a
failure must not be retried. A member that failed only because another one did (it read that one's stop note, or its
ranks say they lost a peer) yields to the failures of their own, then the earliest failure wins.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from core.errors import EXIT_USER_ERROR
from launch.diagnose import lost_peer, relayed

POLL_S = 0.5
SETTLE_S = 3.0  # after a first failure, how long the other members get to report theirs
ECHO_SETTLE_S = 15.0  # the same while every failure reported only says that its ranks lost a peer


class Poller(Protocol):
    """Something the loop calls each turn that may stop the job by raising: a Watch, a node's claim, a stop."""

    def poll(self) -> None: ...


@dataclass(frozen=True)
class Failure:
    """Why a member failed: the error to raise, the exit code of its own error (2: retrying cannot help), whether the
    failure is its own (not caused by another member's), and when it ended (for the order of the failures)."""

    error: BaseException
    code: int | None
    at: float
    own: bool = True


class Member(Protocol):
    """One thing the loop follows."""

    def returncode(self) -> int | None:
        """None while it runs; once it ended, its exit code (0: it finished well)."""
        ...

    def failure(self) -> Failure:
        """Why it failed (asked once it ended non-zero)."""
        ...


def echo(failure: Failure) -> bool:
    """A member's own failure that only says its ranks lost a peer, or that passes on a peer's failure (a node that
    stopped because another said it failed): another member's failure caused it, and that one's report is the cause."""
    return failure.own and (lost_peer(failure.error) or relayed(failure.error))


def poll_each(pollers: Sequence[Poller]) -> None:
    """Call every poller once (each may raise)."""
    for poller in pollers:
        poller.poll()


def supervise(members: Sequence[Member], pollers: Sequence[Poller] = (), poll_s: float = POLL_S) -> None:
    """Poll until every member ended with 0; raise what a poller raises, or the error of the failure that caused the
    others once a member ended non-zero."""
    pending = list(members)
    while pending:
        poll_each(pollers)
        for member in list(pending):
            code = member.returncode()
            if code is None:
                continue
            pending.remove(member)
            if code != 0:
                raise root_failure(member, pending, poll_s / 5).error
        time.sleep(poll_s)


def root_failure(first: Member, pending: list[Member], settle_poll_s: float = POLL_S / 5) -> Failure:
    """The failure to report once `first` failed: the members still pending get SETTLE_S to end too; then a member's
    own exit 2 wins, else the earliest failure of its own, else the earliest."""
    failed = [first]
    started = time.monotonic()
    reports = [first.failure()]
    # While every failure so far only says its ranks lost a peer, the cause has not reported yet: wait longer for it
    # (a node flow run's state reaches the API seconds after its node failed).
    while pending and time.monotonic() - started < (ECHO_SETTLE_S if all(map(echo, reports)) else SETTLE_S):
        for member in list(pending):
            code = member.returncode()
            if code is not None:
                pending.remove(member)
                if code != 0:
                    failed.append(member)
                    reports.append(member.failure())
        time.sleep(settle_poll_s)
    reports.sort(key=lambda f: f.at)  # stable: ties keep the order seen
    own = [f for f in reports if f.own]
    # A node whose ranks only lost a peer may report before the node whose rank died (its rank says so at once, the
    # other's agent notices a killed rank at its next check): the cause is the other one.
    causes = [f for f in own if not echo(f)] or own
    return next((f for f in own if f.code == EXIT_USER_ERROR), (causes or reports)[0])
