"""The remote end of the `ssh` backend: `python -m launch.backends.ssh_bootstrap`, started by ssh on each host.

It reads one JSON line from stdin, {"env": {...}, "argv": [...], "tag": "..."}, and runs `python -m launch.node
ARGV` with that environment added: the run's variables (storage credentials among them) travel inside the SSH
connection, never on a command line that `ps` shows. Then it keeps reading stdin: end of file means the launcher
went away (cancelled, killed, connection lost), and the node is stopped (SIGTERM, so it kills its agents and
ranks; SIGKILL after the grace, `grace_s`, or `failed_grace_s` after a "failed" line: the phase failed elsewhere).
The launcher also sends an empty line every few seconds: with `lost_s` in the request, a node that hears nothing
for that long stops itself with the failure's grace. That is a host cut off the network, where the connection
neither closes nor resets and the ranks would sit in a collective for launch.collective_timeout. The node dies with
this process too (PR_SET_PDEATHSIG), and every process of the node carries the tag, so
`python -m launch.backends.ssh_bootstrap --kill TAG` finds whatever is left.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
import threading
import time

from launch.agent import tagged_processes
from launch.job import NODE_MODULE

TAG_ENV = "TANDEM_SSH_TAG"
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM))


def _stop(process: subprocess.Popen, grace_s: float) -> None:
    """SIGTERM the node's process group, SIGKILL what is left after the grace."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)


def kill_tagged(tag: str) -> int:
    """SIGKILL every process that carries the tag; how many there were."""
    pids = tagged_processes(tag, TAG_ENV)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return len(pids)


def main() -> int:
    """Run one node with the environment read from stdin; stop it when stdin closes or the launcher falls silent."""
    if sys.argv[1:2] == ["--kill"]:
        print(kill_tagged(sys.argv[2]))
        return 0
    request = json.loads(sys.stdin.readline() or "{}")
    env = {**os.environ, **request["env"], TAG_ENV: request["tag"]}
    process = subprocess.Popen(
        [sys.executable, "-m", NODE_MODULE, *request["argv"]],
        env=env,
        start_new_session=True,
        preexec_fn=_die_with_parent,
        stdin=subprocess.DEVNULL,
    )
    grace_s = float(request.get("grace_s", 10))
    failed_grace_s = float(request.get("failed_grace_s", grace_s))
    lost_s = request.get("lost_s")  # None: a launcher that sends no heartbeat
    heard = {"at": time.monotonic(), "failed": False, "closed": False}

    def watch_stdin() -> None:
        for line in iter(sys.stdin.readline, ""):
            heard["at"] = time.monotonic()
            heard["failed"] |= line.strip() == "failed"
        heard["closed"] = True
        if process.poll() is None:
            _stop(process, failed_grace_s if heard["failed"] else grace_s)

    signal.signal(signal.SIGTERM, lambda *_: _stop(process, grace_s))
    signal.signal(signal.SIGHUP, lambda *_: _stop(process, grace_s))
    threading.Thread(target=watch_stdin, daemon=True).start()
    while True:
        try:
            code = process.wait(timeout=1.0)
            break
        except subprocess.TimeoutExpired:
            if lost_s is not None and not heard["closed"] and time.monotonic() - heard["at"] > float(lost_s):
                print(
                    f"no word from the launcher for {float(lost_s):.0f} s (this host is cut off from it): "
                    "stopping this node",
                    file=sys.stderr,
                    flush=True,
                )
                _stop(process, failed_grace_s)
    kill_tagged(request["tag"])  # ranks that outlived the node (their own sessions)
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main())
