"""`launch.backend: ssh`: `python -m flows.node` on every host of launch.hosts / launch.hostfile, over the system's
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
way this function exits, each host's leftovers are killed by the node's tag.
"""

from __future__ import annotations

import contextlib
import json
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from config.hosts import Host, parse_host
from config.sections.launch import LaunchConfig
from core.checkout import PROJECT_ROOT
from core.errors import RetryableError, TandemError, UserError
from launch.agent import grace_for
from launch.backends.ssh_errors import ssh_failure
from launch.command import DEFAULT_MASTER_PORT, node_environment
from launch.diagnose import error_for, is_one_line, log_tail
from launch.job import Info, NodePlan, OnProgress, PhaseJob
from launch.preflight import plan_environment
from launch.supervise import Failure, supervise
from launch.watch import phase_watch

SERVER_ALIVE_S, SERVER_ALIVE_COUNT = 5, 3  # ssh gives up on a silent host after 15 s
HEARTBEAT_S = 2.0
# A node that hears nothing for this long stops itself: by then this side's ssh has given up on it as well.
LINK_LOST_S = SERVER_ALIVE_S * SERVER_ALIVE_COUNT + 5
CHECK_TIMEOUT_S = 60
_PICK_PORT = "import socket; s = socket.socket(); s.bind(('', 0)); print(s.getsockname()[1])"


@dataclass
class SshNode:
    """One host's `flows.node` over ssh, and the last lines it printed; a member of the supervise loop."""

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


class Ssh:
    """ssh command lines for one launch: shared connections under a private control directory."""

    def __init__(self, launch: LaunchConfig) -> None:
        self.launch = launch
        self.control_dir = tempfile.mkdtemp(prefix="tandem-ssh-")
        self.root = launch.remote_root or str(PROJECT_ROOT)
        self.python = launch.remote_python or sys.executable

    def command(self, host: Host, remote: str) -> list[str]:
        """ssh HOST REMOTE with batch mode (never a password prompt), a connect timeout, keep-alives that notice a
        dead host within seconds, and one shared connection per host."""
        port = ["-p", str(host.port)] if host.port else []
        return [
            "ssh",
            "-T",
            "-o",
            "BatchMode=yes",
            "-o",
            f"ConnectTimeout={self.launch.ssh_connect_timeout}",
            "-o",
            f"ServerAliveInterval={SERVER_ALIVE_S}",
            "-o",
            f"ServerAliveCountMax={SERVER_ALIVE_COUNT}",
            "-o",
            "ControlMaster=auto",
            "-o",
            f"ControlPath={self.control_dir}/%C",
            "-o",
            "ControlPersist=120",
            *port,
            *self.launch.ssh_options,
            host.target,
            remote,
        ]

    def in_root(self, remote: str) -> str:
        """A remote command run in the checkout."""
        return f"cd {shlex.quote(self.root)} && {remote}"

    def close(self, hosts: list[Host]) -> None:
        """End the shared connections (their master processes would otherwise linger for ControlPersist)."""
        for host in hosts:
            subprocess.run([*self.command(host, "")[:-2], "-O", "exit", host.target], capture_output=True, timeout=30)
        # `-O exit` returns before the master removes its socket: remove the directory with whatever is left in it.
        shutil.rmtree(self.control_dir, ignore_errors=True)


def run_ssh_nodes(job: PhaseJob, info: Info, on_progress: OnProgress | None = None) -> None:
    """Start the node on every host and wait for all; raise naming the first node (and host) that failed."""
    spec, phase = job.written.spec, job.phase
    launch = spec.config.launch
    hosts = [parse_host(h, f"launch.hosts[{i}]") for i, h in enumerate(launch.hosts)]
    ssh = Ssh(launch)
    nodes: list[SshNode] = []
    heartbeats = Heartbeats(nodes)
    clean = failed = False
    try:
        port = (
            check_hosts(ssh, hosts, pick_port=launch.master_port is None) or launch.master_port or DEFAULT_MASTER_PORT
        )
        watch = phase_watch(spec.run, launch, phase, on_progress)
        launch_id = uuid.uuid4().hex[:12]
        for rank, host in enumerate(hosts):
            plan = NodePlan(rank, launch.nnodes, launch.nproc_per_node, launch.rendezvous_addr, port)
            nodes.append(start(ssh, job, plan, host, f"{launch_id}-{rank}", info))
        info(
            f"{phase}: started {launch.nnodes} node(s) over ssh ({', '.join(map(str, hosts))}) x "
            f"{launch.nproc_per_node} rank(s), rendezvous {launch.rendezvous_addr}:{port}"
        )
        supervise(nodes, [watch] if watch is not None else [])
        clean = True
    except TandemError:
        failed = True  # not a cancel: the survivors get a failure's short grace (grace_for)
        raise
    finally:
        heartbeats.close()
        if not clean:
            stop(ssh, nodes, grace_for(launch, failed=failed), failed=failed)
        ssh.close(hosts)


def check_hosts(ssh: Ssh, hosts: list[Host], *, pick_port: bool) -> int | None:
    """Every host, in parallel: reachable with the key, the checkout and its Python there; on node 0 with
    `pick_port`, a free port for the rendezvous. Raises one line naming the host and the fix."""
    with ThreadPoolExecutor(max_workers=min(32, len(hosts))) as pool:
        answers = [pool.submit(check_host, ssh, rank, host, pick_port and rank == 0) for rank, host in enumerate(hosts)]
        results = [answer.result() for answer in answers]  # the first failure in node order raises
    return int(results[0]) if pick_port and results[0].isdigit() else None


def check_host(ssh: Ssh, rank: int, host: Host, pick_port: bool = False) -> str:
    """One host reachable with the key, with the checkout and its Python; with `pick_port`, a free port there
    (printed). Raises one line naming the host and the fix."""
    remote = f"test -d {shlex.quote(ssh.root)} || exit 91; test -x {shlex.quote(ssh.python)} || exit 92; " + (
        f"{shlex.quote(ssh.python)} -c {shlex.quote(_PICK_PORT)}" if pick_port else "true"
    )
    try:
        done = subprocess.run(
            ssh.command(host, remote),
            capture_output=True,
            text=True,
            timeout=CHECK_TIMEOUT_S + ssh.launch.ssh_connect_timeout,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        raise RetryableError(
            f"node {rank} ({host}): ssh did not answer within {CHECK_TIMEOUT_S} s; is the host up and sshd running?"
        ) from None
    if done.returncode == 91:
        raise UserError(
            f"node {rank} ({host}): no Tandem checkout at {ssh.root}; install it there or set "
            "launch.remote_root to its path on the hosts"
        )
    if done.returncode == 92:
        raise UserError(
            f"node {rank} ({host}): no Python at {ssh.python}; create the same virtual environment "
            "there or set launch.remote_python"
        )
    if done.returncode != 0:
        raise ssh_failure(f"node {rank} ({host})", done.returncode, done.stderr)
    return done.stdout.strip()


def probe_host(launch: LaunchConfig, slot: int) -> str | None:
    """An elastic run's probe of the host in `slot` of launch.hosts (launch/elastic.py): check_host's problem in one
    line, or None. The node's own preflight follows when it starts."""
    host = parse_host(launch.hosts[slot], f"launch.hosts[{slot}]")
    ssh = Ssh(launch)
    try:
        check_host(ssh, slot, host)
    except (UserError, RetryableError) as exc:
        return str(exc)
    finally:
        ssh.close([host])
    return None


def start(ssh: Ssh, job: PhaseJob, plan: NodePlan, host: Host, tag: str, info: Info) -> SshNode:
    """Start `flows.node` on one host: the environment and the plan go over stdin; its output is relayed."""
    args = job.node_args
    launch = job.written.spec.config.launch
    request = {
        "env": {**node_environment(launch), **plan_environment(plan)},
        "argv": args,
        "tag": tag,
        "grace_s": grace_for(launch),
        "failed_grace_s": grace_for(launch, failed=True),
        "lost_s": LINK_LOST_S,
    }
    remote = ssh.in_root(f"exec {shlex.quote(ssh.python)} -m launch.backends.ssh_bootstrap")
    process = subprocess.Popen(
        ssh.command(host, remote),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        bufsize=1,
    )
    assert process.stdin is not None
    process.stdin.write(json.dumps(request) + "\n")
    process.stdin.flush()
    node = SshNode(plan.node_rank, host, process, tag, job)
    node.relay = threading.Thread(target=_relay, args=(node, info), daemon=True)
    node.relay.start()
    return node


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
