"""The hosts of the `ssh` launch backend: `launch.hosts` entries (`host`, `user@host`, `host:port`) and host files,
either DeepSpeed/OpenMPI syntax (`host slots=N`) or a PBS/Torque node file (one line per slot, hosts repeated).

Parsing only: no network, no ssh. Node 0 is the first host; a host's slots are its ranks (GPUs).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

_ENTRY = re.compile(r"^(?:(?P<user>[^@\s:]+)@)?(?P<host>\[[0-9A-Fa-f:.]+\]|[^@\s:\[\]]+)(?::(?P<port>\d{1,5}))?$")
_SLOTS = re.compile(r"^slots=(\d+)$")


@dataclass(frozen=True)
class Host:
    """One machine of the job, as ssh reaches it."""

    host: str  # a name or an address, as written (brackets stripped from IPv6)
    user: str | None = None
    port: int | None = None

    @property
    def target(self) -> str:
        """What ssh connects to (`user@host`)."""
        return f"{self.user}@{self.host}" if self.user else self.host

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.user + '@' if self.user else ''}{host}{f':{self.port}' if self.port else ''}"


def parse_host(entry: str, where: str) -> Host:
    """One `host`, `user@host` or `host:port` (IPv6 in brackets); ValueError naming `where` otherwise."""
    match = _ENTRY.match(entry.strip())
    if not match:
        raise ValueError(f"{where}: {entry!r} is not a host; write host, user@host or host:port")
    port = int(match["port"]) if match["port"] else None
    if port is not None and not 0 < port < 65536:
        raise ValueError(f"{where}: port {port} of {entry!r} is out of range 1..65535")
    return Host(match["host"].strip("[]"), match["user"], port)


def parse_hostfile(text: str, path: str) -> list[tuple[Host, int]]:
    """(host, slots) in order of first appearance. `host slots=N` lines give N slots; a host repeated on several
    lines (a PBS/Torque node file) gets one slot per line; `#` starts a comment."""
    slots: dict[Host, int] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        name, *rest = line.split()
        where = f"{path}:{number}"
        host = parse_host(name, where)
        count = 1
        for word in rest:
            found = _SLOTS.match(word)
            if not found:
                if word.startswith(("max_slots=", "max-slots=")):  # OpenMPI's upper bound; slots decides
                    continue
                raise ValueError(f"{where}: {word!r} is not understood; write 'host slots=N' or one host per line")
            count = int(found[1])
            if count < 1:
                raise ValueError(f"{where}: slots must be >= 1, got {count}")
        slots[host] = slots.get(host, 0) + count
    if not slots:
        raise ValueError(f"{path}: no host in the file; write one 'host slots=N' per line")
    return list(slots.items())


def read_hostfile(path: str) -> list[tuple[Host, int]]:
    """Read and parse a host file; `$VARS` in the path are expanded (`launch.hostfile: $PBS_NODEFILE`)."""
    expanded = os.path.expandvars(os.path.expanduser(path))
    if "$" in expanded:
        raise ValueError(
            f"launch.hostfile={path!r}: {expanded!r} names an unset environment variable; inside a "
            "PBS job $PBS_NODEFILE is set, elsewhere give the file's path"
        )
    try:
        with open(expanded) as handle:
            text = handle.read()
    except OSError as exc:
        raise ValueError(f"launch.hostfile: cannot read {expanded} ({exc.strerror}); give an existing file") from None
    return parse_hostfile(text, expanded)
