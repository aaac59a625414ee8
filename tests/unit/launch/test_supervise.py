"""The one supervise loop (launch/supervise.py) with members that are stand-ins: which failure is reported. The local
backend's node threads under it, and the grace they are stopped with, are tests/unit/launch/backends/test_local.py."""

from __future__ import annotations

import time

import pytest

from core.errors import EXIT_RETRYABLE, EXIT_USER_ERROR, RetryableError, UserError
from launch import supervise as supervise_module
from launch.supervise import Failure, supervise


class Member:
    """A member that ends with `code` after `after` seconds."""

    def __init__(self, code: int, after: float, error: BaseException | None = None, own: bool = True) -> None:
        self.code, self.end, self.error, self.own = code, time.monotonic() + after, error, own

    def returncode(self) -> int | None:
        return self.code if time.monotonic() >= self.end else None

    def failure(self) -> Failure:
        assert self.error is not None
        return Failure(self.error, getattr(self.error, "exit_code", None), self.end, own=self.own)


@pytest.fixture(autouse=True)
def quick(monkeypatch) -> None:
    monkeypatch.setattr(supervise_module, "SETTLE_S", 0.5)
    monkeypatch.setattr(supervise_module, "ECHO_SETTLE_S", 2.0)


def test_members_that_all_finish_well_end_the_loop() -> None:
    supervise([Member(0, 0.0), Member(0, 0.2)], poll_s=0.05)


def test_the_first_failure_is_reported_unless_another_own_exit_2_follows_within_the_settle_time() -> None:
    lost = RetryableError("train failed on node 0, rank 0 exited with code 1")
    bad_data = UserError("train failed on node 1, rank 1: bad data")
    with pytest.raises(UserError) as info:
        supervise([Member(1, 0.0, lost), Member(1, 0.2, bad_data)], poll_s=0.05)
    assert info.value is bad_data
    late = UserError("too late to count")
    with pytest.raises(RetryableError) as info:
        supervise([Member(1, 0.0, lost), Member(1, 2.0, late)], poll_s=0.05)
    assert info.value is lost


def test_a_failure_caused_by_another_member_yields_to_that_members_own() -> None:
    """A node that read a peer's stop note fails with the peer's error (and exit code), possibly first: the peer's
    own error is the one reported, even when both say retrying cannot help."""
    peer_said = RetryableError("node 0 stopped: node 1 on h failed: train failed on node 1, rank 1 exited with 137")
    own = RetryableError("train failed on node 1, rank 1 exited with code 137")
    with pytest.raises(RetryableError) as info:
        supervise([Member(EXIT_RETRYABLE, 0.0, peer_said, own=False), Member(EXIT_RETRYABLE, 0.1, own)], poll_s=0.05)
    assert info.value is own
    peer_said_2 = UserError("node 0 stopped: node 1 on h failed: out of memory")
    own_2 = UserError("train failed on node 1, rank 1: out of memory")
    with pytest.raises(UserError) as info:
        supervise(
            [Member(EXIT_USER_ERROR, 0.0, peer_said_2, own=False), Member(EXIT_USER_ERROR, 0.1, own_2)], poll_s=0.05
        )
    assert info.value is own_2


def test_a_node_whose_ranks_only_lost_a_peer_yields_to_the_node_whose_rank_died() -> None:
    """The rank that lost its peer says so at once; the node whose rank was killed reports a moment later (its agent
    notices at its next check): that one is the cause, though both are retryable."""
    echo = RetryableError(
        "train failed on node 0, rank 0: RuntimeError in dist_sum (trainer/parallel/distributed.py:82): "
        "[pair.cc:537] Read "
        "error [127.0.0.1]:44470: Connection reset by peer (traceback: /r/nodes/0/log.txt)"
    )
    killed = RetryableError("train failed on node 1, rank 1 exited with code 137")
    with pytest.raises(RetryableError) as info:
        supervise([Member(EXIT_RETRYABLE, 0.0, echo), Member(EXIT_RETRYABLE, 0.2, killed)], poll_s=0.05)
    assert info.value is killed


def test_a_node_flow_run_that_passes_on_a_peers_failure_yields_to_the_peers_own_report() -> None:
    """The prefect backend's node flow runs: node 0 read node 1's stop note and failed first with its words (its
    own failure as the pipeline sees it); node 1's own report, a moment later, is the one raised."""
    relay = RetryableError(
        "train failed on node 0 (its flow run is Failed: Flow run encountered an exception: RetryableError: node 0 "
        "stopped: node 1 on vm (127.0.0.1) failed: train failed on node 1, rank 1 was killed by SIGKILL (signal 9))"
    )
    killed = RetryableError("train failed on node 1 (its flow run is Failed: rank 1 was killed by SIGKILL (signal 9))")
    with pytest.raises(RetryableError) as info:
        supervise([Member(EXIT_RETRYABLE, 0.0, relay), Member(EXIT_RETRYABLE, 0.3, killed)], poll_s=0.05)
    assert info.value is killed
    with pytest.raises(RetryableError) as info:  # the peer never reports: the relay, which names it, is raised
        supervise([Member(EXIT_RETRYABLE, 0.0, relay), Member(EXIT_RETRYABLE, 5.0, killed)], poll_s=0.05)
    assert info.value is relay


def test_a_poller_stops_the_loop_by_raising() -> None:
    class Stall:
        def poll(self) -> None:
            raise RetryableError("training stalled")

    with pytest.raises(RetryableError, match="training stalled"):
        supervise([Member(0, 60.0)], [Stall()], poll_s=0.05)
