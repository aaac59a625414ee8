"""`launch.checkpoint_on_cancel`: on SIGTERM (the pipeline being cancelled), stop at a step boundary that
every rank agrees on and save a whole checkpoint first.

Ranks get the signal at slightly different moments, so each only raises a flag; at the start of every
step one tiny all-reduce tells all of them whether anyone was asked to stop, and they stop together
(saving alone would hang in DeepSpeed's collectives).
"""

from __future__ import annotations

import signal
import threading

from trainer.distributed import Dist, dist_sum

EXIT_CANCELLED = 143  # 128 + SIGTERM, what a process stopped by SIGTERM reports


class CancelWatch:
    """Set by SIGTERM; `should_stop` is collective when enabled and free when not."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.requested = False
        if enabled and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._on_sigterm)

    def _on_sigterm(self, _signum: int, _frame: object) -> None:
        self.requested = True

    def should_stop(self, dist: Dist) -> bool:
        """Whether any rank was asked to stop (the same answer on every rank)."""
        if not self.enabled:
            return False
        (anyone,) = dist_sum([1.0 if self.requested else 0.0], dist)
        return anyone > 0
