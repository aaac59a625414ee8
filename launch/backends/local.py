"""`launch.backend: local`: every node is a torchrun agent on this machine (the default; CI; debugging).

Each node runs the lifecycle of every other backend's node (launch/node.py `run_node`: its claim, preflight, its
agent, status.json with the failure record, the note that stops its peers), in a thread of this process: a Python
process per node would add its start-up to every local run. The nodes start together: node 1's preflight waits for
node 0's rendezvous port, as on a cluster. This thread follows the node threads in the one supervise loop
(launch/supervise.py) with the progress and stall watch, so `on_progress` is called from the thread that runs the
phase. Whatever way it exits, every node thread is stopped and joined: after a failure (a node's, a stall) with the
failure's short grace, after a cancel (Ctrl-C, SIGTERM from a Prefect worker) with the cancel's (`grace_for`).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from core.errors import TandemError
from launch.agent import grace_for, raise_on_sigterm
from launch.command import free_port
from launch.job import Info, NodePlan, OnProgress, PhaseJob
from launch.node import NodeStop, run_node
from launch.supervise import Failure, supervise
from launch.watch import phase_watch


@dataclass
class LocalNode:
    """One node's `run_node` in a thread of this process, as a member of the supervise loop."""

    node_rank: int
    stop: NodeStop = field(default_factory=NodeStop)
    error: BaseException | None = None
    ended_at: float = 0.0
    thread: threading.Thread | None = None

    def start(self, job: PhaseJob, plan: NodePlan, info: Info) -> None:
        """Run the node in a thread of its own (a daemon: a second Ctrl-C must not hang the interpreter's exit)."""
        self.thread = threading.Thread(
            target=self._run, args=(job, plan, info), name=f"node-{self.node_rank}", daemon=True
        )
        self.thread.start()

    def _run(self, job: PhaseJob, plan: NodePlan, info: Info) -> None:
        try:
            run_node(job, plan, info, stop=self.stop)
        except BaseException as exc:  # noqa: BLE001 - reported by the supervise loop, raised in the pipeline's thread
            self.error = exc
        finally:
            self.ended_at = time.monotonic()

    def returncode(self) -> int | None:
        """None while the node runs; 0 when it finished; else its error's exit code (1 for a bug)."""
        if self.thread is None or self.thread.is_alive():
            return None
        if self.error is None:
            return 0
        return self.error.exit_code if isinstance(self.error, TandemError) else 1

    def failure(self) -> Failure:
        """The node's error; not its own when it stopped because another node failed."""
        assert self.error is not None
        code = self.error.exit_code if isinstance(self.error, TandemError) else None
        return Failure(self.error, code, self.ended_at, own=not self.stop.by_peer)

    def join(self) -> None:
        """Wait for the node's thread to end."""
        if self.thread is not None:
            self.thread.join()


def run_local_job(job: PhaseJob, info: Info, on_progress: OnProgress | None = None) -> None:
    """The local backend (launch/phase.py): every node of the job on this machine; returns when all finished, or
    raises naming the node that failed first (and only once every node stopped)."""
    spec = job.written.spec
    launch = spec.config.launch
    port = launch.master_port or free_port()
    watch = phase_watch(spec.run, launch, job.phase, on_progress)
    raise_on_sigterm()  # only this (main) thread may install it: the nodes' threads start their agents
    nodes = [LocalNode(rank) for rank in range(launch.nnodes)]
    failed = False
    try:
        for node in nodes:
            node.start(
                job, NodePlan(node.node_rank, launch.nnodes, launch.nproc_per_node, launch.rendezvous_addr, port), info
            )
        info(
            f"{job.phase}: started {launch.nnodes} node(s) x {launch.nproc_per_node} rank(s), "
            f"rendezvous {launch.rendezvous_addr}:{port}"
        )
        supervise(nodes, [watch] if watch is not None else [])
    except TandemError:
        failed = True  # not a cancel: the survivors get a short grace (grace_for)
        raise
    finally:
        grace = grace_for(launch, failed=failed)
        for node in nodes:
            node.stop.trip(grace)
        for node in nodes:
            node.join()
