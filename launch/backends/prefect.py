"""`launch.backend: prefect`: one child run of the `node` deployment per node, sent to that node's work
queue (`{launch.queue_prefix}{rank}`), where a process worker on the node runs it (flows/node.py).

The pipeline follows the children in the one supervise loop (launch/supervise.py): a child that fails, crashes or is
cancelled stops the others and fails the step naming its node, with the tail of that node's log from shared storage;
the node's exit code, recorded in its status.json, says whether a retry may help (and a node's exit 2 wins over the
others' failures within the loop's settle time). Whatever way the phase ends (success, failure, the parent being
cancelled), no child is left running: unfinished children are cancelled and waited for (`NodeFlowRuns.cancel`), so a
retry never starts beside the attempt before it.

An outage of the Prefect API while the nodes train is not their failure (launch/api_outage.py): the loop waits for the
API up to launch.api_outage_s while the nodes train on, and once it is back a node's own record on storage
(status.json, written when its agent exits) says how it ended where its flow run cannot: a node that finished while
the API was away ends Failed on the server (its engine could not report the end), or stays Running (its engine gave
up); it is taken as finished, its state corrected. A child the API cannot cancel stops by itself once the phase
ends, when the pipeline removes its liveness record (launch/liveness.py).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, cast
from uuid import UUID

import yaml
from prefect.client.orchestration import SyncPrefectClient, get_client
from prefect.client.schemas.objects import FlowRun, State
from prefect.deployments import run_deployment
from prefect.states import Cancelling, Completed

from config.sections.launch import LaunchConfig
from core.errors import RetryableError
from launch.api_outage import ApiOutage, fail_fast, reason, unreachable
from launch.backend import started
from launch.command import DEFAULT_MASTER_PORT
from launch.diagnose import error_for, is_one_line, log_tail
from launch.elastic import resized
from launch.job import Info, OnProgress, Phase, PhaseJob
from launch.liveness import STALE_S
from launch.node import failure_exit_code, recorded_end, status_url
from launch.preflight import probe_node
from launch.supervise import Failure, supervise
from launch.watch import Watch, phase_watch
from storage.fs import remove
from storage.location import Location
from storage.spec import Attempt, Spec

POLL_S = 1.0
CANCEL_WAIT_S = 60.0
# After an API outage, how long a node's record of a good end may stand without its flow run reporting it: the
# engine of a flow run that ended during the outage reports within its retries' back-off (32 s at most) once the API
# is back, or never (it gave up).
REPORT_GRACE_S = 90.0

log = logging.getLogger(__name__)


def node_parameters(job: PhaseJob, node_rank: int, port: int) -> dict[str, Any]:
    """The node flow's parameters for one node."""
    launch = job.written.spec.config.launch
    return {
        "spec": job.written.url.argument(),
        "node_rank": node_rank,
        "nnodes": launch.nnodes,
        "nproc_per_node": launch.nproc_per_node,
        "master_addr": launch.rendezvous_addr,
        "master_port": port,
        "phase": job.phase.name,
        "model": job.model.argument() if job.model is not None else None,
        "expected_spec_digest": job.written.digest if job.phase.preflights else None,
    }


class PrefectBackend:
    """`launch.backend: prefect`: a flow run of the node deployment per node, on that node's work queue."""

    elastic = False  # each node is its own work queue: no attempt picks the surviving ones (yet)

    def describe(self, job: PhaseJob) -> str:
        """The node deployment, and each node's work queue, flow run name and parameters."""
        launch = job.written.spec.config.launch
        port = launch.master_port or DEFAULT_MASTER_PORT
        lines = [
            f"# launch.backend=prefect: {launch.nnodes} flow run(s) of deployment {launch.node_deployment} "
            "(flows/node.py `node`), one on each node's work queue, run there by a process worker"
        ]
        for rank in range(launch.nnodes):
            run = {
                "deployment": launch.node_deployment,
                "work_queue_name": f"{launch.queue_prefix}{rank}",
                "flow_run_name": flow_run_name(job, rank),
                "parameters": node_parameters(job, rank, port),
            }
            lines.append(f"# node {rank}\n" + yaml.safe_dump(run, sort_keys=False).rstrip())
        return "\n".join(lines) + "\n"

    def submit(self, job: PhaseJob, info: Info) -> NodeFlowRuns:
        """Create every node's flow run on its queue."""
        spec, launch = job.written.spec, job.written.spec.config.launch
        port = launch.master_port or DEFAULT_MASTER_PORT
        runs = NodeFlowRuns(job)

        def start() -> None:
            for rank in range(launch.nnodes):
                # The record of this node's last attempt would read as this one's end while the API is away.
                remove(status_url(spec.run, rank))
                runs.children[rank] = _start_child(job, rank, port)
            info(
                f"{job.phase}: {launch.nnodes} node flow runs sent to queues {launch.queue_prefix}0.."
                f"{launch.queue_prefix}{launch.nnodes - 1} ({launch.node_deployment}), rendezvous "
                f"{launch.rendezvous_addr}:{port}"
            )

        return started(runs, start)

    def probe(self, spec: Spec, slot: int) -> str | None:
        """Preflight's node-local checks for a slot, on this machine (each node's own preflight follows)."""
        return probe_node(spec, slot)

    def attempt_launch(self, launch: LaunchConfig, attempt: Attempt) -> LaunchConfig:
        """As many nodes (queues 0..n-1) as the attempt has."""
        return resized(launch, attempt)


@dataclass
class NodeFlowRuns:
    """The node flow runs of a phase, by node rank."""

    job: PhaseJob
    children: dict[int, UUID] = field(default_factory=dict)

    def follow(self, on_progress: OnProgress | None) -> None:
        """Poll the children's states until all completed; raise for the failure that caused the others."""
        spec, phase = self.job.written.spec, self.job.phase
        watch = phase_watch(spec.run, spec.config.launch, phase, on_progress)
        _follow(self.children, spec.run, phase, watch, spec.config.launch.api_outage_s)

    def cancel(self, *, failed: bool) -> None:
        """Cancel every child that is not final and wait for it (whatever `failed`: its worker gives the grace)."""
        _cancel_unfinished(self.children)


def flow_run_name(job: PhaseJob, rank: int) -> str:
    """Node `rank`'s flow run: {run}-{phase}-node{rank}."""
    return f"{job.written.spec.run_id}-{job.phase}-node{rank}"


def _start_child(job: PhaseJob, rank: int, port: int) -> UUID:
    """Create node `rank`'s flow run on its queue; an API that does not answer is a failure a retry may mend."""
    launch = job.written.spec.config.launch
    try:
        # Called from synchronous code, run_deployment returns the flow run (its type also admits a coroutine).
        run = cast(
            FlowRun,
            run_deployment(
                name=launch.node_deployment,
                timeout=0,
                work_queue_name=f"{launch.queue_prefix}{rank}",
                parameters=node_parameters(job, rank, port),
                flow_run_name=flow_run_name(job, rank),
            ),
        )
    except Exception as exc:
        if not unreachable(exc):
            raise
        raise RetryableError(
            f"{job.phase}: could not start node {rank}'s flow run: the Prefect API does not answer ({reason(exc)}); "
            "run the pipeline again once it is back"
        ) from None
    return run.id


@dataclass
class NodeFlowRun:
    """One node's flow run, followed through the Prefect API; a member of the supervise loop."""

    node_rank: int
    run_id: UUID
    client: SyncPrefectClient
    run_url: Location
    phase: Phase
    outage: ApiOutage
    state: State | None = None
    ended_at: float | None = None  # when its record of a good end was first seen while its flow run was not final

    def returncode(self) -> int | None:
        """None while the flow run is not final (or the API does not answer); 0 when it completed, else 1 (its node's
        code is in status.json). After an outage, a node that recorded its end well is taken as finished where its
        flow run could not report it."""
        try:
            state = self.client.read_flow_run(self.run_id).state
        except Exception as exc:
            if not unreachable(exc):
                raise
            # Wait for the API rather than end the phase now: the pipeline's own engine needs it to go on.
            self.outage.failed(exc)
            return None
        self.outage.answered()
        if state is not None and state.is_final():
            self.state = state
            if state.is_completed():
                return 0
            if recorded_end(self.run_url, self.node_rank, self.phase) != 0:
                return 1
            self._completed_after_all(state)  # its engine could not report the end: it failed on the API
            return 0
        if self.outage.happened and recorded_end(self.run_url, self.node_rank, self.phase) == 0:
            # Ended during the outage, and its engine may have given up reporting it: after REPORT_GRACE_S, the
            # node's record stands for the report.
            self.ended_at = self.ended_at or time.monotonic()
            if time.monotonic() - self.ended_at > REPORT_GRACE_S:
                self._completed_after_all(state)
                return 0
        return None

    def _completed_after_all(self, state: State | None) -> None:
        """The node finished well but its flow run could not report it (the API was away when it ended): say so on
        the server too, so that the UI and the run's history agree with the node."""
        message = (
            f"node {self.node_rank} finished its {self.phase} (its status.json); the flow run could not report its "
            f"end to the API (it is {state.name if state else 'without a state'}"
            f"{': ' + (state.message or '').strip()[:200] if state and state.message else ''})"
        )
        log.warning("%s", message)
        try:
            self.client.set_flow_run_state(self.run_id, Completed(message=message), force=True)
        except Exception as exc:  # noqa: BLE001 - only the record on the server stays wrong
            log.warning("could not correct the state of node %d's flow run: %s", self.node_rank, reason(exc))

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


def _follow(children: dict[int, UUID], run_url: Location, phase: Phase, watch: Watch | None, outage_s: float) -> None:
    """Poll the children's states until all completed; raise for the failure that caused the others."""
    outage = ApiOutage(outage_s, "the nodes go on, followed through their records on storage")
    with fail_fast(), get_client(sync_client=True) as client:
        runs = [NodeFlowRun(rank, run_id, client, run_url, phase, outage) for rank, run_id in children.items()]
        supervise(runs, [watch] if watch is not None else [], POLL_S)


def _cancel_unfinished(children: dict[int, UUID]) -> None:
    """Ask every child that is not final to cancel (its worker then stops its process group), and wait until each
    is final, up to CANCEL_WAIT_S: a retry sent while the last attempt's node 0 still held the rendezvous port (the
    same port: this backend does not pick one per launch) or its GPUs would fail on them."""
    if not children:
        return
    try:
        _cancel_and_wait(children)
    except Exception as exc:
        if not unreachable(exc):
            raise
        log.warning(
            "could not cancel the node flow runs: the Prefect API does not answer (%s); their nodes stop by "
            "themselves %.0f s after this phase ends (the pipeline's liveness record)",
            reason(exc),
            STALE_S,
        )


def _cancel_and_wait(children: dict[int, UUID]) -> None:
    """Set every unfinished child Cancelling and wait up to CANCEL_WAIT_S for all to be final."""
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
