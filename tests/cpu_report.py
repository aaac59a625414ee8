"""Where a test session's time goes, as CPU seconds: with TANDEM_CPU_REPORT=FILE, every test's wall time and the CPU
its process and every process below it used meanwhile (the pytest worker itself, children that ended and were reaped,
and those still running: servers, agents, ranks) are appended to FILE, one JSON line a test (setup, call and teardown
together). CPU seconds do not grow when another job shares the machine, as wall time does, so two runs on a busy
machine compare. `python -m tests.cpu_report FILE` prints the table tests/README.md keeps: by folder, the slowest
tests, and the session's totals."""

from __future__ import annotations

import collections
import json
import os
import resource
import sys
import time
from pathlib import Path

TICKS = os.sysconf("SC_CLK_TCK")


def descendants_cpu(root: int) -> float:
    """CPU seconds of the live processes below `root` (not `root` itself), from /proc."""
    children: dict[int, list[int]] = collections.defaultdict(list)
    cpu: dict[int, float] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        pid, parent = int(entry), int(fields[1])
        children[parent].append(pid)
        cpu[pid] = (int(fields[11]) + int(fields[12])) / TICKS
    total, stack = 0.0, list(children[root])
    while stack:
        pid = stack.pop()
        total += cpu.get(pid, 0.0)
        stack.extend(children[pid])
    return total


def cpu_now() -> float:
    """This process's CPU seconds, its reaped descendants' and its live ones'."""
    own, reaped = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + reaped.ru_utime + reaped.ru_stime + descendants_cpu(os.getpid())


class Recorder:
    """Appends a test's figures to the report file."""

    def __init__(self, path: str) -> None:
        self.path = path

    def measure(self, nodeid: str, started: tuple[float, float]) -> None:
        wall, cpu = time.perf_counter() - started[0], cpu_now() - started[1]
        line = json.dumps({"test": nodeid, "wall_s": round(wall, 3), "cpu_s": round(cpu, 3), "pid": os.getpid()})
        with open(self.path, "a") as handle:
            handle.write(line + "\n")


def folder_of(nodeid: str) -> str:
    """A test's folder under tests/, one level deep (tests/unit/<package>/)."""
    parts = nodeid.split("::", 1)[0].split("/")
    return "/".join(parts[: 3 if parts[1] == "unit" else 2]) + "/"


def table(rows: list[dict], slowest: int = 30) -> str:
    """The report as markdown: CPU and wall seconds by folder, then the slowest tests by CPU."""
    by_folder: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0, 0])
    for row in rows:
        acc = by_folder[folder_of(row["test"])]
        acc[0], acc[1], acc[2] = acc[0] + row["cpu_s"], acc[1] + row["wall_s"], acc[2] + 1
    out = ["| folder | tests | CPU s | wall s (worker) |", "| --- | --- | --- | --- |"]
    for folder, (cpu, wall, n) in sorted(by_folder.items(), key=lambda item: -item[1][0]):
        out.append(f"| `{folder}` | {int(n)} | {cpu:.0f} | {wall:.0f} |")
    total_cpu, total_wall = sum(r["cpu_s"] for r in rows), sum(r["wall_s"] for r in rows)
    out.append(f"| all | {len(rows)} | {total_cpu:.0f} | {total_wall:.0f} |")
    out += ["", "| test | CPU s | wall s |", "| --- | --- | --- |"]
    for row in sorted(rows, key=lambda r: -r["cpu_s"])[:slowest]:
        out.append(f"| `{row['test']}` | {row['cpu_s']:.1f} | {row['wall_s']:.1f} |")
    return "\n".join(out)


if __name__ == "__main__":
    report = [json.loads(line) for line in Path(sys.argv[1]).read_text().splitlines() if line.strip()]
    print(table(report))
