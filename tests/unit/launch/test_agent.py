"""A node's torchrun agent stopped with everything it started: its process group, then whatever still carries its tag,
the ranks torchrun starts in sessions of their own (which no group signal reaches); an agent that died by a signal
named in one line (node, agent, signal, step, what to check), as a rank's death is."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

from config.sections.launch import LaunchConfig
from core.errors import RetryableError
from core.processes import pid_alive
from launch.agent import FAILED_GRACE_S, KILL_GRACE_S, Agent, AgentMember, grace_for, kill, tagged_processes
from launch.command import AGENT_TAG_ENV
from launch.supervise import Failure
from storage.location import local_path
from storage.spec import Spec
from tests.specs import spec_for

# An "agent" that starts a "rank" in a session of its own (as torchrun does), prints the rank's pid and waits.
AGENT = (
    "import subprocess, sys, time\n"
    "rank = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'], start_new_session=True)\n"
    "print(rank.pid, flush=True)\n"
    "time.sleep(120)\n"
)


def test_stopping_an_agent_stops_its_ranks_in_their_own_sessions(tmp_path) -> None:
    tag = uuid.uuid4().hex
    process = subprocess.Popen(
        [sys.executable, "-c", AGENT],
        env={**os.environ, AGENT_TAG_ENV: tag},
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    rank = int(process.stdout.readline())
    # The rank's pid is printed once it is forked; while it execs, its /proc environ reads empty for a moment.
    deadline = time.monotonic() + 10
    while sorted(tagged_processes(tag)) != sorted([process.pid, rank]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sorted(tagged_processes(tag)) == sorted([process.pid, rank])
    assert tagged_processes("") == [] and tagged_processes(uuid.uuid4().hex) == []
    started = datetime.now(UTC).isoformat()
    kill([Agent(0, process, str(tmp_path / "log.txt"), 0, started, tag)], grace_s=2.0)
    deadline = time.monotonic() + 10
    while not gone(rank) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert process.returncode is not None and gone(rank) and tagged_processes(tag) == []


def gone(pid: int) -> bool:
    """Ended: no such process, or one killed and not yet reaped (a zombie, where no init reaps orphans)."""
    try:
        return not pid_alive(pid) or Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_agents_get_the_save_on_cancel_grace_unless_the_phase_failed() -> None:
    saving = LaunchConfig(checkpoint_on_cancel=True, cancel_grace_s=90)
    assert grace_for(saving) == 90.0 and grace_for(saving, failed=True) == FAILED_GRACE_S
    assert grace_for(LaunchConfig(checkpoint_on_cancel=False)) == KILL_GRACE_S


def ended_agent(tmp_path: Path, code: str, signum: int | None = None) -> Agent:
    """An "agent" of node 1 that ran `code` (its output in its log), killed by `signum` when given."""
    log = tmp_path / "log.txt"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-c", code], stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    if signum is not None:
        os.kill(process.pid, signum)
    process.wait(timeout=30)
    return Agent(1, process, str(log), 0, datetime.now(UTC).isoformat(), "")


def run_at_step(tmp_path: Path, step: int) -> Spec:
    spec = spec_for(tmp_path, [])
    Path(local_path(spec.run)).mkdir(parents=True, exist_ok=True)
    Path(local_path(spec.run), "metrics.jsonl").write_text(json.dumps({"step": step, "loss": 1.0}) + "\n")
    return spec


def test_an_agent_killed_by_sigkill_is_one_line_naming_the_node_the_agent_the_signal_and_the_check(
    tmp_path: Path,
) -> None:
    spec = run_at_step(tmp_path, 5)
    agent = ended_agent(tmp_path, "import time; print('a rank line', flush=True); time.sleep(60)", signal.SIGKILL)
    failure = AgentMember(agent, spec, "train").failure()
    log = f"{spec.run}/nodes/1/log.txt"
    assert isinstance(failure.error, RetryableError) and failure.code is None and failure.own
    assert str(failure.error) == (
        f"train failed on node 1, its torchrun agent (pid {agent.process.pid}) was killed by SIGKILL (signal 9) after "
        "step 5; likely cause: a kill -9 from outside the run (a person, a scheduler or container runtime stopping "
        "the node) or the kernel's out-of-memory killer; check `dmesg` (or `journalctl -k`) on that node for 'Killed "
        f"process {agent.process.pid}', and what manages that node (the scheduler's or the container runtime's log) "
        f"(log: {log})"
    )


def test_an_agent_that_caught_sigterm_is_named_as_killed_by_it(tmp_path: Path) -> None:
    """torchrun turns SIGTERM into an exception, stops its ranks and exits 1: its last line names the signal."""
    said = (
        "import os; print('torch.distributed.elastic.multiprocessing.api.SignalException: Process %d got signal: 15'"
        " % os.getpid()); raise SystemExit(1)"
    )
    failure = AgentMember(ended_agent(tmp_path, said), run_at_step(tmp_path, 3), "train").failure()
    assert isinstance(failure.error, RetryableError) and "\n" not in str(failure.error)
    assert str(failure.error).startswith(
        f"train failed on node 1, its torchrun agent (pid {failure_pid(failure)}) was killed by SIGTERM (signal 15) "
        "after step 3; likely cause: a stop from outside the run (a person, a scheduler's time limit or preemption"
    )


def test_an_agent_that_ended_on_its_own_is_read_from_its_ranks(tmp_path: Path) -> None:
    """Exit 1 without its own signal line (another process's does not count): the log's rank lines say why."""
    other = "print('SignalException: Process 1 got signal: 15'); raise SystemExit(1)"
    failure = AgentMember(ended_agent(tmp_path, other), run_at_step(tmp_path, 3), "train").failure()
    assert str(failure.error).startswith("train failed on node 1, see the log\n")


def failure_pid(failure: Failure) -> int:
    return int(str(failure.error).split("(pid ", 1)[1].split(")", 1)[0])
