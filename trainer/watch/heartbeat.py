"""Per-rank heartbeats: each rank touches a file in its node's directory as it makes progress, so the
launcher can tell which rank of which node stopped moving (a stall), without any collective.

The launcher sets TANDEM_HEARTBEAT_DIR for every rank of a node; without it this is a no-op.
"""

from __future__ import annotations

import os
import time

from storage.layout import HEARTBEAT_ENV


class Heartbeat:
    """Touches {dir}/rank-{r}.beat with the current step (cheap: one small write per call)."""

    def __init__(self, rank: int) -> None:
        directory = os.environ.get(HEARTBEAT_ENV)
        self.path = os.path.join(directory, f"rank-{rank}.beat") if directory else None

    def beat(self, step: int) -> None:
        """Record that this rank is alive and working on `step`."""
        if self.path is None:
            return
        tmp = f"{self.path}.tmp"
        with open(tmp, "w") as handle:
            handle.write(f"{step} {time.time():.3f}\n")
        os.replace(tmp, self.path)
