"""`launch.backend: local`: every node is a torchrun agent on this machine (the default; CI; debugging).

Each node runs the lifecycle of every other backend's node (launch/node.py `run_node`: its claim, preflight, its
agent, status.json with the failure record, the note that stops its peers), in a thread of this process: a Python
process per node would add its start-up to every local run. The nodes start together: node 1's preflight waits for
node 0's rendezvous port, as on a cluster. This thread follows the node threads in the one supervise loop
(launch/supervise.py) with the progress and stall watch, so `on_progress` is called from the thread that runs the
phase. Whatever way the phase ends, every node thread is stopped and joined (`LocalPhase.cancel`): after a failure (a
node's, a stall) with the failure's short grace, after a cancel (Ctrl-C, SIGTERM from a Prefect worker) with the
cancel's (`grace_for`).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from config.sections.launch import LaunchConfig
from core.errors import TandemError
from launch.agent import grace_for, raise_on_sigterm
from launch.backend import started
from launch.command import free_port
from launch.elastic import resized
from launch.job import Info, NodePlan, OnProgress, PhaseJob
from launch.node import NodeStop, describe_node, run_node
from launch.preflight import probe_node
from launch.supervise import Failure, supervise
from launch.watch import phase_watch
from storage.spec import Attempt, Spec


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


class LocalBackend:
    """`launch.backend: local`: the nodes are threads of this process, each running `run_node`."""

    elastic = True  # an attempt runs on the slots that pass preflight's node-local checks

    def describe(self, job: PhaseJob) -> str:
        """Each node's steps, its ranks' environment and its agent's torchrun line."""
        launch = job.written.spec.config.launch
        port = launch.master_port or free_port()
        head = (
            f"# launch.backend=local: {launch.nnodes} node(s) on this machine, each a thread of the pipeline's process"
            + ("" if launch.master_port else f"; rendezvous port {port} is a free one, picked again at submission")
        )
        nodes = [describe_node(job, self.plan(job, rank, port)) for rank in range(launch.nnodes)]
        return "\n".join([head, *nodes]) + "\n"

    def submit(self, job: PhaseJob, info: Info) -> LocalPhase:
        """Start every node's thread; node 1's preflight waits for node 0's rendezvous port, as on a cluster."""
        launch = job.written.spec.config.launch
        port = launch.master_port or free_port()
        raise_on_sigterm()  # only this (main) thread may install it: the nodes' threads start their agents
        phase = LocalPhase(job, [LocalNode(rank) for rank in range(launch.nnodes)])

        def start() -> None:
            for node in phase.nodes:
                node.start(job, self.plan(job, node.node_rank, port), info)
            info(
                f"{job.phase}: started {launch.nnodes} node(s) x {launch.nproc_per_node} rank(s), "
                f"rendezvous {launch.rendezvous_addr}:{port}"
            )

        return started(phase, start)

    @staticmethod
    def plan(job: PhaseJob, rank: int, port: int) -> NodePlan:
        """Node `rank`'s place: every node on launch.rendezvous_addr."""
        launch = job.written.spec.config.launch
        return NodePlan(rank, launch.nnodes, launch.nproc_per_node, launch.rendezvous_addr, port)

    def probe(self, spec: Spec, slot: int) -> str | None:
        """Preflight's node-local checks for a slot of this machine."""
        return probe_node(spec, slot)

    def attempt_launch(self, launch: LaunchConfig, attempt: Attempt) -> LaunchConfig:
        """As many nodes as the attempt has."""
        return resized(launch, attempt)


@dataclass
class LocalPhase:
    """A phase's node threads: followed in the one supervise loop with the progress and stall watch (so that
    `on_progress` is called from the thread that runs the phase), then stopped and joined."""

    job: PhaseJob
    nodes: list[LocalNode]

    def follow(self, on_progress: OnProgress | None) -> None:
        """Until every node finished; raise naming the node that failed first."""
        spec = self.job.written.spec
        watch = phase_watch(spec.run, spec.config.launch, self.job.phase, on_progress)
        supervise(self.nodes, [watch] if watch is not None else [])

    def cancel(self, *, failed: bool) -> None:
        """Stop every node thread with the failure's or the cancel's grace (`grace_for`), and join them all."""
        grace = grace_for(self.job.written.spec.config.launch, failed=failed)
        for node in self.nodes:
            node.stop.trip(grace)
        for node in self.nodes:
            node.join()
