"""`launch.backend: ssh`: `python -m launch.node` on every host of launch.hosts / launch.hostfile, over the system's
OpenSSH client (the setup of Qwen's PBS recipe and DeepSpeed's hostfile launcher: machines that reach each other
over password-less SSH, nothing else).

Each host is first checked over one shared connection (BatchMode, a connect timeout, ControlMaster): it must
accept the key and have the checkout and its Python; node 0 also picks the rendezvous port. Then every node runs
`launch.backends.ssh_bootstrap`, which reads the run's environment from the connection's stdin (never a command
line) and stops the node when that connection closes, or when it has heard nothing for LINK_LOST_S (the launcher
sends a heartbeat line every HEARTBEAT_S): a host cut off the network, whose connection neither closes nor resets,
stops its own ranks instead of leaving them blocked in a collective. The nodes' ssh processes are followed by the
one supervise loop (launch/supervise.py): the first node whose ssh exits non-zero stops the job, named with its
host; the other nodes are told the phase failed, so they get the short grace of a failure (`grace_for`); whatever
way the phase ends short of every node finishing, each host's leftovers are killed by the node's tag
(`SshPhase.cancel`). The hosts' ssh command lines and checks are launch/backends/ssh_hosts.py.
"""

from __future__ import annotations

import contextlib
import json
import shlex
import subprocess
import threading
import time
import uuid
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from config.hosts import Host, parse_host
from config.sections.launch import LaunchConfig
from core.errors import RetryableError
from launch.agent import grace_for
from launch.backend import started
from launch.backends.ssh_errors import ssh_failure
from launch.backends.ssh_hosts import SERVER_ALIVE_COUNT, SERVER_ALIVE_S, Ssh, check_command, check_hosts, probe_host
from launch.command import DEFAULT_MASTER_PORT, node_environment
from launch.diagnose import error_for, is_one_line, log_tail
from launch.elastic import resized
from launch.job import Info, NodePlan, OnProgress, PhaseJob
from launch.preflight import plan_environment
from launch.supervise import Failure, supervise
from launch.watch import phase_watch
from storage.spec import Attempt, Spec

HEARTBEAT_S = 2.0
# A node that hears nothing for this long stops itself: by then this side's ssh has given up on it as well.
LINK_LOST_S = SERVER_ALIVE_S * SERVER_ALIVE_COUNT + 5
# What a description shows for the private directory of the shared connections, made at submission.
DESCRIBED_CONTROL_DIR = "/tmp/tandem-ssh-XXXXXXXX"


@dataclass
class SshNode:
    """One host's `launch.node` over ssh, and the last lines it printed; a member of the supervise loop."""

    node_rank: int
    host: Host
    process: subprocess.Popen
    tag: str
    job: PhaseJob
    lines: deque = field(default_factory=lambda: deque(maxlen=40))
    relay: threading.Thread | None = None
    ended_at: float | None = None
    _input: threading.Lock = field(default_factory=threading.Lock)

    @property
    def name(self) -> str:
        return f"node {self.node_rank} ({self.host})"

    def send(self, line: str) -> bool:
        """Write one line to the bootstrap's input; False once it is closed or the connection is gone."""
        with self._input:
            stdin = self.process.stdin
            if stdin is None or stdin.closed:
                return False
            try:
                stdin.write(line + "\n")
                stdin.flush()
            except (OSError, ValueError):
                return False
            return True

    def returncode(self) -> int | None:
        """None while the node's ssh runs, else its exit code."""
        code = self.process.poll()
        if code is not None and self.ended_at is None:
            self.ended_at = time.monotonic()
        return code

    def failure(self) -> Failure:
        """The error of the node: its own error line (named with its host), ssh's own failure, or a lost node."""
        code = self.process.returncode
        if self.relay is not None:
            self.relay.join(0.2)  # let the relay thread take the last lines
        errors = [line[len("error: ") :] for line in self.lines if line.startswith("error: ")]
        phase, run_url = self.job.phase, self.job.written.spec.run
        if errors:
            said, prefix = errors[0], f"{phase} failed on node {self.node_rank}"
            headline = (
                f"{prefix} ({self.host}){said[len(prefix) :]}"
                if said.startswith(prefix)
                else f"{phase} failed on {self.name}: {said}"
            )
            details = "" if is_one_line(headline) else f"\nlast lines of its log:\n{log_tail(run_url, self.node_rank)}"
            error = error_for(code, headline + details)
        elif code == 255 and self.lines and not any("node " in line for line in self.lines):
            error = ssh_failure(self.name, code, "\n".join(self.lines))
        else:
            error = RetryableError(
                f"{phase} failed on {self.name}: its node process ended without an error line "
                f"(exit {code}): it was killed, or the host or its connection went down\nlast "
                f"lines of its log:\n{log_tail(run_url, self.node_rank)}"
            )
        return Failure(error, code, self.ended_at or time.monotonic())

    def close_input(self, failed: bool) -> None:
        """End the bootstrap's input, which stops the node; `failed` first tells it the phase failed."""
        if failed:
            self.send("failed")
        with self._input, contextlib.suppress(OSError, ValueError):
            if self.process.stdin is not None:
                self.process.stdin.close()


class Heartbeats:
    """A line to every started node each HEARTBEAT_S, from a thread of its own (a slow storage read in the
    supervisor's loop must not look like a lost launcher)."""

    def __init__(self, nodes: list[SshNode]) -> None:
        self.nodes = nodes
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            for node in list(self.nodes):
                if node.process.poll() is None:
                    node.send("")

    def close(self) -> None:
        self._stop.set()
        self._thread.join()


class SshBackend:
    """`launch.backend: ssh`: `python -m launch.node` on every host of launch.hosts, over OpenSSH."""

    elastic = True  # an attempt runs on the hosts that answer the probe

    def describe(self, job: PhaseJob) -> str:
        """Each host's check and start commands, and the JSON line the start sends over the connection's stdin
        (launch.forward_env's values masked)."""
        launch = job.written.spec.config.launch
        ssh = Ssh(launch, control_dir=DESCRIBED_CONTROL_DIR)
        lines = [
            f"# launch.backend=ssh: {launch.nnodes} host(s), each checked over one shared connection (under a "
            "private control directory made at submission), then its node started under "
            "launch.backends.ssh_bootstrap, which reads the JSON line that follows from stdin"
            + ("; PORT: a free port node 0 picks at its check" if launch.master_port is None else "")
        ]
        for rank, host in enumerate(hosts_of(launch)):
            plan = NodePlan(rank, launch.nnodes, launch.nproc_per_node, launch.rendezvous_addr, 0)
            sent = request(job, plan, f"LAUNCH-ID-{rank}")
            sent["env"] = {k: "***" if k in launch.forward_env else v for k, v in sent["env"].items()}
            sent["env"]["MASTER_PORT"] = str(launch.master_port or "PORT")
            lines += [
                f"# node {rank} ({host})",
                shlex.join(ssh.command(host, check_command(ssh, rank == 0 and launch.master_port is None))),
                shlex.join(ssh.command(host, start_command(ssh))),
                json.dumps(sent),
            ]
        return "\n".join(lines) + "\n"

    def submit(self, job: PhaseJob, info: Info) -> SshPhase:
        """Check every host, then start its node."""
        launch = job.written.spec.config.launch
        phase = SshPhase(job, hosts_of(launch), Ssh(launch))
        return started(phase, lambda: phase.start(info))

    def probe(self, spec: Spec, slot: int) -> str | None:
        """The host in `slot` of launch.hosts, over ssh (reachable with the key, the checkout and its Python)."""
        return probe_host(spec.config.launch, slot)

    def attempt_launch(self, launch: LaunchConfig, attempt: Attempt) -> LaunchConfig:
        """The attempt's hosts, node 0 first, which also moves the rendezvous to the first of them when
        launch.master_addr is unset."""
        # The hosts decide an ssh section's node count (config/sections/launch.py), so the attempt's section holds
        # its own hosts, and no max_nnodes above them; the next attempt starts again from the whole list.
        hosts = [launch.hosts[slot] for slot in attempt.nodes]
        return resized(launch, attempt).model_copy(update={"hosts": hosts, "max_nnodes": None})


def hosts_of(launch: LaunchConfig) -> list[Host]:
    """launch.hosts, parsed."""
    return [parse_host(h, f"launch.hosts[{i}]") for i, h in enumerate(launch.hosts)]


class SshPhase:
    """A phase's nodes over ssh: their heartbeats, the one supervise loop, and their stop."""

    def __init__(self, job: PhaseJob, hosts: list[Host], ssh: Ssh) -> None:
        self.job, self.hosts, self.ssh = job, hosts, ssh
        self.nodes: list[SshNode] = []
        self.heartbeats = Heartbeats(self.nodes)
        self.done = False

    def start(self, info: Info) -> None:
        """Check every host (node 0 picks the port), then start each node."""
        launch = self.job.written.spec.config.launch
        pick = launch.master_port is None
        port = check_hosts(self.ssh, self.hosts, pick_port=pick) or launch.master_port or DEFAULT_MASTER_PORT
        launch_id = uuid.uuid4().hex[:12]
        for rank, host in enumerate(self.hosts):
            plan = NodePlan(rank, launch.nnodes, launch.nproc_per_node, launch.rendezvous_addr, port)
            self.nodes.append(start(self.ssh, self.job, plan, host, f"{launch_id}-{rank}", info))
        info(
            f"{self.job.phase}: started {launch.nnodes} node(s) over ssh ({', '.join(map(str, self.hosts))}) x "
            f"{launch.nproc_per_node} rank(s), rendezvous {launch.rendezvous_addr}:{port}"
        )

    def follow(self, on_progress: OnProgress | None) -> None:
        """Until every node's ssh exited 0; raise naming the first node (and host) that failed."""
        spec = self.job.written.spec
        watch = phase_watch(spec.run, spec.config.launch, self.job.phase, on_progress)
        supervise(self.nodes, [watch] if watch is not None else [])
        self.done = True

    def cancel(self, *, failed: bool) -> None:
        """Stop the heartbeats; unless every node finished, stop the nodes (told the phase failed, with `failed`) and
        kill what is left on each host by its tag; end the shared connections."""
        self.heartbeats.close()
        if not self.done:
            stop(self.ssh, self.nodes, grace_for(self.job.written.spec.config.launch, failed=failed), failed=failed)
        self.ssh.close(self.hosts)


def start(ssh: Ssh, job: PhaseJob, plan: NodePlan, host: Host, tag: str, info: Info) -> SshNode:
    """Start `launch.node` on one host: the environment and the plan go over stdin; its output is relayed."""
    process = subprocess.Popen(
        ssh.command(host, start_command(ssh)),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        bufsize=1,
    )
    assert process.stdin is not None
    process.stdin.write(json.dumps(request(job, plan, tag)) + "\n")
    process.stdin.flush()
    node = SshNode(plan.node_rank, host, process, tag, job)
    node.relay = threading.Thread(target=_relay, args=(node, info), daemon=True)
    node.relay.start()
    return node


def request(job: PhaseJob, plan: NodePlan, tag: str) -> dict[str, Any]:
    """What the bootstrap reads first (its contract: docs/architecture.md, Launching): the node's environment (the
    run's, the job's and its place), `launch.node`'s arguments, its tag, and the graces of a cancel, of a failure and of
    a lost link."""
    launch = job.written.spec.config.launch
    return {
        "env": {**node_environment(launch, job.env), **plan_environment(plan)},
        "argv": job.node_args,
        "tag": tag,
        "grace_s": grace_for(launch),
        "failed_grace_s": grace_for(launch, failed=True),
        "lost_s": LINK_LOST_S,
    }


def start_command(ssh: Ssh) -> str:
    """The remote command that starts a node: the bootstrap, in the checkout."""
    return ssh.in_root(f"exec {shlex.quote(ssh.python)} -m launch.backends.ssh_bootstrap")


def _relay(node: SshNode, info: Info) -> None:
    """Pass a node's own lines (preflight, started, its error) to the pipeline's log, and keep the last ones."""
    assert node.process.stdout is not None
    for line in node.process.stdout:
        line = line.rstrip("\n")
        node.lines.append(line)
        if line.strip():
            info(f"{node.name}: {line}")


def stop(ssh: Ssh, nodes: list[SshNode], grace_s: float, failed: bool = False) -> None:
    """Stop every node that is still running: close its connection's stdin (the bootstrap stops the node; after
    `failed`, with the failure's grace), wait for the grace, then kill what is left on each host by its tag."""
    for node in nodes:
        if node.process.poll() is None:
            node.close_input(failed)
    deadline = time.monotonic() + grace_s + 5
    for node in nodes:
        with contextlib.suppress(subprocess.TimeoutExpired):
            node.process.wait(timeout=max(0.0, deadline - time.monotonic()))

    def sweep(node: SshNode) -> None:
        remote = ssh.in_root(f"{shlex.quote(ssh.python)} -m launch.backends.ssh_bootstrap --kill {node.tag}")
        with contextlib.suppress(subprocess.TimeoutExpired, OSError):
            subprocess.run(ssh.command(node.host, remote), capture_output=True, timeout=30, stdin=subprocess.DEVNULL)
        if node.process.poll() is None:
            node.process.kill()
            node.process.wait()

    if nodes:
        with ThreadPoolExecutor(max_workers=min(32, len(nodes))) as pool:
            list(pool.map(sweep, nodes))
