"""`launch.backend: local`: every node is a torchrun agent on this machine (the default; CI; debugging).

Nodes start in order, as on a real cluster: node 0's preflight and agent first (its agent opens the
rendezvous port), then each other node's preflight (which waits for that port) and agent.
"""

from __future__ import annotations

from collections.abc import Callable

from config.errors import TandemError
from config.schema import LaunchConfig
from launch.agent import Agent, grace_for, kill, supervise
from launch.command import free_port
from launch.node import job_preflight, start_node
from launch.phase import Info, OnProgress, PhaseJob
from launch.preflight import NodePlan
from launch.watch import phase_watch


def run_local_job(job: PhaseJob, info: Info, on_progress: OnProgress | None = None) -> None:
    """The local backend's entry (launch/phase.py): every node of the job on this machine."""
    spec = job.written.spec
    run_local_nodes(spec.run_url, spec.config.launch, job.module, job.args, job.phase, info,
                    on_progress=on_progress, preflight=job_preflight(job, info))


def run_local_nodes(run_url: str, launch: LaunchConfig, module: str, args: list[str], phase: str,
                    info: Callable[[str], None], on_progress: Callable[[dict], None] | None = None,
                    preflight: Callable[[NodePlan], object] | None = None) -> None:
    """Start one torchrun agent per node, wait for all; raise naming the first node that fails.

    With `on_progress` (training), new steps are reported through it and a stall stops the job;
    with `preflight`, each node is checked before its agent starts.
    """
    port = launch.master_port or free_port()
    agents: list[Agent] = []
    watch = phase_watch(run_url, launch, phase, on_progress)
    failed = False
    try:
        for node_rank in range(launch.nnodes):
            plan = NodePlan(node_rank, launch.nnodes, launch.nproc_per_node, launch.rendezvous_addr, port)
            agents.append(start_node(run_url, plan, launch, module, args, phase, preflight))
        info(f"{phase}: started {launch.nnodes} node(s) x {launch.nproc_per_node} rank(s), "
             f"rendezvous {launch.rendezvous_addr}:{port}")
        supervise(agents, run_url, phase, watch)
    except TandemError:
        failed = True  # not a cancel: the survivors get a short grace (grace_for)
        raise
    finally:
        kill(agents, grace_for(launch, failed=failed))
