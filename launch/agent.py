"""One node's torchrun agent: the command line, its environment, starting, supervising and stopping it.

Used by every backend (all nodes on this machine, or one node under a per-node flow). Each agent runs
in its own session, so a whole node's process tree can be signalled at once; it logs to
{run}/nodes/{r}/log.txt and leaves status.json. The supervisor polls the agents: the first one that
exits non-zero stops all the others, and the error names the node, the rank and that rank's own error
line. Any exception on our side (Ctrl-C, a Prefect cancellation, a stall) kills every agent. The command line and
environment are in launch/command.py, the reading of a failed node's log in launch/diagnose.py.

torchrun starts each rank in a session of its own, so a rank is not in its agent's process group: when
the agent itself dies (SIGKILL, the OOM killer) its ranks live on as orphans that no process-group
signal reaches. Every agent therefore gets a unique tag in its environment, which its ranks inherit,
and stopping a node also kills whatever still carries its tag.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Protocol

from config.errors import EXIT_USER_ERROR, RetryableError, UserError
from config.loader import PROJECT_ROOT
from config.schema import LaunchConfig
from launch.command import AGENT_TAG_ENV, heartbeat_dir, node_scratch, rank_environment, torchrun_command
from launch.diagnose import error_for, failure_summary, read_from, tail
from launch.preflight import NodePlan
from launch.watch import Watch
from storage import layout
from storage.fs import is_local, join, put_file, write_json_atomic

POLL_S = 0.5
SETTLE_S = 3.0  # after a first failure, how long the other nodes get to report theirs
KILL_GRACE_S = 10.0
FAILED_GRACE_S = 2.0


@dataclass
class Agent:
    """One node's torchrun process and its log file."""

    node_rank: int
    process: subprocess.Popen
    log_path: str
    log_offset: int  # where this launch's part of the (appended) log begins
    started_at: str
    tag: str = ""  # AGENT_TAG_ENV of the agent and of every process it started


def grace_for(launch: LaunchConfig, *, failed: bool = False) -> float:
    """How long agents get between SIGTERM and SIGKILL: longer when they save a checkpoint on cancel; short once
    the phase has failed (a node lost, a stall, a rank's own error), since the survivors can then neither finish
    nor save (a ZeRO checkpoint is collective): a grace would only delay the failure's report, by up to 10 s when
    they sit in a collective that waits for the lost peer."""
    if failed:
        return FAILED_GRACE_S
    return float(launch.cancel_grace_s) if launch.checkpoint_on_cancel else KILL_GRACE_S


def kill(agents: list[Agent], grace_s: float = KILL_GRACE_S) -> None:
    """SIGTERM every agent's process group, SIGKILL what is left after the grace period."""
    for agent in agents:
        if agent.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(agent.process.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for agent in agents:
        try:
            agent.process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
        with contextlib.suppress(ProcessLookupError):
            os.killpg(agent.process.pid, signal.SIGKILL)
        agent.process.wait()
        for pid in tagged_processes(agent.tag):  # ranks that outlived their agent (own sessions)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def tagged_processes(tag: str, variable: str = AGENT_TAG_ENV) -> list[int]:
    """Pids of this user's processes whose environment carries variable=tag (Linux /proc; none elsewhere)."""
    if not tag or not os.path.isdir("/proc"):
        return []
    needle = f"{variable}={tag}".encode()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as handle:
                if needle in handle.read().split(b"\0"):
                    found.append(int(name))
        except OSError:  # gone meanwhile, or another user's
            continue
    return found


def _publish_node_files(run_url: str, agent: Agent, phase: str) -> None:
    """Write status.json, and upload the log when the run's storage is not local."""
    node_url = layout.node_dir(run_url, agent.node_rank)
    if not is_local(run_url):
        put_file(agent.log_path, join(node_url, layout.LOG))
    write_json_atomic(join(node_url, layout.STATUS), {
        "node_rank": agent.node_rank, "phase": phase, "exit_code": agent.process.returncode,
        "host": socket.gethostname(), "started_at": agent.started_at,
        "ended_at": datetime.now(UTC).isoformat(timespec="seconds"),
    })


def raise_on_sigterm() -> None:
    """Turn SIGTERM (a Prefect worker cancelling this flow run) into SystemExit, so that the `finally`
    blocks that stop our agents' process groups run; Python's default would exit at once and leave
    the agents, which live in their own sessions, running."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _exit_on_signal)


def _exit_on_signal(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def start_agent(run_url: str, plan: NodePlan, launch: LaunchConfig, module: str, args: list[str],
                phase: str) -> Agent:
    """Start this node's torchrun agent in its own session, logging to the node's log."""
    beats = heartbeat_dir(run_url, plan.node_rank, phase)
    shutil.rmtree(beats, ignore_errors=True)
    os.makedirs(beats)
    tag = uuid.uuid4().hex
    env = {**rank_environment(launch, plan.master_addr), layout.HEARTBEAT_ENV: beats, AGENT_TAG_ENV: tag}
    log_path = os.path.join(node_scratch(run_url, plan.node_rank), layout.LOG)  # appended to by every phase
    with open(log_path, "ab") as log_file:
        offset = log_file.tell()
        process = subprocess.Popen(
            torchrun_command(plan, launch.rdzv_timeout, module, args), cwd=PROJECT_ROOT, env=env,
            stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True,
        )
    raise_on_sigterm()
    return Agent(plan.node_rank, process, log_path, offset, datetime.now(UTC).isoformat(timespec="seconds"), tag)


class Poller(Protocol):
    """Something the supervisor's loop calls that may stop the node by raising: a Watch, a node's claim."""

    def poll(self) -> None: ...


def supervise(agents: list[Agent], run_url: str, phase: str, watch: Watch | Poller | None) -> None:
    """Poll until every agent exited 0, or raise for the first failure, a stall or what `watch` raises."""
    pending = list(agents)
    while pending:
        if watch is not None:
            watch.poll()
        for agent in list(pending):
            code = agent.process.poll()
            if code is None:
                continue
            pending.remove(agent)
            _publish_node_files(run_url, agent, phase)
            if code != 0:
                raise _failure(agent, pending, run_url, phase)
        time.sleep(POLL_S)


def _failure(first: Agent, pending: list[Agent], run_url: str, phase: str) -> UserError | RetryableError:
    """The error for a failed phase, naming its root cause.

    When a rank dies, its peers' collectives fail too, and their nodes may exit first; so the other
    agents get SETTLE_S to exit as well, and a rank's own "retrying cannot help" error (bad data, out of
    memory, a diverged loss) wins over its peers' lost connections: such a failure must not be retried.
    """
    failed = [first]
    deadline = time.monotonic() + SETTLE_S
    while pending and time.monotonic() < deadline:
        for agent in [a for a in pending if a.process.poll() is not None]:
            pending.remove(agent)
            _publish_node_files(run_url, agent, phase)
            if agent.process.returncode != 0:
                failed.append(agent)
        time.sleep(0.1)
    reports = []
    for agent in failed:
        text = read_from(agent.log_path, agent.log_offset)
        summary, rank_code = failure_summary(text)
        reports.append((agent, summary, rank_code, tail(text)))
    agent, summary, rank_code, last = next((r for r in reports if r[2] == EXIT_USER_ERROR), reports[0])
    return error_for(rank_code, f"{phase} failed on node {agent.node_rank}, {summary}\nlog {agent.log_path}, "
                                f"last lines:\n{last}")
