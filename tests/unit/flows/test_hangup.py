"""SIGHUP and SIGTERM to the pipeline run from the command line are a cancel, as Ctrl-C is (each in a process of its
own: signal handlers are the process's): the first raises Hangup, a KeyboardInterrupt whose exit code is the shell's
128 + the signal, a second is logged and ignored; under a Prefect worker SIGTERM stays Prefect's."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from tests.conftest import ROOT

PIPELINE = """
import logging, os, signal, sys, time
logging.basicConfig(level=logging.WARNING, stream=sys.stdout, format="%(message)s")
from flows import hangup
if sys.argv[1] == "cli":
    hangup.from_the_command_line()
hangup.cancel_on_hangup()
try:
    os.kill(os.getpid(), getattr(signal, sys.argv[2]))
    time.sleep(5)
    print("not cancelled")
except KeyboardInterrupt as stop:
    print(type(stop).__name__, stop.exit_code, hangup.received() == stop.signum, flush=True)
    os.kill(os.getpid(), getattr(signal, sys.argv[2]))  # again, while the run stops
    print("still stopping", flush=True)
"""


def pipeline(where: str, signal_name: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", PIPELINE, where, signal_name], cwd=ROOT, capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize(("signal_name", "code"), [("SIGHUP", 129), ("SIGTERM", 143)])
def test_from_the_command_line_either_signal_is_a_cancel_once(signal_name: str, code: int) -> None:
    done = pipeline("cli", signal_name)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        f"Hangup {code} True",
        f"{signal_name} again: the run is already stopping",
        "still stopping",
    ]


def test_under_a_worker_sigterm_stays_prefects_and_sighup_is_a_cancel() -> None:
    assert pipeline("worker", "SIGTERM").returncode == -signal.SIGTERM  # Python's default: the worker's to handle
    assert pipeline("worker", "SIGHUP").stdout.startswith("Hangup 129 True")
