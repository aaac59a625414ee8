"""The client side of a warm start (tests/warm/zygote.py), run by every Python process whose PYTHONPATH has this
folder: a test session puts it there, with TANDEM_WARM_SOCKET, for the processes it starts.

A process started as `python -m MODULE` for one of WARM_MODULES (a torchrun agent, a rank of the trainer, the evaluate
stage or the probe) hands its command line, environment, working directory and standard streams to the zygote, which
forks a worker that runs MODULE in their place with everything already imported. This process stays what its parent
started and watches: it forwards the signals it is sent to the worker, and ends as the worker ended, with its exit code
or killed by its signal, so torchrun, the launcher and the tests see the same process life as without a warm start. If
this process is killed (SIGKILL), the worker sees its socket close and kills itself. Any other process, or a zygote that
cannot be reached, starts as usual: nothing here imports more than the standard library.
"""

import os
import sys

WARM_MODULES = ("torch.distributed.run", "trainer", "trainer.evaluate", "trainer.watch.probe")
FORWARDED = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2")


def _module(argv):
    """The module of a `python [-u] -m MODULE ...` command line, or None."""
    if "-m" not in argv[1:]:
        return None
    position = argv.index("-m", 1)
    flags = argv[1:position]
    if position + 1 >= len(argv) or any(flag not in ("-u", "-B") for flag in flags):
        return None
    return argv[position + 1]


def _received(sock, size):
    """`size` bytes from `sock`, or None at its end."""
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def _hand_over(path, argv):
    import array
    import contextlib
    import json
    import signal
    import socket
    import struct

    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
        request = json.dumps({"argv": argv, "env": dict(os.environ), "cwd": os.getcwd()}).encode()
        streams = array.array("i", [0, 1, 2])
        sock.sendall(struct.pack("!I", len(request)))
        sock.sendmsg([request], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, streams)])
        answer = _received(sock, 4)
    except OSError:
        return  # no zygote: start as usual
    if answer is None:
        return
    (worker,) = struct.unpack("!i", answer)

    def forward(signum, frame):
        with contextlib.suppress(ProcessLookupError):
            os.kill(worker, signum)

    for name in FORWARDED:
        signal.signal(getattr(signal, name), forward)
    ended = _received(sock, 4)
    code = 1 if ended is None else struct.unpack("!i", ended)[0]
    sys.stdout.flush()
    sys.stderr.flush()
    if code < 0:  # the worker was killed by a signal: so is this process
        if -code not in (signal.SIGKILL, signal.SIGSTOP):  # those two cannot have a handler, nor need resetting
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        code = 128 - code
    os._exit(code)


_socket = os.environ.get("TANDEM_WARM_SOCKET")
_argv = list(getattr(sys, "orig_argv", []))
if _socket and _module(_argv) in WARM_MODULES:
    _hand_over(_socket, _argv)
