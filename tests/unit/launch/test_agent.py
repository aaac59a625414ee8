"""A node's torchrun agent stopped with everything it started: its process group, then whatever still carries its tag,
the ranks torchrun starts in sessions of their own (which no group signal reaches)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

from config.sections.launch import LaunchConfig
from core.processes import pid_alive
from launch.agent import FAILED_GRACE_S, KILL_GRACE_S, Agent, grace_for, kill, tagged_processes
from launch.command import AGENT_TAG_ENV

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
