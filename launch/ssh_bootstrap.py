"""The remote end of the `ssh` backend: `python -m launch.ssh_bootstrap`, started by ssh on each host.

It reads one JSON line from stdin, {"env": {...}, "argv": [...], "tag": "..."}, and runs `python -m flows.node
ARGV` with that environment added: the run's variables (storage credentials among them) travel inside the SSH
connection, never on a command line that `ps` shows. Then it keeps reading stdin: end of file means the launcher
went away (cancelled, killed, connection lost), and the node is stopped (SIGTERM, so it kills its agents and
ranks; SIGKILL after the grace). The node dies with this process too (PR_SET_PDEATHSIG), and every process of
the node carries the tag, so `python -m launch.ssh_bootstrap --kill TAG` finds whatever is left.
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

from launch.agent import tagged_processes

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
    """Run one node with the environment read from stdin; stop it when stdin closes."""
    if sys.argv[1:2] == ["--kill"]:
        print(kill_tagged(sys.argv[2]))
        return 0
    request = json.loads(sys.stdin.readline() or "{}")
    env = {**os.environ, **request["env"], TAG_ENV: request["tag"]}
    process = subprocess.Popen([sys.executable, "-m", "flows.node", *request["argv"]], env=env,
                               start_new_session=True, preexec_fn=_die_with_parent, stdin=subprocess.DEVNULL)
    grace_s = float(request.get("grace_s", 10))

    def watch_stdin() -> None:
        while sys.stdin.readline():
            pass
        if process.poll() is None:
            _stop(process, grace_s)

    signal.signal(signal.SIGTERM, lambda *_: _stop(process, grace_s))
    signal.signal(signal.SIGHUP, lambda *_: _stop(process, grace_s))
    threading.Thread(target=watch_stdin, daemon=True).start()
    code = process.wait()
    kill_tagged(request["tag"])  # ranks that outlived the node (their own sessions)
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main())
