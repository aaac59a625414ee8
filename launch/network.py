"""The network a node's ranks use: which interface reaches the rendezvous address (set as GLOO_SOCKET_IFNAME and
NCCL_SOCKET_IFNAME unless the user set either), whether an interface the user named can work, whether this host's
name resolves to a loopback address, and the fabric (InfiniBand/RoCE) NCCL may use.

Why the interface is chosen for the user: gloo and NCCL advertise the address this host's *name* resolves to, and
on many images (cloud, containers) that is 127.0.0.1 from /etc/hosts; peers on other hosts then connect to
themselves and the job fails ("Gloo connectFullMesh failed ... remote=[127.0.0.1]") or hangs. The interface whose
route reaches node 0 is the one every peer can reach.
"""

from __future__ import annotations

import fcntl
import ipaddress
import os
import socket
import struct
from collections.abc import Mapping

from core.errors import UserError

IFNAME_VARS = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")
_SIOCGIFADDR = 0x8915
_SIOCGIFFLAGS = 0x8913
_IFF_UP = 0x1
IB_SYSFS = "/sys/class/infiniband"


def interface_addresses() -> dict[str, str]:
    """Interface name -> its IPv4 address, for every interface that has one (Linux ioctl; {} elsewhere)."""
    found = {}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for _, name in socket.if_nameindex():
            try:
                packed = fcntl.ioctl(sock.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
            except OSError:  # no IPv4 address on it
                continue
            found[name] = socket.inet_ntoa(packed[20:24])
    return found


def interface_is_up(name: str) -> bool:
    """True when the interface's IFF_UP flag is set."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            flags = fcntl.ioctl(sock.fileno(), _SIOCGIFFLAGS, struct.pack("256s", name.encode()[:15]))
        except OSError:
            return False
    return bool(struct.unpack("H", flags[16:18])[0] & _IFF_UP)


def source_address(addr: str) -> str:
    """The local address the kernel's routing table uses to reach `addr` (no packet is sent: a UDP connect
    only picks the route)."""
    resolved = socket.getaddrinfo(addr, None, socket.AF_INET, socket.SOCK_DGRAM)[0][4][0]
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.connect((resolved, 9))
        return sock.getsockname()[0]


def route_interface(addr: str) -> str | None:
    """The interface whose route reaches `addr` (the one holding it, when it is this host's own); None when it
    cannot be told (an unresolvable name, no route, no such interface)."""
    try:
        source = source_address(addr)
    except OSError:
        return None
    return next((name for name, own in interface_addresses().items() if own == source), None)


def user_interfaces(env: Mapping[str, str]) -> dict[str, str]:
    """The interface variables the user set (in launch.env or this process's environment), name -> value."""
    return {name: env[name] for name in IFNAME_VARS if env.get(name)}


def interface_environment(master_addr: str, env: Mapping[str, str]) -> dict[str, str]:
    """GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME for the ranks: the route's interface to `master_addr`, unless the
    user set either (then nothing is changed) or the route cannot be told."""
    if user_interfaces(env):
        return {}
    name = route_interface(master_addr)
    return dict.fromkeys(IFNAME_VARS, name) if name else {}


def named_interfaces(value: str) -> list[str]:
    """The interface names a GLOO/NCCL_SOCKET_IFNAME value asks for (NCCL's `^` exclusions are not names)."""
    return [part.lstrip("=") for part in value.split(",") if part and not part.startswith("^")]


def check_interfaces(node_rank: int, master_addr: str, env: Mapping[str, str]) -> str:
    """The interface the ranks will use: chosen by route, or the user's, which must exist, be up and be the one
    that routes to the master; UserError naming the node, the interface and the interfaces it has otherwise."""
    have = interface_addresses()
    listing = ", ".join(f"{n} {a}" for n, a in sorted(have.items())) or "none with an IPv4 address"
    route = route_interface(master_addr)
    chosen = user_interfaces(env)
    if not chosen:
        if route is None:
            raise UserError(
                f"node {node_rank}: no interface routes to the master address {master_addr} (this host "
                f"has: {listing}); set launch.master_addr to an address of node 0 this host can reach"
            )
        return f"{route} (routes to {master_addr}; set as {' and '.join(IFNAME_VARS)})"
    for var, value in chosen.items():
        for name in named_interfaces(value):
            matches = [n for n in have if n == name or (var == "NCCL_SOCKET_IFNAME" and n.startswith(name))]
            if not matches:
                raise UserError(
                    f"node {node_rank}: {var}={value}: this host has no interface {name} (it has: "
                    f"{listing}); set {var} in launch.env to one of them, or unset it to have it chosen"
                )
            if not any(interface_is_up(n) for n in matches):
                raise UserError(
                    f"node {node_rank}: {var}={value}: interface {name} is down (this host has: "
                    f"{listing}); bring it up or name another in launch.env"
                )
            if route is not None and route not in matches and not _is_loopback(master_addr):
                raise UserError(
                    f"node {node_rank}: {var}={value}: the route to the master {master_addr} goes "
                    f"through {route}, not {name} (this host has: {listing}); set {var}={route} in "
                    "launch.env, or unset it to have it chosen"
                )
    return ", ".join(f"{var}={value} (set by you)" for var, value in chosen.items())


def _is_loopback(addr: str) -> bool:
    try:
        return ipaddress.ip_address(socket.gethostbyname(addr)).is_loopback
    except (OSError, ValueError):
        return False


def hostname_note(nnodes: int, master_addr: str) -> str:
    """What this host's name resolves to; a warning when it is a loopback address in a job that spans hosts (more
    than one node, the master not on loopback): gloo/NCCL would advertise it without an interface variable."""
    name = socket.gethostname()
    try:
        addr = socket.gethostbyname(name)
    except OSError:
        return f"{name} does not resolve"
    if nnodes > 1 and ipaddress.ip_address(addr).is_loopback and not _is_loopback(master_addr):
        return (
            f"warning: {name} resolves to {addr} (a loopback address, e.g. from /etc/hosts); peers on other "
            "hosts cannot reach it, so the ranks use the interface above"
        )
    return f"{name} -> {addr}"


def fabric(env: Mapping[str, str]) -> str:
    """The InfiniBand/RoCE devices this host has and whether NCCL will use them."""
    devices = sorted(os.listdir(IB_SYSFS)) if os.path.isdir(IB_SYSFS) else []
    if not devices:
        return "no InfiniBand/RoCE device; NCCL uses TCP sockets"
    if env.get("NCCL_IB_DISABLE", "0") not in ("0", ""):
        return f"InfiniBand/RoCE {', '.join(devices)}, but NCCL_IB_DISABLE={env['NCCL_IB_DISABLE']}: NCCL uses sockets"
    hca = env.get("NCCL_IB_HCA")
    return f"InfiniBand/RoCE {', '.join(devices)}; NCCL uses " + (f"NCCL_IB_HCA={hca}" if hca else "them (all)")
