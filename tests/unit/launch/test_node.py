"""A failed node is classified by its exit code, also when the pipeline follows it from elsewhere (the `prefect`
backend reads what the node recorded in its status.json), never by the text of its message."""

from __future__ import annotations

import json

import pytest

from core.errors import EXIT_RETRYABLE, EXIT_USER_ERROR, RetryableError, UserError
from launch import claim as claims
from launch.claim import NodeClaim
from launch.diagnose import error_for
from launch.node import clear_failure, failure_exit_code, record_failure, root_cause
from storage import layout
from storage.location import Location


def test_the_exit_code_decides_whether_a_retry_may_help() -> None:
    assert isinstance(error_for(EXIT_USER_ERROR, "UserError in the text changes nothing"), UserError)
    assert isinstance(error_for(EXIT_RETRYABLE, "bad config"), RetryableError)
    assert isinstance(error_for(None, "no code known"), RetryableError)


def test_a_node_records_its_failure_next_to_its_status_and_a_new_attempt_forgets_it(tmp_path) -> None:
    run = Location(str(tmp_path / "runs" / "r"))
    assert failure_exit_code(run, 1) is None
    status = tmp_path / "runs" / "r" / "nodes" / "1" / layout.STATUS
    status.parent.mkdir(parents=True)
    status.write_text(json.dumps({"node_rank": 1, "phase": "train", "exit_code": 1, "host": "h"}))
    record_failure(run, 1, "train", EXIT_USER_ERROR)
    assert failure_exit_code(run, 1) == EXIT_USER_ERROR
    assert json.loads(status.read_text())["host"] == "h"  # what the agent wrote is kept
    clear_failure(run, 1)
    assert failure_exit_code(run, 1) is None
    assert json.loads(status.read_text()) == {"node_rank": 1, "phase": "train", "exit_code": 1, "host": "h"}


def test_a_node_that_failed_before_its_agent_ran_still_records_why(tmp_path) -> None:
    run = Location(str(tmp_path / "runs" / "r"))
    record_failure(run, 0, "train", EXIT_USER_ERROR)  # e.g. its preflight refused the node
    assert failure_exit_code(run, 0) == EXIT_USER_ERROR


def test_a_node_whose_ranks_lost_their_peers_to_a_non_retryable_failure_names_that_failure(tmp_path) -> None:
    """Two hosts started as node 1: the later one fails (exit 2) and tells the others; node 0 stops, and the first
    node 1's ranks lose their rendezvous store before that node reads the note. Its lost connection (exit 75,
    'retry') must not hide the duplicate rank, which no retry can fix (a CI run of the by-hand recipe saw it)."""
    run = Location(str(tmp_path / "runs" / "r"))
    first = NodeClaim(run, 1, 3, "10.0.0.2")
    second = NodeClaim(run, 1, 3, "10.0.0.3")
    lost = RetryableError("train failed on node 1, Failed to recv, got 0 bytes")
    assert root_cause(first, lost) is lost  # no note yet: its own error
    second.stop_all("duplicate NODE_RANK=1: nodes on a and on b were both started as node 1", EXIT_USER_ERROR)
    cause = root_cause(first, lost)
    assert isinstance(cause, UserError)
    assert str(cause) == (
        f"node 1 stopped: node 1 on {second.name} failed: duplicate NODE_RANK=1: nodes on a and "
        "on b were both started as node 1"
    )
    own = UserError("bad data on node 1")
    assert root_cause(first, own) is own  # its own 'retry cannot help' error stands


def test_a_retryable_peer_failure_does_not_replace_a_nodes_own_error(tmp_path) -> None:
    run = Location(str(tmp_path / "runs" / "r"))
    mine, peer = NodeClaim(run, 0, 2, "10.0.0.1"), NodeClaim(run, 1, 2, "10.0.0.2")
    peer.stop_all("train failed on node 1, rank 1 was killed by SIGKILL", EXIT_RETRYABLE)
    own = RetryableError("train failed on node 0, rank 0 was killed by SIGKILL")
    assert root_cause(mine, own) is own


def test_a_peers_lost_connection_note_waits_for_this_nodes_own_failure(tmp_path, monkeypatch) -> None:
    """Node 1's rank is killed; node 0's rank says at once that it lost its peer, and node 0 leaves its note before
    node 1's agent notices its own dead rank. Node 1 must not stop on that echo at once (it would report node 0's lost
    connection as the cause, and lose its own: a CI run of the resume test saw it); a note that is not an echo stops
    it at the next renewal, and an echo does after ECHO_GRACE_S of its own clock."""
    run = Location(str(tmp_path / "runs" / "r"))
    now = [1000.0]
    monkeypatch.setattr(claims.time, "monotonic", lambda: now[0])
    node0, node1 = NodeClaim(run, 0, 2, "127.0.0.1"), NodeClaim(run, 1, 2, "127.0.0.1")
    node0.take(), node1.take()
    node0.stop_all("train failed on node 0, rank 0: RuntimeError in dist_sum: Connection reset by peer", 75)
    now[0] += claims.RENEW_S
    node1.poll()  # the echo: node 1 keeps following its agent
    assert not node1.stopped_by_peer
    now[0] += claims.ECHO_GRACE_S
    with pytest.raises(RetryableError, match=r"^node 1 stopped: node 0 on .*Connection reset by peer"):
        node1.poll()
    assert node1.stopped_by_peer  # no cause of its own came: the peer's note stops it

    other = NodeClaim(run, 1, 2, "127.0.0.1")
    other.take()
    node0.stop_all("train failed on node 0, rank 0: ValueError in step (trainer/loop.py:1)", 75)
    now[0] += claims.RENEW_S
    with pytest.raises(RetryableError, match="ValueError in step"):
        other.poll()
    assert other.stopped_by_peer  # not an echo: at once
