"""`train.profile_steps`: the PyTorch profiler over a few optimizer steps, its tables written beside the run.

The profiled steps come after the attempt's first three (allocator growth, torch.compile and cuDNN autotuning happen
there and would fill the table). Each rank writes {run}/profile/rank-{r}.txt: the busy fraction of the device
(kernel time over wall time: far under 1 means the host, not the GPU, bounds a step), then the operations by self
device time and by self CPU time. No trace is kept: one of a billion-parameter model's steps runs to hundreds of
megabytes, and the tables are what says where the time goes.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from storage.fs import write_bytes_atomic
from storage.location import Location, join

log = logging.getLogger(__name__)

WARMUP_STEPS = 3  # steps of the attempt before the profiled ones
ROWS = 30  # operations per table
PROFILE_DIR = "profile"


class StepProfiler:
    """Profiles optimizer steps [first, last] (1-based) of this attempt, the last no later than the run's last step;
    `before(step)` and `after(step)` bracket each step's work."""

    def __init__(self, steps: int, start: int, total: int, run_url: Location, rank: int) -> None:
        self.first, self.last = start + WARMUP_STEPS + 1, min(start + WARMUP_STEPS + steps, total)
        self.enabled = steps > 0 and self.first <= self.last  # a run too short for the warm-up profiles nothing
        self.run_url, self.rank = run_url, rank
        self._profile: Any = None
        self._started = 0.0

    def before(self, step: int) -> None:
        """Start profiling before step `step` (1-based) if it is the first profiled one."""
        if not self.enabled or step != self.first:
            return
        cuda = torch.cuda.is_available()
        activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]
        self._profile = profile(activities=activities)
        self._profile.__enter__()
        self._started = time.perf_counter()

    def after(self, step: int, write_event: Any) -> None:
        """After step `step`: stop at the last profiled step and write this rank's tables (and rank 0's event)."""
        if self._profile is None or step != self.last:
            return
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        wall = time.perf_counter() - self._started
        self._profile.__exit__(None, None, None)
        text = tables(self._profile, wall, self.first, self.last)
        self._profile = None
        url = join(self.run_url, PROFILE_DIR, f"rank-{self.rank}.txt")
        write_bytes_atomic(url, text.encode())
        log.info("profiled steps %d-%d: %s", self.first, self.last, text.splitlines()[1])
        write_event(
            {
                "event": "profile",
                "step": step,
                "first_step": self.first,
                "last_step": self.last,
                "table": f"{PROFILE_DIR}/rank-{{rank}}.txt",
            }
        )

    def profiles(self, step: int) -> bool:
        """Whether step `step` (1-based) runs under the profiler (its time is inflated)."""
        return self.enabled and self.first <= step <= self.last


def tables(prof: Any, wall: float, first: int, last: int) -> str:
    """The file's text: the device's busy fraction, then the operations by self device and self CPU time."""
    averages = prof.key_averages()
    device_us = device_busy_us(averages)
    cpu_us = sum(e.self_cpu_time_total for e in averages)
    lines = [
        f"steps {first}-{last} ({last - first + 1}), wall {wall:.3f} s",
        f"device busy {device_us / 1e6:.3f} s ({100 * device_us / 1e6 / max(wall, 1e-9):.1f}% of the wall time), "
        f"host operations {cpu_us / 1e6:.3f} s",
        "",
    ]
    if device_us:
        lines += ["By self device time:", averages.table(sort_by="self_device_time_total", row_limit=ROWS), ""]
    lines += ["By self CPU time:", averages.table(sort_by="self_cpu_time_total", row_limit=ROWS)]
    return "\n".join(lines) + "\n"


def device_busy_us(averages: Any) -> float:
    """Microseconds the device ran kernels: the self time of device events only. An operator (aten::mm, a CPU
    event) also carries its kernels' device time, so summing every event would count each kernel twice."""
    return sum(e.self_device_time_total for e in averages if e.device_type != DeviceType.CPU)
