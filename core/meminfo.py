"""This machine's /proc/meminfo, the one reader of it (preflight's memory check, the checkpoint snapshot's budget)."""

from __future__ import annotations


def meminfo() -> dict[str, int]:
    """Every /proc/meminfo field in bytes (MemTotal, MemAvailable, ...); empty where the kernel has no such file."""
    info: dict[str, int] = {}
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            for line in handle:
                name, value = line.split(":", 1)
                info[name] = int(value.split()[0]) * (1024 if value.strip().endswith("kB") else 1)
    except OSError:
        return {}
    return info
