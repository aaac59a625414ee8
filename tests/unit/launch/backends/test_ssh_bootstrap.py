"""The remote end of the ssh backend, `python -m launch.backends.ssh_bootstrap`, as ssh starts it on a host (no ssh:
its stdin is the connection), running a stand-in `launch.node` (a `launch/node.py` ahead on the path that records what
it got and starts one rank in its process group and one in a session of its own; the real node's CLI is
tests/unit/launch/test_node.py). The request's argv, variables and tag reach the node, which runs in a session of its
own, and its exit code is the bootstrap's; end of stdin or a hangup stops the node's group with SIGTERM; after a
"failed" line, or when the launcher falls silent for lost_s, the short grace ends in SIGKILL; whatever still carries
the tag is killed when the node ends, and `--kill TAG` kills exactly the processes that carry it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from launch.backends.ssh_bootstrap import TAG_ENV
from tests.conftest import ROOT

STANDIN = """
import json, os, signal, subprocess, sys, time
record = {"argv": sys.argv[1:], "tag": os.environ.get("TANDEM_SSH_TAG"), "canary": os.environ.get("CANARY")}
record |= {"pid": os.getpid(), "session": os.getsid(0)}
if sys.argv[1] == "stubborn":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
if sys.argv[1] != "exit":
    record["group"] = subprocess.Popen(["sleep", "300"]).pid
    record["own"] = subprocess.Popen(["sleep", "300"], start_new_session=True).pid
with open(os.environ["STANDIN_OUT"] + ".tmp", "w") as handle:
    json.dump(record, handle)
os.replace(os.environ["STANDIN_OUT"] + ".tmp", os.environ["STANDIN_OUT"])
if sys.argv[1] == "exit":
    sys.exit(int(sys.argv[2]))
while True:
    time.sleep(0.1)
"""


def outlives(pid: int) -> bool:
    """Whether a process still runs (a zombie does not) 10 s from now: a signal takes effect when it is scheduled."""
    deadline = time.monotonic() + 10
    while True:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            return False
        if state in "ZX" or time.monotonic() > deadline:
            return state not in "ZX"
        time.sleep(0.05)


class Bootstrap:
    """`python -m launch.backends.ssh_bootstrap` as ssh starts it, with the request on its stdin, which stays open (the
    connection), in a folder where `launch.node` is the stand-in (the rest of launch/ is the checkout's)."""

    def __init__(self, folder: Path, argv: list[str], **request: object) -> None:
        (folder / "launch").mkdir()
        (folder / "launch" / "__init__.py").write_text(f"__path__.append({str(ROOT / 'launch')!r})\n")
        (folder / "launch" / "node.py").write_text(STANDIN)
        self.out = folder / "record.json"
        env = {"STANDIN_OUT": str(self.out), "CANARY": "canary-value"}
        line = {"env": env, "argv": argv, "tag": f"tnd-test-{uuid.uuid4().hex[:8]}", **request}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "launch.backends.ssh_bootstrap"],
            cwd=folder,  # ahead of the checkout on the path (which reaches the rest whether installed or not)
            env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.process.stdin.write(json.dumps(line) + "\n")
        self.process.stdin.flush()

    def record(self) -> dict:
        """What the stand-in node recorded, once it has started its ranks."""
        deadline = time.monotonic() + 60
        while not self.out.exists():
            assert self.process.poll() is None and time.monotonic() < deadline, "the stand-in node never started"
            time.sleep(0.05)
        return json.loads(self.out.read_text())

    def finish(self) -> tuple[int, str]:
        """(exit code, stderr) once the bootstrap has ended by itself; nothing of the node may be left running."""
        self.process.wait(timeout=60)  # stdin stays open until then: communicate would close it, stopping the node
        left = self.stop()
        assert not left, f"left running: {left}"
        return self.process.returncode, self.process.stderr.read()

    def stop(self) -> list[int]:
        """Kill the bootstrap and what is left of its node (the processes the stand-in recorded); returns the latter."""
        self.process.kill()
        self.process.wait()
        record = json.loads(self.out.read_text()) if self.out.exists() else {}
        left = [record[key] for key in ("pid", "group", "own") if key in record and outlives(record[key])]
        for pid in left:
            os.kill(pid, signal.SIGKILL)
        return left


@pytest.fixture
def bootstrap(tmp_path: Path) -> Iterator[Callable[..., Bootstrap]]:
    """Starts a Bootstrap in the test's folder; at the end nothing it started is left running, failed test or not."""
    started: list[Bootstrap] = []

    def start(argv: list[str], **request: object) -> Bootstrap:
        started.append(Bootstrap(tmp_path, argv, **request))
        return started[-1]

    yield start
    for each in started:
        each.stop()
        for pipe in (each.process.stdin, each.process.stdout, each.process.stderr):
            pipe.close()


def test_the_node_gets_the_request_in_a_session_of_its_own_and_returns_its_code(bootstrap) -> None:
    node = bootstrap(["exit", "3"])
    record = node.record()
    assert node.finish()[0] == 3
    assert record["argv"] == ["exit", "3"] and record["canary"] == "canary-value"
    assert record["tag"].startswith("tnd-test-") and record["session"] == record["pid"]
    assert node.process.args == [sys.executable, "-m", "launch.backends.ssh_bootstrap"]  # the variables: by stdin


def test_end_of_stdin_stops_the_node_and_kills_what_carries_its_tag(bootstrap) -> None:
    node = bootstrap(["wait"], grace_s=30)
    node.record()
    node.process.stdin.close()  # the launcher went away
    assert node.finish()[0] == 128 + signal.SIGTERM  # the node's group got SIGTERM, the rank in its own session SIGKILL


def test_a_hangup_stops_the_node(bootstrap) -> None:
    node = bootstrap(["wait"], grace_s=30)
    node.record()
    node.process.send_signal(signal.SIGHUP)  # sshd's answer to a dropped connection
    assert node.finish()[0] == 128 + signal.SIGTERM


def test_after_a_failed_line_the_short_grace_ends_in_sigkill(bootstrap) -> None:
    """With the normal grace (10 minutes) the node, which ignores SIGTERM, would outlive finish's timeout."""
    node = bootstrap(["stubborn"], grace_s=600, failed_grace_s=0.2)
    node.record()
    node.process.stdin.write("\nfailed\n")
    node.process.stdin.close()
    assert node.finish()[0] == 128 + signal.SIGKILL


def test_a_silent_launcher_stops_the_node_with_the_short_grace(bootstrap) -> None:
    node = bootstrap(["stubborn"], grace_s=600, failed_grace_s=0.2, lost_s=1)
    node.record()  # stdin stays open, but nothing more comes: a host cut off the network
    code, stderr = node.finish()
    assert code == 128 + signal.SIGKILL
    assert "no word from the launcher for 1 s (this host is cut off from it): stopping this node" in stderr


def test_kill_takes_exactly_the_tagged_processes() -> None:
    tag = f"tnd-test-{uuid.uuid4().hex[:8]}"
    tagged = [subprocess.Popen(["sleep", "300"], env={**os.environ, TAG_ENV: tag}) for _ in range(2)]
    other = subprocess.Popen(["sleep", "300"], env={**os.environ, TAG_ENV: f"{tag}-other"})
    try:
        killed = subprocess.run(
            [sys.executable, "-m", "launch.backends.ssh_bootstrap", "--kill", tag],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert (killed.returncode, killed.stdout) == (0, "2\n")
        assert [p.wait(timeout=30) for p in tagged] == [-signal.SIGKILL] * 2
        assert other.poll() is None
    finally:
        for process in (*tagged, other):
            process.kill()
            process.wait()
