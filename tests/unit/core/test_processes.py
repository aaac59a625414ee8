"""Whether a pid of this host is alive, as the run lock and a node claim ask it of their holder."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from core.processes import pid_alive
from tests.conftest import ROOT


def test_a_running_process_is_alive_and_an_ended_one_is_not() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert pid_alive(child.pid) and pid_alive(os.getpid())
    finally:
        child.kill()
        child.wait()  # reaped: the pid names no process any more
    assert not pid_alive(child.pid)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root, to drop to a user who may not signal pid 1")
def test_a_process_this_user_may_not_signal_counts_as_alive() -> None:
    """A pid another user owns answers EPERM, not ESRCH: someone's live process, never a dead holder."""
    code = "from core.processes import pid_alive; import os; os.setuid(65534); print(pid_alive(1))"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "True", done.stderr


@pytest.mark.parametrize("pid", [None, "123", 0, -1, True, 1.5])
def test_what_a_damaged_document_holds_is_not_a_live_pid(pid: object) -> None:
    assert not pid_alive(pid)
