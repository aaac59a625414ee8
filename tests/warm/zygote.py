"""The server side of a warm start: one per test worker, started by the session (tests/conftest.py `warm_start`).

    python -m tests.warm.zygote SOCKET

It imports once what a torchrun agent and a rank import (torch, torch.distributed.run, transformers' Qwen2 model, PEFT,
DeepSpeed and the trainer, with a rank's environment: one thread, glibc's heap settings, MLflow kept out), then
listens on SOCKET. For each client (tests/warm/site/sitecustomize.py: a process started as `python -m MODULE`) it
forks a worker that takes the client's standard streams, environment, working directory and command line, runs
MODULE as `__main__` as a fresh interpreter would, and ends with its exit code; the zygote reaps it and tells the
client how it ended. A worker whose client is gone kills itself. Nothing here runs threads, so forking is safe; the
zygote ends when the worker process that started it does.

A rank started this way computes exactly what a cold one does (tests/warm/test_warm.py trains the same run both ways);
what differs is only what a process shows from the outside: the worker's /proc entries (command line, environment) are
the zygote's, while the client, which lives exactly as long, shows the real ones. The suites that look at processes
from the outside (orphans, netns, published sizes, cancel) start cold (tests/README.md, "Warm starts").
"""

from __future__ import annotations

import array
import atexit
import contextlib
import json
import os
import runpy
import select
import signal
import socket
import struct
import sys
import threading
from typing import Any

from tests.warm.site.sitecustomize import _module  # the one parser of a warm command line

# How often the zygote checks that the process that started it is alive; a worker's end wakes it at once (SIGCHLD).
POLL_S = 1.0


def warm_up() -> None:
    """Import what agents and ranks import, keeping out what every rank keeps out (MLflow, boto3: trainer/model/
    lean_imports.py); bitsandbytes and SciPy stay importable, for the Q-LoRA ranks and the evaluate stage's tasks."""
    from trainer.model.lean_imports import BOTO3, skip_tracking_libraries

    skip_tracking_libraries()
    sys.modules[BOTO3] = None  # type: ignore[assignment]
    import deepspeed  # noqa: F401
    import peft  # noqa: F401
    import torch.distributed.run  # noqa: F401
    import transformers.models.qwen2.modeling_qwen2  # noqa: F401

    import trainer.evaluation.stage
    import trainer.loop
    import trainer.watch.probe  # noqa: F401


def request_of(conn: socket.socket) -> tuple[dict[str, Any], list[int]]:
    """A client's request (command line, environment, working directory) and its three standard streams."""
    (size,) = struct.unpack("!I", received(conn, 4))
    fds = array.array("i")
    data, ancillary, _, _ = conn.recvmsg(size, socket.CMSG_LEN(3 * fds.itemsize))
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
    data += received(conn, size - len(data))
    return json.loads(data), list(fds)


def received(conn: socket.socket, size: int) -> bytes:
    """Exactly `size` bytes (an error at the socket's end)."""
    data = b""
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            raise ConnectionError("the client went away")
        data += chunk
    return data


def become(request: dict[str, Any], streams: list[int], conn: socket.socket) -> None:
    """In the forked worker: take the client's streams, environment, directory and command line, run its module as
    `__main__`, and exit as a process running it would."""
    signal.set_wakeup_fd(-1)
    os.setsid()
    for target, fd in enumerate(streams):
        os.dup2(fd, target)
        os.close(fd)
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    argv = request["argv"]
    module = _module(argv)
    assert module is not None, argv
    python_path = [entry for entry in request["env"].get("PYTHONPATH", "").split(os.pathsep) if entry]
    sys.path[:] = [request["cwd"], *python_path, *(p for p in sys.path[1:] if p not in python_path)]
    sys.argv = [module, *argv[argv.index("-m", 1) + 2 :]]
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for name in ("SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGCHLD"):
        signal.signal(getattr(signal, name), signal.SIG_DFL)
    conn.sendall(struct.pack("!i", os.getpid()))
    threading.Thread(target=die_with_client, args=(conn,), daemon=True).start()
    code = 0
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1
        if isinstance(exc.code, str):
            print(exc.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 - printed and turned into the exit code, as the interpreter does
        import traceback

        traceback.print_exc()
        code = 1
    finish(code)


def die_with_client(conn: socket.socket) -> None:
    """The worker's watch: its client closing the socket (killed, even by SIGKILL) kills the worker."""
    with contextlib.suppress(OSError):
        conn.recv(1)
    os.kill(os.getpid(), signal.SIGKILL)


def finish(code: int) -> None:
    """End as the interpreter ends a program: non-daemon threads joined, exit functions run, streams flushed."""
    shutdown = getattr(threading, "_shutdown", None)
    if shutdown is not None:
        shutdown()
    atexit._run_exitfuncs()
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)


def reap(clients: dict[int, socket.socket]) -> None:
    """Tell each ended worker's client how it ended (its exit code, or minus its signal)."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = clients.pop(pid, None)
        if conn is not None:
            with contextlib.suppress(OSError):
                conn.sendall(struct.pack("!i", os.waitstatus_to_exitcode(status)))
            conn.close()


def serve(path: str) -> None:
    """Fork a worker for every client until the process that started the zygote ends. A worker's end (SIGCHLD) wakes
    the loop through a pipe, so its client hears of it at once: a rank's death reaches torchrun as fast as a cold
    rank's would, and the order in which nodes report a failure stays the same."""
    parent = os.getppid()
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(128)
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)
    print("warm", flush=True)
    clients: dict[int, socket.socket] = {}
    while os.getppid() == parent:
        ready = select.select([server, wake_read], [], [], POLL_S)[0]
        if wake_read in ready:
            os.read(wake_read, 4096)
        if server in ready:
            conn, _ = server.accept()
            try:
                request, streams = request_of(conn)
            except (OSError, ValueError):
                conn.close()
                continue
            pid = os.fork()
            if pid == 0:
                server.close()
                os.close(wake_read)
                os.close(wake_write)
                become(request, streams, conn)
            for fd in streams:
                os.close(fd)
            clients[pid] = conn
        reap(clients)
    for pid in clients:  # the session ended: nothing outlives it
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


if __name__ == "__main__":
    warm_up()
    serve(sys.argv[1])
