"""`launch.backend: prefect`: one child run of the `node` deployment per node, sent to that node's work
queue (`{launch.queue_prefix}{rank}`), where a process worker on the node runs it (flows/node.py).

The pipeline follows the children in the one supervise loop (launch/supervise.py): a child that fails, crashes or is
cancelled stops the others and fails the step naming its node, with the tail of that node's log from shared storage;
the node's exit code, recorded in its status.json, says whether a retry may help (and a node's exit 2 wins over the
others' failures within the loop's settle time). Whatever way this function exits (success, failure, the parent
being cancelled), no child is left running: unfinished children are cancelled and waited for, so a retry never
starts beside the attempt before it.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, cast
from uuid import UUID

from prefect.client.orchestration import SyncPrefectClient, get_client
from prefect.client.schemas.objects import FlowRun, State
from prefect.deployments import run_deployment
from prefect.states import Cancelling

from launch.command import DEFAULT_MASTER_PORT
from launch.diagnose import error_for, is_one_line, log_tail
from launch.job import Info, OnProgress, PhaseJob
from launch.node import failure_exit_code
from launch.supervise import Failure, supervise
from launch.watch import Watch, phase_watch
from storage.fs import Location

POLL_S = 1.0
CANCEL_WAIT_S = 60.0

log = logging.getLogger(__name__)


def node_parameters(job: PhaseJob, node_rank: int, port: int) -> dict[str, Any]:
    """The node flow's parameters for one node."""
    launch = job.written.spec.config.launch
    return {
        "spec_url": str(job.written.url),
        "node_rank": node_rank,
        "nnodes": launch.nnodes,
        "nproc_per_node": launch.nproc_per_node,
        "master_addr": launch.rendezvous_addr,
        "master_port": port,
        "phase": job.phase,
        "model_url": job.model_url,
        "expected_spec_digest": job.written.digest if job.phase == "train" else None,
    }


def run_prefect_nodes(job: PhaseJob, info: Info, on_progress: OnProgress | None = None) -> None:
    """Start the node flow on every node's queue and wait for all of them; raise naming the first failure."""
    spec, phase = job.written.spec, job.phase
    launch = spec.config.launch
    port = launch.master_port or DEFAULT_MASTER_PORT
    children: dict[int, UUID] = {}
    watch = phase_watch(spec.run, launch, phase, on_progress)
    try:
        for rank in range(launch.nnodes):
            # Called from synchronous code, run_deployment returns the flow run (its type also admits a coroutine).
            run = cast(
                FlowRun,
                run_deployment(
                    name=launch.node_deployment,
                    timeout=0,
                    work_queue_name=f"{launch.queue_prefix}{rank}",
                    parameters=node_parameters(job, rank, port),
                    flow_run_name=f"{spec.run_id}-{phase}-node{rank}",
                ),
            )
            children[rank] = run.id
        info(
            f"{phase}: {launch.nnodes} node flow runs sent to queues {launch.queue_prefix}0.."
            f"{launch.queue_prefix}{launch.nnodes - 1} ({launch.node_deployment}), rendezvous "
            f"{launch.rendezvous_addr}:{port}"
        )
        _follow(children, spec.run, phase, watch)
    finally:
        _cancel_unfinished(children)


@dataclass
class NodeFlowRun:
    """One node's flow run, followed through the Prefect API; a member of the supervise loop."""

    node_rank: int
    run_id: UUID
    client: SyncPrefectClient
    run_url: Location
    phase: str
    state: State | None = None

    def returncode(self) -> int | None:
        """None while the flow run is not final; 0 when it completed, else 1 (its node's code is in status.json)."""
        state = self.client.read_flow_run(self.run_id).state
        if state is None or not state.is_final():
            return None
        self.state = state
        return 0 if state.is_completed() else 1

    def failure(self) -> Failure:
        """The node's failure: its flow run's state and the tail of its log, classified by the exit code the node
        recorded in its status.json; ordered by when the state was set (when one node dies the others fail seconds
        later)."""
        assert self.state is not None
        code = failure_exit_code(self.run_url, self.node_rank)
        said = (self.state.message or "").strip()
        message = f"{self.phase} failed on node {self.node_rank} (its flow run is {self.state.name}: {said})"
        if not is_one_line(said):
            message += f"\nlast lines of its log:\n{log_tail(self.run_url, self.node_rank)}"
        return Failure(error_for(code, message), code, self.state.timestamp.timestamp())


def _follow(children: dict[int, UUID], run_url: Location, phase: str, watch: Watch | None) -> None:
    """Poll the children's states until all completed; raise for the failure that caused the others."""
    with get_client(sync_client=True) as client:
        runs = [NodeFlowRun(rank, run_id, client, run_url, phase) for rank, run_id in children.items()]
        supervise(runs, [watch] if watch is not None else [], POLL_S)


def _cancel_unfinished(children: dict[int, UUID]) -> None:
    """Ask every child that is not final to cancel (its worker then stops its process group), and wait until each
    is final, up to CANCEL_WAIT_S: a retry sent while the last attempt's node 0 still held the rendezvous port (the
    same port: this backend does not pick one per launch) or its GPUs would fail on them."""
    if not children:
        return
    with get_client(sync_client=True) as client:

        def unfinished() -> list[UUID]:
            states = {run_id: client.read_flow_run(run_id).state for run_id in children.values()}
            return [run_id for run_id, state in states.items() if state is not None and not state.is_final()]

        pending = unfinished()
        for run_id in pending:
            client.set_flow_run_state(run_id, Cancelling(), force=True)
        deadline = time.monotonic() + CANCEL_WAIT_S
        while pending and time.monotonic() < deadline:
            time.sleep(POLL_S)
            pending = unfinished()
        if pending:
            log.warning(
                "%d node flow run(s) still not stopped %.0f s after their cancellation: %s; check their workers",
                len(pending),
                CANCEL_WAIT_S,
                ", ".join(map(str, pending)),
            )
