"""Machines for the `netns` suite: network namespaces on a bridge, each with an `eth0` (a veth), its own address and
its own sshd, the way a few plain SSH machines look to Tandem. All namespaces share this machine's filesystem, so
the checkout and a local storage root are the "shared storage" of every node; this machine's hostname resolves to
127.0.0.1 inside them too, as on many cloud images (which is what the interface auto-selection must survive).

Each namespace gets its own /etc/hosts and /etc/resolv.conf (`ip netns exec` mounts /etc/netns/NAME/* over /etc):
the machine's hosts file plus a name per node, and no name server. A cluster's nodes resolve each other; without
that, torch's store asks the machine's DNS server for every peer's name, which cannot answer from a namespace, and
each lookup waits about 10 s.

Everything is named with PREFIX, so a crashed session's leftovers are found and removed at the next start.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

PREFIX = "tnd"
BRIDGE = f"{PREFIX}-br0"
SUBNET = "10.87.0"  # private, used by no other test
GATEWAY = f"{SUBNET}.1"
SSHD_CONF = """ListenAddress {addr}
Port 22
HostKey {root}/host_key
PidFile {root}/sshd-{index}.pid
AuthorizedKeysFile {root}/authorized_keys
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
StrictModes no
UsePAM no
MaxStartups 100
"""
CLIENT_CONF = """Host {subnet}.*
    User root
    IdentityFile {root}/id_ed25519
    IdentitiesOnly yes
    UserKnownHostsFile {root}/known_hosts
    StrictHostKeyChecking yes
    LogLevel ERROR
"""


@dataclass(frozen=True)
class Machine:
    """One namespace: its name, address, host-side veth and sshd."""

    index: int
    namespace: str
    addr: str
    veth: str  # the bridge-side end (shape it with tc to slow this machine down)

    def pids(self) -> list[int]:
        """Every process in this namespace."""
        out = subprocess.run(["ip", "netns", "pids", self.namespace], capture_output=True, text=True).stdout
        return [int(p) for p in out.split()]


@dataclass(frozen=True)
class Machines:
    """The namespaces and the ssh client configuration that reaches them."""

    root: Path
    machines: list[Machine]
    sshd: list[subprocess.Popen]

    @property
    def ssh_options(self) -> list[str]:
        """launch.ssh_options for these machines (the fixture's own config, keys and known_hosts)."""
        return ["-F", str(self.root / "ssh_config")]

    def hosts(self, count: int) -> list[str]:
        return [m.addr for m in self.machines[:count]]

    def strays(self) -> dict[str, list[str]]:
        """Namespace -> command lines of processes other than its sshd (what a finished run must not leave)."""
        ours = {p.pid for p in self.sshd}
        found = {}
        for machine in self.machines:
            lines = [_cmdline(pid) for pid in machine.pids() if pid not in ours]
            lines = [line for line in lines if line and "sshd" not in line.split()[0]]
            if lines:
                found[machine.namespace] = lines
        return found


def missing_requirements() -> str | None:
    """Why this machine cannot host the suite, or None."""
    if os.geteuid() != 0:
        return "needs root (network namespaces)"
    missing = [tool for tool in ("ip", "tc", "ssh", "ssh-keygen") if shutil.which(tool) is None]
    if not os.path.exists("/usr/sbin/sshd"):
        missing.append("sshd (Debian's openssh-server; tools/install-test-services.sh installs it)")
    return f"needs {', '.join(missing)}" if missing else None


def _run(*command: str) -> None:
    subprocess.run(list(command), check=True, capture_output=True, text=True)


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def cleanup() -> None:
    """Remove every namespace, link and process of this suite (also a crashed session's)."""
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split("\n")
    for namespace in [line.split()[0] for line in names if line.startswith(f"{PREFIX}-node")]:
        for _ in range(3):
            pids = subprocess.run(["ip", "netns", "pids", namespace], capture_output=True, text=True).stdout.split()
            if not pids:
                break
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGKILL)
            time.sleep(0.2)
        subprocess.run(["ip", "netns", "del", namespace], capture_output=True)
        shutil.rmtree(f"/etc/netns/{namespace}", ignore_errors=True)
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    for line in links.splitlines():
        name = line.split(":")[1].strip().split("@")[0]
        if name.startswith(f"{PREFIX}-"):
            subprocess.run(["ip", "link", "del", name], capture_output=True)


def build(root: Path, count: int) -> Machines:
    """`count` namespaces on a bridge, each with an sshd that accepts a fresh key; the caller must cleanup()."""
    cleanup()
    _run("ip", "link", "add", BRIDGE, "type", "bridge")
    _run("ip", "addr", "add", f"{GATEWAY}/24", "dev", BRIDGE)
    _run("ip", "link", "set", BRIDGE, "up")
    os.makedirs("/run/sshd", exist_ok=True)
    _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(root / "id_ed25519"))
    _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(root / "host_key"))
    shutil.copy(root / "id_ed25519.pub", root / "authorized_keys")
    host_key = (root / "host_key.pub").read_text().split()[:2]
    machines, known = [], []
    names = "".join(f"{SUBNET}.{11 + i} {PREFIX}-node{i}\n" for i in range(count))
    for index in range(count):
        namespace, addr, veth = f"{PREFIX}-node{index}", f"{SUBNET}.{11 + index}", f"{PREFIX}-v{index}"
        etc = Path("/etc/netns") / namespace
        etc.mkdir(parents=True, exist_ok=True)
        (etc / "hosts").write_text(Path("/etc/hosts").read_text() + names)
        (etc / "resolv.conf").write_text("# no name server: the nodes' names are in hosts\n")
        _run("ip", "netns", "add", namespace)
        _run("ip", "link", "add", veth, "type", "veth", "peer", "name", f"{PREFIX}-p{index}")
        _run("ip", "link", "set", f"{PREFIX}-p{index}", "netns", namespace)
        _run("ip", "-n", namespace, "link", "set", f"{PREFIX}-p{index}", "name", "eth0")
        _run("ip", "-n", namespace, "addr", "add", f"{addr}/24", "dev", "eth0")
        _run("ip", "-n", namespace, "link", "set", "eth0", "up")
        _run("ip", "-n", namespace, "link", "set", "lo", "up")
        _run("ip", "-n", namespace, "route", "add", "default", "via", GATEWAY)
        _run("ip", "link", "set", veth, "master", BRIDGE, "up")
        (root / f"sshd-{index}.conf").write_text(SSHD_CONF.format(addr=addr, root=root, index=index))
        machines.append(Machine(index, namespace, addr, veth))
        known.append(f"{addr} {' '.join(host_key)}\n")
    (root / "known_hosts").write_text("".join(known))
    (root / "ssh_config").write_text(CLIENT_CONF.format(subnet=SUBNET, root=root))
    for path in (root / "id_ed25519", root / "host_key"):
        path.chmod(0o600)
    sshd = [start_sshd(m.namespace, root / f"sshd-{m.index}.conf", root / f"sshd-{m.index}.log", "w") for m in machines]
    for machine in machines:
        _wait_for_port(machine.addr, 22)
    return Machines(root, machines, sshd)


def _wait_for_port(addr: str, port: int, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with socket.create_connection((addr, port), timeout=1.0):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"sshd on {addr}:{port} did not come up") from None
            time.sleep(0.1)


def shape(machine: Machine, rate: str) -> None:
    """Rate-limit the traffic to this machine (tbf on its bridge-side veth); rate like '100mbit'."""
    _run(
        "tc",
        "qdisc",
        "replace",
        "dev",
        machine.veth,
        "root",
        "tbf",
        "rate",
        rate,
        "burst",
        "32kbit",
        "latency",
        "400ms",
    )
    _run(
        "ip",
        "netns",
        "exec",
        machine.namespace,
        "tc",
        "qdisc",
        "replace",
        "dev",
        "eth0",
        "root",
        "tbf",
        "rate",
        rate,
        "burst",
        "32kbit",
        "latency",
        "400ms",
    )


def unshape(machine: Machine) -> None:
    """Remove the rate limit."""
    subprocess.run(["tc", "qdisc", "del", "dev", machine.veth, "root"], capture_output=True)
    subprocess.run(
        ["ip", "netns", "exec", machine.namespace, "tc", "qdisc", "del", "dev", "eth0", "root"], capture_output=True
    )


def vanish(machines: Machines, machine: Machine) -> None:
    """The machine is gone, as a spot instance taken back: every process in its namespace, its sshd too, is killed,
    so connections to it are refused. `restore` brings its sshd back for the tests after."""
    for pid in machine.pids():
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    machines.sshd[machine.index].wait()


def restore(machines: Machines, machine: Machine) -> None:
    """Start the machine's sshd again (after `vanish`)."""
    root = machines.root
    conf = root / f"sshd-{machine.index}.conf"
    machines.sshd[machine.index] = start_sshd(machine.namespace, conf, root / f"sshd-{machine.index}.log", "a")
    _wait_for_port(machine.addr, 22)


def partition(machine: Machine) -> None:
    """The machine drops off the network without a word, as a pulled cable or a dead switch port: its bridge-side
    link goes down, so packets to and from it are lost (no reset, no refusal) while its processes run on."""
    _run("ip", "link", "set", "dev", machine.veth, "down")


def heal(machine: Machine) -> None:
    """Bring the machine's link back (after `partition`)."""
    _run("ip", "link", "set", "dev", machine.veth, "up")


def start_sshd(namespace: str, conf: Path, log: Path, mode: str) -> subprocess.Popen:
    """sshd in the foreground inside a namespace, its messages to `log` (the child keeps its own handle)."""
    with open(log, mode) as stderr:
        return subprocess.Popen(
            ["ip", "netns", "exec", namespace, "/usr/sbin/sshd", "-D", "-e", "-f", str(conf)], stderr=stderr
        )
