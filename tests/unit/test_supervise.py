"""The one supervise loop (launch/supervise.py) and the local backend's node threads (launch/backends/local.py) with
members and nodes that are stand-ins: which failure is reported, and with which grace the other nodes are stopped."""

from __future__ import annotations

import threading
import time

import pytest

from config.loader import load_config
from core.errors import EXIT_RETRYABLE, EXIT_USER_ERROR, RetryableError, UserError
from launch import supervise as supervise_module
from launch.agent import FAILED_GRACE_S, KILL_GRACE_S
from launch.backends import local
from launch.job import NodePlan, PhaseJob
from launch.node import NodeStop, NodeStopped
from launch.supervise import Failure, supervise
from pipeline.plan import build_spec
from storage.location import join
from storage.spec import DatasetRef, WrittenSpec


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
        "train failed on node 0, rank 0: RuntimeError in dist_sum (trainer/distributed.py:82): [pair.cc:537] Read "
        "error [127.0.0.1]:44470: Connection reset by peer (traceback: /r/nodes/0/log.txt)"
    )
    killed = RetryableError("train failed on node 1, rank 1 exited with code 137")
    with pytest.raises(RetryableError) as info:
        supervise([Member(EXIT_RETRYABLE, 0.0, echo), Member(EXIT_RETRYABLE, 0.2, killed)], poll_s=0.05)
    assert info.value is killed


def test_a_poller_stops_the_loop_by_raising() -> None:
    class Stall:
        def poll(self) -> None:
            raise RetryableError("training stalled")

    with pytest.raises(RetryableError, match="training stalled"):
        supervise([Member(0, 60.0)], [Stall()], poll_s=0.05)


def job(tmp_path, nnodes: int, extra: list[str] = ()) -> PhaseJob:
    cfg = load_config(None, [f"run.storage={tmp_path}", f"launch.nnodes={nnodes}", "train.max_steps=8", *extra])
    spec = build_spec(
        cfg,
        "r",
        str(tmp_path),
        DatasetRef(dataset_id="d", url=str(tmp_path), manifest_digest="x", split_records={"train": 100}),
    )
    return PhaseJob(WrittenSpec(spec, join(spec.run, "spec.json"), "0" * 64), "eval")


class Nodes:
    """Stand-in for run_node: node `failing` raises `error` at once; the others run until their stop is tripped."""

    def __init__(self, failing: int | None, error: BaseException | None = None) -> None:
        self.failing, self.error = failing, error
        self.graces: dict[int, float | None] = {}
        self.threads: dict[int, threading.Thread] = {}

    def __call__(self, job: PhaseJob, plan: NodePlan, info, *, stop: NodeStop) -> None:
        self.threads[plan.node_rank] = threading.current_thread()
        if plan.node_rank == self.failing:
            raise self.error
        try:
            while True:
                stop.poll()
                time.sleep(0.01)
        except NodeStopped:
            self.graces[plan.node_rank] = stop.grace_s
            raise


def test_the_local_backend_reports_a_nodes_failure_and_stops_the_others_with_the_failure_grace(
    tmp_path, monkeypatch
) -> None:
    error = UserError("train failed on node 1, rank 1: bad data")
    nodes = Nodes(failing=1, error=error)
    monkeypatch.setattr(local, "run_node", nodes)
    with pytest.raises(UserError) as info:
        local.run_local_job(job(tmp_path, 3), lambda _: None)
    assert info.value is error
    assert nodes.graces == {0: FAILED_GRACE_S, 2: FAILED_GRACE_S}
    assert not any(thread.is_alive() for thread in nodes.threads.values())  # every node stopped before the raise
    assert threading.main_thread() not in nodes.threads.values()


@pytest.mark.parametrize(
    ("extra", "grace"), [([], KILL_GRACE_S), (["launch.checkpoint_on_cancel=true", "launch.cancel_grace_s=77"], 77)]
)
def test_a_cancel_of_the_pipeline_stops_every_node_with_the_cancel_grace(tmp_path, monkeypatch, extra, grace) -> None:
    nodes = Nodes(failing=None)
    monkeypatch.setattr(local, "run_node", nodes)

    def cancelled(*_: object) -> None:
        time.sleep(0.2)
        raise KeyboardInterrupt

    monkeypatch.setattr(local, "supervise", cancelled)
    with pytest.raises(KeyboardInterrupt):
        local.run_local_job(job(tmp_path, 2, extra), lambda _: None)
    assert nodes.graces == {0: grace, 1: grace}
    assert not any(thread.is_alive() for thread in nodes.threads.values())
