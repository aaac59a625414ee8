"""Straggler detection: every N steps, all-gather each rank's compute time and flag the slow ones.

Forward time of this rank's micro-batches is measured, not the whole step: in synchronous training
the collectives make every rank's step as slow as the slowest one, and DeepSpeed's backward already
reduces gradients across ranks. Under ZeRO-2 the forward pass has no collectives, so it is pure
compute. Under ZeRO-3 it includes parameter all-gathers, which partly hide a straggler (fast ranks
wait inside their forward too); a rank that is slow by a large factor still shows.

The first step a process runs is not counted: it pays one-off costs (allocator growth, DeepSpeed's first-forward
hooks, a resumed run's cold page cache) that differ by rank and would hide a real straggler, or invent one, at the
first check.
"""

from __future__ import annotations

import logging
import statistics
from dataclasses import dataclass
from typing import Any

from trainer.parallel.distributed import Dist, gather_objects

log = logging.getLogger(__name__)


@dataclass
class StragglerWatch:
    """Accumulates this rank's compute time; `check` is collective (every rank calls it at the same steps)."""

    every: int
    factor: float
    dist: Dist
    _seconds: float = 0.0
    _steps: int = 0
    _warmed_up: bool = False

    def observe(self, compute_s: float) -> None:
        """Add one step's compute time (the process's first step is warm-up, not counted)."""
        if not self._warmed_up:
            self._warmed_up = True
            return
        self._seconds += compute_s
        self._steps += 1

    def check(self, step: int) -> list[dict[str, Any]]:
        """At every Nth step: the stragglers since the last check (the same list on every rank)."""
        if step % self.every != 0 or self._steps == 0:
            return []
        mine = (self.dist.rank, self.dist.host, self._seconds / self._steps)
        self._seconds, self._steps = 0.0, 0
        per_rank = gather_objects(mine, self.dist)
        # The lower median: with an even count, `median` is the mean of the middle two, so in a job of two nodes
        # (or two ranks) with one slow, the slow half sits at most 2x above it and a factor of 2 never fires.
        # The lower middle value compares a slow half with the fast half.
        median = statistics.median_low(seconds for _, _, seconds in per_rank)
        events = []
        for rank, host, seconds in per_rank:
            if median > 0 and seconds > self.factor * median:
                events.append(
                    {
                        "event": "straggler",
                        "step": step,
                        "rank": rank,
                        "host": host,
                        "compute_s": seconds,
                        "median_s": median,
                        "ratio": seconds / median,
                    }
                )
                if self.dist.is_main:
                    log.warning(
                        "straggler at step %d: rank %d on %s takes %.3f s/step, %.1fx the median %.3f s",
                        step,
                        rank,
                        host,
                        seconds,
                        seconds / median,
                        median,
                    )
        return events
