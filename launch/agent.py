"""One node's torchrun agent: starting, supervising and stopping it.

Every node runs one (launch/node.py `run_node`, whatever backend started the node). Each agent runs in its own
session, so a whole node's process tree can be signalled at once; it logs to {run}/nodes/{r}/log.txt and leaves
status.json. The agent is followed by the one supervise loop (launch/supervise.py): when it exits non-zero, the error
names the node, the rank and that rank's own error line. Any exception on our side (Ctrl-C, a Prefect cancellation, a
stall, a peer's failure) kills the agent. The command line and environment are in launch/command.py, the reading of a
failed node's log in launch/diagnose.py.

torchrun starts each rank in a session of its own, so a rank is not in its agent's process group: when
the agent itself dies (SIGKILL, the OOM killer) its ranks live on as orphans that no process-group
signal reaches. Every agent therefore gets a unique tag in its environment, which its ranks inherit,
and stopping a node also kills whatever still carries its tag.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

from config.sections.launch import LaunchConfig
from core.checkout import PROJECT_ROOT
from core.errors import RetryableError
from launch.command import AGENT_TAG_ENV, heartbeat_dir, node_scratch, rank_environment, torchrun_command
from launch.diagnose import agent_failure_message, agent_signal, error_for, failure_message, failure_summary, read_from
from launch.job import NodePlan, Phase
from launch.preflight import gpus
from launch.signals import death_of
from launch.supervise import Failure, Poller, supervise
from storage import layout
from storage.fs import put_file, write_json_atomic
from storage.location import Location, is_local, join
from storage.spec import Spec

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
        with contextlib.suppress(subprocess.TimeoutExpired):
            agent.process.wait(timeout=max(0.0, deadline - time.monotonic()))
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


def _publish_node_files(run_url: Location, agent: Agent, phase: Phase) -> None:
    """Write status.json, and upload the log when the run's storage is not local."""
    node_url = layout.node_dir(run_url, agent.node_rank)
    if not is_local(run_url):
        put_file(agent.log_path, join(node_url, layout.LOG))
    write_json_atomic(
        join(node_url, layout.STATUS),
        {
            "node_rank": agent.node_rank,
            "phase": phase.name,
            "exit_code": agent.process.returncode,
            "host": socket.gethostname(),
            "started_at": agent.started_at,
            "ended_at": datetime.now(UTC).isoformat(timespec="seconds"),
        },
    )


# prctl(PR_SET_PDEATHSIG, SIGTERM) in the agent before it runs: when the thread that started it dies (the pipeline's
# process killed, kill -9 included, with the local backend; a node process killed), the agent gets SIGTERM, which
# torchrun forwards to its ranks (they save first when asked) before it kills them 30 s later. Looked up here, not in
# the forked child, which may only make the call. None where there is no prctl (not Linux).
PR_SET_PDEATHSIG = 1
_PRCTL = getattr(ctypes.CDLL(None, use_errno=True), "prctl", None) if sys.platform.startswith("linux") else None


def _term_with_parent() -> None:
    assert _PRCTL is not None
    _PRCTL(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


def raise_on_sigterm() -> None:
    """Turn SIGTERM (a Prefect worker cancelling this flow run) into SystemExit, so that the `finally`
    blocks that stop our agents' process groups run; Python's default would exit at once and leave
    the agents, which live in their own sessions, running."""
    if threading.current_thread() is threading.main_thread() and not getattr(
        signal.getsignal(signal.SIGTERM), "cancels_pipeline", False
    ):  # the pipeline's own handler (flows/hangup.py) already unwinds it as a cancel
        signal.signal(signal.SIGTERM, _exit_on_signal)


def _exit_on_signal(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def start_agent(
    run_url: Location,
    plan: NodePlan,
    launch: LaunchConfig,
    module: str,
    args: list[str],
    phase: Phase,
    env: Mapping[str, str] | None = None,
) -> Agent:
    """Start this node's torchrun agent in its own session, logging to the node's log; `env` is added to its ranks'
    environment (a value: the local backend's nodes are threads of one process, whose environment is shared)."""
    beats = heartbeat_dir(run_url, plan.node_rank, phase)
    shutil.rmtree(beats, ignore_errors=True)
    os.makedirs(beats)
    tag = uuid.uuid4().hex
    ranks = rank_environment(launch, plan.master_addr, env)
    ranks.update({layout.HEARTBEAT_ENV: beats, AGENT_TAG_ENV: tag})
    log_path = os.path.join(node_scratch(run_url, plan.node_rank), layout.LOG)  # appended to by every phase
    with open(log_path, "ab") as log_file:
        offset = log_file.tell()
        process = subprocess.Popen(
            torchrun_command(plan, launch.rdzv_timeout, module, args),
            cwd=PROJECT_ROOT,
            env=ranks,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_term_with_parent if _PRCTL is not None else None,
        )
    raise_on_sigterm()
    return Agent(plan.node_rank, process, log_path, offset, datetime.now(UTC).isoformat(timespec="seconds"), tag)


class AgentMember:
    """A node's agent as a member of the supervise loop: its node files published once it exited, its failure read
    from its part of the log."""

    def __init__(self, agent: Agent, spec: Spec, phase: Phase) -> None:
        self.agent, self.spec, self.run_url, self.phase = agent, spec, spec.run, phase
        self.ended_at: float | None = None

    def returncode(self) -> int | None:
        """None while the agent runs, else its exit code (its status.json written the first time)."""
        code = self.agent.process.poll()
        if code is not None and self.ended_at is None:
            self.ended_at = time.monotonic()
            _publish_node_files(self.run_url, self.agent, self.phase)
        return code

    def failure(self) -> Failure:
        """The error naming the node, the rank that failed first and its own error line, by that rank's exit code; or,
        when the agent itself died by a signal, the node, the agent and the signal (a retry may help)."""
        agent = self.agent
        text = read_from(agent.log_path, agent.log_offset)
        log_url = join(layout.node_dir(self.run_url, agent.node_rank), layout.LOG)
        ended = self.ended_at or time.monotonic()
        number = agent_signal(agent.process.pid, agent.process.returncode, text)
        if number is not None:
            last = death_of(self.spec, on_gpu=gpus() is not None)
            message = agent_failure_message(self.phase, agent.node_rank, agent.process.pid, number, log_url, last)
            return Failure(RetryableError(message), None, ended)
        _, rank_code = failure_summary(text)
        # A rank killed by a signal left no line: the step and the memory plan say what the signal likely meant.
        death = death_of(self.spec, on_gpu=gpus() is not None) if rank_code is not None and rank_code < 0 else None
        error = error_for(rank_code, failure_message(self.phase, agent.node_rank, text, log_url, death))
        return Failure(error, rank_code, ended)


def supervise_agent(agent: Agent, spec: Spec, phase: Phase, pollers: list[Poller]) -> None:
    """Follow the agent until it exited 0; raise its failure, or what a poller raises (a stall, the node's claim)."""
    supervise([AgentMember(agent, spec, phase)], pollers)
