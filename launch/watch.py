"""Follow a training phase while it runs: progress from metrics.jsonl, stalls from per-rank heartbeats.

A stall is no new optimizer step for `launch.stall_timeout` seconds (the first step gets the
rendezvous timeout on top, for start-up). The error names the node and rank whose heartbeat is the
oldest: the one the others are waiting for.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from config.sections.launch import LaunchConfig
from core.errors import RetryableError
from launch.command import heartbeat_dir
from launch.job import Phase
from storage import layout
from storage.fs import exists, read_bytes
from storage.location import Location, join

READ_EVERY_S = 2.0


@dataclass
class Watch:
    """Progress and stall detection for one phase; `poll` is called by the supervisor's loop."""

    metrics_url: Location
    heartbeat_dirs: dict[int, str]  # node rank -> that node's heartbeat directory
    stall_timeout: float
    startup_grace: float
    on_progress: Callable[[dict[str, Any]], None]
    last_step: int = 0
    _last_change: float = field(default_factory=time.monotonic)
    _last_read: float = 0.0
    _seen_lines: int = 0

    def poll(self) -> None:
        """Report new steps; raise RetryableError when training stopped moving."""
        now = time.monotonic()
        if now - self._last_read >= READ_EVERY_S:
            self._last_read = now
            for record in self._new_records():
                if "event" not in record and record["step"] > self.last_step:
                    self.last_step, self._last_change = record["step"], now
                    self.on_progress(record)
        allowed = self.stall_timeout + (self.startup_grace if self.last_step == 0 else 0.0)
        if now - self._last_change > allowed:
            raise RetryableError(self._stall_message(now - self._last_change))

    def _new_records(self) -> list[dict[str, Any]]:
        if not exists(self.metrics_url):
            return []
        lines = read_bytes(self.metrics_url).decode().splitlines()
        if len(lines) < self._seen_lines:  # rewritten on resume: read it again from the top
            self._seen_lines = 0
        new, self._seen_lines = lines[self._seen_lines :], len(lines)
        return [json.loads(line) for line in new if line.strip()]

    def _stall_message(self, quiet_s: float) -> str:
        beats = []  # (last beat time, node, rank, step)
        for node, directory in self.heartbeat_dirs.items():
            for name in sorted(os.listdir(directory)) if os.path.isdir(directory) else []:
                if name.endswith(".beat"):
                    with open(os.path.join(directory, name)) as handle:
                        beat_step, beat_at = handle.read().split()
                    beats.append((float(beat_at), node, int(name.split("-")[1].split(".")[0]), int(beat_step)))
        where = "no rank has started a step yet"
        if beats:
            stamp, node, rank, step = min(beats)
            where = (
                f"node {node} rank {rank} is the slowest: last heartbeat {time.time() - stamp:.0f} s ago, "
                f"in step {step}"
            )
        return (
            f"training stalled: no new step for {quiet_s:.0f} s (launch.stall_timeout={self.stall_timeout:.0f}; "
            f"last step {self.last_step}); {where}. Stopped every node; a retry resumes from the last checkpoint"
        )


def metrics_url(run_url: Location) -> Location:
    """Where rank 0 writes step metrics."""
    return join(run_url, layout.METRICS)


def phase_watch(
    run_url: Location, launch: LaunchConfig, phase: Phase, on_progress: Callable[[dict[str, Any]], None] | None
) -> Watch | None:
    """The watch of a phase on launch.nnodes nodes (every backend uses this), or None when nobody follows
    progress (evaluation)."""
    if on_progress is None:
        return None
    beats = {n: heartbeat_dir(run_url, n, phase) for n in range(launch.nnodes)}
    return Watch(metrics_url(run_url), beats, launch.stall_timeout, launch.rdzv_timeout, on_progress)
