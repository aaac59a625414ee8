"""`launch.checkpoint_on_cancel` and `train.preempt_grace_s`: on SIGTERM (the pipeline being cancelled, or a spot
machine's notice to one node's agent, which torchrun forwards to that node's ranks), stop at a step boundary that
every rank agrees on and save a whole checkpoint first. The ranks exit with 143, which the launcher classifies as
retryable: a preempted job's retry resumes from that checkpoint (a cancelled pipeline does not retry).

Ranks get the signal at slightly different moments, so each only raises a flag; at the start of every
step one tiny all-reduce tells all of them whether anyone was asked to stop, and they stop together
(saving alone would hang in DeepSpeed's collectives).
"""

from __future__ import annotations

import signal
import threading
import time

from trainer.parallel.distributed import Dist, dist_sum

EXIT_CANCELLED = 143  # 128 + SIGTERM, what a process stopped by SIGTERM reports


class CancelWatch:
    """Set by SIGTERM; `should_stop` is collective when enabled and free when not."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.requested = False
        self.signalled_at: float | None = None
        if enabled and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._on_sigterm)

    def _on_sigterm(self, _signum: int, _frame: object) -> None:
        self.requested = True
        self.signalled_at = time.monotonic()

    def seconds_since_signal(self) -> float | None:
        """Seconds since this rank got SIGTERM (None: it did not; a peer did)."""
        return None if self.signalled_at is None else time.monotonic() - self.signalled_at

    def should_stop(self, dist: Dist) -> bool:
        """Whether any rank was asked to stop (the same answer on every rank)."""
        if not self.enabled:
            return False
        (anyone,) = dist_sum([1.0 if self.requested else 0.0], dist)
        return anyone > 0


class SaveClock:
    """train.save_every_minutes: whether rank 0's clock says a save is due, the same answer on every rank."""

    def __init__(self, minutes: float | None) -> None:
        self.interval_s = None if minutes is None else minutes * 60
        self.last = time.monotonic()

    def due(self, dist: Dist) -> bool:
        """Collective when enabled, free when not."""
        if self.interval_s is None:
            return False
        mine = dist.is_main and time.monotonic() - self.last >= self.interval_s
        (anyone,) = dist_sum([1.0 if mine else 0.0], dist)
        return anyone > 0

    def saved(self) -> None:
        """A checkpoint was just saved: the interval starts again."""
        self.last = time.monotonic()
