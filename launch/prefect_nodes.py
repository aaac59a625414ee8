"""`launch.backend: prefect`: one child run of the `node` deployment per node, sent to that node's work
queue (`{launch.queue_prefix}{rank}`), where a process worker on the node runs it (flows/node.py).

The pipeline follows the children: a child that fails, crashes or is cancelled stops the others and
fails the step naming its node, with the tail of that node's log from shared storage. Whatever way
this function exits (success, failure, the parent being cancelled), no child is left running.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any
from uuid import UUID

from prefect.client.orchestration import get_client
from prefect.deployments import run_deployment
from prefect.states import Cancelling

from storage import layout
from config.errors import RetryableError, UserError
from storage.spec import Spec
from storage.fs import exists, join, read_bytes
from launch.agent import heartbeat_dir
from launch.watch import Watch, metrics_url

POLL_S = 1.0
DEFAULT_MASTER_PORT = 6001  # Qwen's scripts' default; preflight refuses it if it is taken


def node_parameters(spec: Spec, spec_url: str, node_rank: int, port: int, phase: str, model_url: str | None,
                    spec_digest: str | None) -> dict[str, Any]:
    """The node flow's parameters for one node."""
    launch = spec.config.launch
    return {"spec_url": spec_url, "node_rank": node_rank, "nnodes": launch.nnodes,
            "nproc_per_node": launch.nproc_per_node, "master_addr": launch.master_addr, "master_port": port,
            "phase": phase, "model_url": model_url, "expected_spec_digest": spec_digest}


def log_tail(run_url: str, node_rank: int, lines: int = 15) -> str:
    """The end of a node's log on shared storage."""
    url = join(layout.node_dir(run_url, node_rank), layout.LOG)
    if not exists(url):
        return "(no log on storage)"
    return "".join(read_bytes(url).decode(errors="replace").splitlines(keepends=True)[-lines:])


def run_prefect_nodes(spec: Spec, spec_url: str, phase: str, info: Callable[[str], None], *,
                      model_url: str | None = None, spec_digest: str | None = None,
                      on_progress: Callable[[dict], None] | None = None) -> None:
    """Start the node flow on every node's queue and wait for all of them; raise naming the first failure."""
    launch = spec.config.launch
    port = launch.master_port or DEFAULT_MASTER_PORT
    children: dict[int, UUID] = {}
    watch = None
    if on_progress is not None:
        beats = {n: heartbeat_dir(spec.run_url, n, phase) for n in range(launch.nnodes)}
        watch = Watch(metrics_url(spec.run_url), beats, launch.stall_timeout, launch.rdzv_timeout, on_progress)
    try:
        for rank in range(launch.nnodes):
            run = run_deployment(name=launch.node_deployment, timeout=0, work_queue_name=f"{launch.queue_prefix}{rank}",
                                 parameters=node_parameters(spec, spec_url, rank, port, phase, model_url, spec_digest),
                                 flow_run_name=f"{spec.run_id}-{phase}-node{rank}")
            children[rank] = run.id
        info(f"{phase}: {launch.nnodes} node flow runs sent to queues {launch.queue_prefix}0.."
             f"{launch.queue_prefix}{launch.nnodes - 1} ({launch.node_deployment}), rendezvous "
             f"{launch.master_addr}:{port}")
        _follow(children, spec, phase, watch)
    finally:
        _cancel_unfinished(children)


def _follow(children: dict[int, UUID], spec: Spec, phase: str, watch: Watch | None) -> None:
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
                           f"{log_tail(spec.run_url, rank)}")
                raise (UserError if "UserError" in (state.message or "") else RetryableError)(message)
            time.sleep(POLL_S)


def _cancel_unfinished(children: dict[int, UUID]) -> None:
    """Ask every child that is not final to cancel (its worker then stops its process group)."""
    if not children:
        return
    with get_client(sync_client=True) as client:
        for run_id in children.values():
            state = client.read_flow_run(run_id).state
            if state is not None and not state.is_final():
                client.set_flow_run_state(run_id, Cancelling(), force=True)
