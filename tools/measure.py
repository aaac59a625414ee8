"""Run a command N times and report median wall time and the peak total RSS of its process tree.

    .venv/bin/python tools/measure.py --runs 3 -- make demo

Peak RSS is the largest sum, over one 0.2 s sample, of the resident memory of the command and all
its descendants (torchrun agents and ranks included), read from /proc.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import time


def tree_rss_bytes(root: int) -> int:
    """Resident memory of `root` and every descendant, in bytes."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    page = os.sysconf("SC_PAGE_SIZE")
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        pid, ppid = int(entry), int(fields[1])
        children.setdefault(ppid, []).append(pid)
        rss[pid] = int(fields[21]) * page
    total, stack = 0, [root]
    while stack:
        pid = stack.pop()
        total += rss.get(pid, 0)
        stack.extend(children.get(pid, []))
    return total


def measure(command: list[str]) -> tuple[float, int, int]:
    """(wall seconds, peak tree RSS bytes, exit code) of one run."""
    started = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    peak = 0
    while process.poll() is None:
        peak = max(peak, tree_rss_bytes(process.pid))
        time.sleep(0.2)
    return time.perf_counter() - started, peak, process.returncode


def main() -> None:
    """Parse arguments, run, print one line per run and the medians."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    walls, peaks = [], []
    for index in range(args.runs):
        wall, peak, code = measure(command)
        print(f"run {index + 1}: {wall:.1f} s, peak RSS {peak / 2**30:.2f} GiB, exit {code}", flush=True)
        walls.append(wall)
        peaks.append(peak)
    print(
        f"median of {args.runs}: {statistics.median(walls):.1f} s, peak RSS {statistics.median(peaks) / 2**30:.2f} GiB"
    )


if __name__ == "__main__":
    main()
