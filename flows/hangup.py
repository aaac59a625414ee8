"""SIGHUP and SIGTERM to the pipeline are a cancel, as Ctrl-C is: a closed terminal (SIGHUP), `kill`, a container's
stop or a scheduler's (SIGTERM) unwind the pipeline through the same path, so the nodes get the cancel's grace
(`launch.cancel_grace_s` with `launch.checkpoint_on_cancel`: their ranks save a whole checkpoint first), every node
is stopped and joined, the run lock is released, and the flow run ends Cancelled, not Crashed. (Under a Prefect
worker SIGTERM stays Prefect's: the worker cancels a flow run with it, and Prefect marks the run Cancelled itself.)

Python's default for either signal ends the process at once: no `finally` runs, and the torchrun agents (each in
its own session) train on unsupervised. The handler raises `Hangup` (a KeyboardInterrupt, so that the launchers'
cancel path, not their failure path, handles it) once; a second signal during the stop is ignored (Ctrl-C still
interrupts).
"""

from __future__ import annotations

import logging
import signal
import threading

log = logging.getLogger(__name__)
SIGNALS = (signal.SIGHUP, signal.SIGTERM)


class Hangup(KeyboardInterrupt):
    """The pipeline got SIGHUP or SIGTERM: cancel the run."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(signal.Signals(signum).name)

    @property
    def exit_code(self) -> int:
        """128 + the signal's number, as a shell reports a process ended by it."""
        return 128 + self.signum


class _Handler:
    """Raises Hangup at the first signal; logs and ignores the ones after it (the stop is under way)."""

    cancels_pipeline = True  # launch/agent.py raise_on_sigterm leaves such a handler in place

    def __init__(self) -> None:
        self.received: int | None = None

    def __call__(self, signum: int, _frame: object) -> None:
        if self.received is not None:
            log.warning("%s again: the run is already stopping", signal.Signals(signum).name)
            return
        self.received = signum
        raise Hangup(signum)


_installed: list[_Handler] = []
_cli: list[bool] = []


def from_the_command_line() -> None:
    """Called by the pipeline's CLI before it runs the flow: SIGTERM is then the user's (kill, a container's stop).
    Under a Prefect worker it stays Prefect's, whose cancellation the worker drives with it."""
    _cli[:] = [True]


def cancel_on_hangup() -> None:
    """Install the handler for SIGHUP, and for SIGTERM from the command line (main thread only; elsewhere Python
    refuses signal handlers)."""
    if threading.current_thread() is not threading.main_thread():
        return
    handler = _Handler()
    _installed[:] = [handler]
    for signum in SIGNALS if _cli else (signal.SIGHUP,):
        signal.signal(signum, handler)


def received() -> int | None:
    """The signal that cancelled this process's pipeline, if one did."""
    return _installed[0].received if _installed else None
