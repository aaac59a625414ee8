"""A rank that died by a signal, in words: each fatal signal's name, number and likely cause with its check, the step
and the memory plan's figure where known; an exit of the rank's own is not a signal."""

from __future__ import annotations

import signal

import pytest

from config.memory_plan import GB
from launch.signals import Death, agent_killed_by, killed_by


def test_sigkill_names_the_out_of_memory_killer_the_plan_and_dmesg() -> None:
    line = killed_by(-9, Death(step=7, rank_bytes=int(3.5 * GB)))
    assert line == (
        "was killed by SIGKILL (signal 9) after step 7; likely cause: the kernel's out-of-memory killer sends this; "
        "the memory plan said 3.5 GB per rank; check `dmesg` (or `journalctl -k`) on that node for 'Out of memory: "
        "Killed process', then lower train.micro_batch_size or data.max_length, or give the node more memory (a "
        "container's memory limit kills the same way)"
    )
    assert killed_by(-9, Death()).startswith(  # before the first step, without a plan
        "was killed by SIGKILL (signal 9); likely cause: the kernel's out-of-memory killer sends this; check `dmesg`"
    )


@pytest.mark.parametrize(
    ("number", "check"),
    [(signal.SIGSEGV, "`dmesg`"), (signal.SIGBUS, "`df -h /dev/shm`"), (signal.SIGABRT, "the node's log")],
)
def test_each_fatal_signal_has_its_cause_and_check(number: int, check: str) -> None:
    line = killed_by(-number, Death(step=3))
    assert line is not None and line.startswith(f"was killed by {signal.Signals(number).name} (signal {number}) ")
    assert "after step 3; likely cause: " in line and check in line and "\n" not in line


def test_an_exit_of_its_own_is_not_a_signal() -> None:
    assert killed_by(137, Death()) is None and killed_by(1, Death()) is None
    assert killed_by(-signal.SIGUSR1, Death()) == (
        "was killed by SIGUSR1 (signal 10); likely cause: a signal from outside the run (a person, a scheduler, a "
        "supervisor); check what manages that node"
    )
    assert str(killed_by(-99, Death())).startswith("was killed by an unknown signal (signal 99); likely cause: ")


def test_an_agent_killed_names_itself_its_pid_and_what_stops_a_node() -> None:
    line = agent_killed_by(signal.SIGKILL, 4242, Death(step=16, rank_bytes=int(2 * GB)))
    assert line == (
        "its torchrun agent (pid 4242) was killed by SIGKILL (signal 9) after step 16; likely cause: a kill -9 from "
        "outside the run (a person, a scheduler or container runtime stopping the node) or the kernel's out-of-memory "
        "killer (the memory plan said 2.0 GB per rank); check `dmesg` (or `journalctl -k`) on that node for 'Killed "
        "process 4242', and what manages that node (the scheduler's or the container runtime's log)"
    )
    for number in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        stopped = agent_killed_by(number, 7, Death())
        assert stopped.startswith(f"its torchrun agent (pid 7) was killed by {signal.Signals(number).name} ")
        assert "likely cause: a stop from outside the run" in stopped and "who stopped process 7" in stopped
    # A fault of its own: the same cause as a rank's.
    assert agent_killed_by(signal.SIGSEGV, 7, Death()).endswith(killed_by(-signal.SIGSEGV, Death()).split("; ")[-1])
