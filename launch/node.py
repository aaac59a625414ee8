"""One node of a job, whatever started it (the local backend's loop, a per-node flow, srun): preflight before
training, then the node's torchrun agent, supervised until it exits."""

from __future__ import annotations

import logging
from collections.abc import Callable

from config.errors import EXIT_USER_ERROR, TandemError
from config.schema import LaunchConfig
from launch.agent import Agent, grace_for, kill, start_agent, supervise
from launch.claim import NodeClaim
from launch.network import source_address
from launch.phase import Info, PhaseJob
from launch.preflight import NodePlan, run_preflight
from storage import layout
from storage.fs import exists, join, read_json, write_json_atomic

log = logging.getLogger(__name__)
# status.json's record of why a node failed: the exit code of its error (2: retrying cannot help).
ERROR_EXIT_CODE = "error_exit_code"


def start_node(run_url: str, plan: NodePlan, launch: LaunchConfig, module: str, args: list[str], phase: str,
               preflight: Callable[[NodePlan], object] | None) -> Agent:
    """Preflight this node (when given a preflight), then start its torchrun agent."""
    if preflight is not None:
        preflight(plan)
    return start_agent(run_url, plan, launch, module, args, phase)


def job_preflight(job: PhaseJob, info: Info,
                  poll: Callable[[], None] | None = None) -> Callable[[NodePlan], object] | None:
    """The preflight of a job's nodes: every check before training (and the probe alone), none before eval."""
    if job.phase not in ("train", "probe"):
        return None
    written = job.written
    return lambda plan: run_preflight(written.spec, written.url, plan, expected_spec_digest=written.digest,
                                      info=info, poll=poll)


def run_node(job: PhaseJob, plan: NodePlan, info: Info | None = None) -> None:
    """Preflight (training) and run this node's agent until it exits; raise naming the failure. A failure is also
    recorded in the node's status.json by its exit code, for a pipeline that follows this node from elsewhere."""
    info = info or log.info
    spec = job.written.spec
    clear_failure(spec.run_url, plan.node_rank)
    claim = NodeClaim(spec.run_url, plan.node_rank, plan.nnodes, _address_towards(plan.master_addr))
    try:
        claim.take()
        agent = start_node(spec.run_url, plan, spec.config.launch, job.module, job.args, job.phase,
                           job_preflight(job, info, claim.poll))
        info(f"node {plan.node_rank}/{plan.nnodes}: {job.phase} started, {plan.nproc_per_node} rank(s), "
             f"rendezvous {plan.master_addr}:{plan.master_port}")
        try:
            supervise([agent], spec.run_url, job.phase, claim)  # the claim's renewal raises on a duplicate rank
        finally:
            kill([agent], grace_for(spec.config.launch))
    except TandemError as exc:
        error = exc if claim.stopped_by_peer else _root_cause(claim, exc)
        if error is exc and not claim.stopped_by_peer:
            claim.stop_all(str(exc).partition("\n")[0], exc.exit_code)
        try:
            record_failure(spec.run_url, plan.node_rank, job.phase, error.exit_code)
        except Exception as failed:  # noqa: BLE001 - the node's own error is the one to raise
            log.warning("node %d: could not record its failure in status.json: %s", plan.node_rank, failed)
        if error is not exc:
            raise error from exc
        raise
    finally:
        claim.release()
    info(f"node {plan.node_rank}: {job.phase} finished")


def _root_cause(claim: NodeClaim, error: TandemError) -> TandemError:
    """This node's error, or a peer's that caused it: a peer that cannot be retried (a duplicate rank, bad data)
    stops its agent, and this node's ranks may lose their connections before this node reads the peer's note."""
    if error.exit_code == EXIT_USER_ERROR:
        return error
    try:
        peer = claim.stopped_by()
    except Exception:  # noqa: BLE001 - storage unreadable: this node's own error stands
        return error
    return peer if peer is not None and peer.exit_code == EXIT_USER_ERROR else error


def _address_towards(master_addr: str) -> str:
    try:
        return source_address(master_addr)
    except OSError:
        return ""


def record_failure(run_url: str, node_rank: int, phase: str, exit_code: int) -> None:
    """Add the exit code of a node's error to its status.json (written there when its agent exited)."""
    url = join(layout.node_dir(run_url, node_rank), layout.STATUS)
    status = read_json(url) if exists(url) else {"node_rank": node_rank}
    write_json_atomic(url, {**status, "phase": phase, ERROR_EXIT_CODE: exit_code})


def clear_failure(run_url: str, node_rank: int) -> None:
    """Forget the failure an earlier attempt of this node recorded."""
    url = join(layout.node_dir(run_url, node_rank), layout.STATUS)
    if exists(url) and ERROR_EXIT_CODE in (status := read_json(url)):
        write_json_atomic(url, {k: v for k, v in status.items() if k != ERROR_EXIT_CODE})


def failure_exit_code(run_url: str, node_rank: int) -> int | None:
    """The exit code a failed node recorded (None when it recorded none: it may not have got that far)."""
    url = join(layout.node_dir(run_url, node_rank), layout.STATUS)
    return read_json(url).get(ERROR_EXIT_CODE) if exists(url) else None
