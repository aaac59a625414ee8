"""`launch.backend: prefect`: one child run of the `node` deployment per node, sent to that node's work
queue (`{launch.queue_prefix}{rank}`), where a process worker on the node runs it (flows/node.py).

The pipeline follows the children: a child that fails, crashes or is cancelled stops the others and
fails the step naming its node, with the tail of that node's log from shared storage; the node's exit code,
recorded in its status.json, says whether a retry may help. Whatever way this function exits (success,
failure, the parent being cancelled), no child is left running: unfinished children are cancelled and waited
for, so a retry never starts beside the attempt before it.
"""

from __future__ import annotations

import logging
import time
from typing import Any
from uuid import UUID

from prefect.client.orchestration import get_client
from prefect.deployments import run_deployment
from prefect.states import Cancelling

from launch.command import DEFAULT_MASTER_PORT
from launch.diagnose import error_for, log_tail
from launch.node import failure_exit_code
from launch.phase import Info, OnProgress, PhaseJob
from launch.watch import Watch, phase_watch

POLL_S = 1.0
CANCEL_WAIT_S = 60.0

log = logging.getLogger(__name__)


def node_parameters(job: PhaseJob, node_rank: int, port: int) -> dict[str, Any]:
    """The node flow's parameters for one node."""
    launch = job.written.spec.config.launch
    return {"spec_url": job.written.url, "node_rank": node_rank, "nnodes": launch.nnodes,
            "nproc_per_node": launch.nproc_per_node, "master_addr": launch.rendezvous_addr, "master_port": port,
            "phase": job.phase, "model_url": job.model_url,
            "expected_spec_digest": job.written.digest if job.phase == "train" else None}


def run_prefect_nodes(job: PhaseJob, info: Info, on_progress: OnProgress | None = None) -> None:
    """Start the node flow on every node's queue and wait for all of them; raise naming the first failure."""
    spec, phase = job.written.spec, job.phase
    launch = spec.config.launch
    port = launch.master_port or DEFAULT_MASTER_PORT
    children: dict[int, UUID] = {}
    watch = phase_watch(spec.run_url, launch, phase, on_progress)
    try:
        for rank in range(launch.nnodes):
            run = run_deployment(name=launch.node_deployment, timeout=0, work_queue_name=f"{launch.queue_prefix}{rank}",
                                 parameters=node_parameters(job, rank, port),
                                 flow_run_name=f"{spec.run_id}-{phase}-node{rank}")
            children[rank] = run.id
        info(f"{phase}: {launch.nnodes} node flow runs sent to queues {launch.queue_prefix}0.."
             f"{launch.queue_prefix}{launch.nnodes - 1} ({launch.node_deployment}), rendezvous "
             f"{launch.rendezvous_addr}:{port}")
        _follow(children, spec.run_url, phase, watch)
    finally:
        _cancel_unfinished(children)


def _follow(children: dict[int, UUID], run_url: str, phase: str, watch: Watch | None) -> None:
    """Poll the children's states until all completed; raise for the first one that did not."""
    pending = dict(children)
    with get_client(sync_client=True) as client:
        while pending:
            if watch is not None:
                watch.poll()
            failed = []
            for rank, run_id in list(pending.items()):
                state = client.read_flow_run(run_id).state
                if state is None or not state.is_final():
                    continue
                del pending[rank]
                if not state.is_completed():
                    failed.append((state.timestamp, rank, state))
            if failed:  # when one node dies the others fail seconds later: name the first
                _, rank, state = min(failed, key=lambda f: (f[0], f[1]))
                message = (f"{phase} failed on node {rank} (its flow run is {state.name}: "
                           f"{(state.message or '').strip()})\nlast lines of its log:\n"
                           f"{log_tail(run_url, rank)}")
                raise error_for(failure_exit_code(run_url, rank), message)
            time.sleep(POLL_S)


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
            log.warning("%d node flow run(s) still not stopped %.0f s after their cancellation: %s; check their "
                        "workers", len(pending), CANCEL_WAIT_S, ", ".join(map(str, pending)))
