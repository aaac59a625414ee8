"""The `ssh` backend's hosts: the ssh command lines of one launch (batch mode, keep-alives, one shared connection per
host under a private control directory), and the check of each host before its node starts: it must accept the key
and have the checkout and its Python; node 0 also picks the rendezvous port. An elastic run probes its hosts the same
way (`probe_host`)."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

from config.hosts import Host, parse_host
from config.sections.launch import LaunchConfig
from core.checkout import PROJECT_ROOT
from core.errors import RetryableError, UserError
from launch.backends.ssh_errors import ssh_failure

SERVER_ALIVE_S, SERVER_ALIVE_COUNT = 5, 3  # ssh gives up on a silent host after 15 s
CHECK_TIMEOUT_S = 60
_PICK_PORT = 'import socket; s = socket.socket(); s.bind(("", 0)); print(s.getsockname()[1])'


class Ssh:
    """ssh command lines for one launch: shared connections under a private control directory."""

    def __init__(self, launch: LaunchConfig, control_dir: str | None = None) -> None:
        """`control_dir`: where the shared connections' sockets go (a private temporary directory by default)."""
        self.launch = launch
        self.control_dir = control_dir or tempfile.mkdtemp(prefix="tandem-ssh-")
        self.root = launch.remote_root or str(PROJECT_ROOT)
        self.python = launch.remote_python or sys.executable

    def command(self, host: Host, remote: str) -> list[str]:
        """ssh HOST REMOTE with batch mode (never a password prompt), a connect timeout, keep-alives that notice a
        dead host within seconds, and one shared connection per host."""
        port = ["-p", str(host.port)] if host.port else []
        return [
            "ssh",
            "-T",
            "-o",
            "BatchMode=yes",
            "-o",
            f"ConnectTimeout={self.launch.ssh_connect_timeout}",
            "-o",
            f"ServerAliveInterval={SERVER_ALIVE_S}",
            "-o",
            f"ServerAliveCountMax={SERVER_ALIVE_COUNT}",
            "-o",
            "ControlMaster=auto",
            "-o",
            f"ControlPath={self.control_dir}/%C",
            "-o",
            "ControlPersist=120",
            *port,
            *self.launch.ssh_options,
            host.target,
            remote,
        ]

    def in_root(self, remote: str) -> str:
        """A remote command run in the checkout."""
        return f"cd {shlex.quote(self.root)} && {remote}"

    def close(self, hosts: list[Host]) -> None:
        """End the shared connections (their master processes would otherwise linger for ControlPersist)."""
        for host in hosts:
            subprocess.run([*self.command(host, "")[:-2], "-O", "exit", host.target], capture_output=True, timeout=30)
        # `-O exit` returns before the master removes its socket: remove the directory with whatever is left in it.
        shutil.rmtree(self.control_dir, ignore_errors=True)


def check_hosts(ssh: Ssh, hosts: list[Host], *, pick_port: bool) -> int | None:
    """Every host, in parallel: reachable with the key, the checkout and its Python there; on node 0 with
    `pick_port`, a free port for the rendezvous. Raises one line naming the host and the fix."""
    with ThreadPoolExecutor(max_workers=min(32, len(hosts))) as pool:
        answers = [pool.submit(check_host, ssh, rank, host, pick_port and rank == 0) for rank, host in enumerate(hosts)]
        results = [answer.result() for answer in answers]  # the first failure in node order raises
    return int(results[0]) if pick_port and results[0].isdigit() else None


def check_command(ssh: Ssh, pick_port: bool) -> str:
    """The remote command of a host's check: the checkout there (exit 91), its Python (exit 92), and with `pick_port`
    a free port printed."""
    return f"test -d {shlex.quote(ssh.root)} || exit 91; test -x {shlex.quote(ssh.python)} || exit 92; " + (
        f"{shlex.quote(ssh.python)} -c {shlex.quote(_PICK_PORT)}" if pick_port else "true"
    )


def check_host(ssh: Ssh, rank: int, host: Host, pick_port: bool = False) -> str:
    """One host reachable with the key, with the checkout and its Python; with `pick_port`, a free port there
    (printed). Raises one line naming the host and the fix."""
    try:
        done = subprocess.run(
            ssh.command(host, check_command(ssh, pick_port)),
            capture_output=True,
            text=True,
            timeout=CHECK_TIMEOUT_S + ssh.launch.ssh_connect_timeout,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        raise RetryableError(
            f"node {rank} ({host}): ssh did not answer within {CHECK_TIMEOUT_S} s; is the host up and sshd running?"
        ) from None
    if done.returncode == 91:
        raise UserError(
            f"node {rank} ({host}): no Tandem checkout at {ssh.root}; install it there or set "
            "launch.remote_root to its path on the hosts"
        )
    if done.returncode == 92:
        raise UserError(
            f"node {rank} ({host}): no Python at {ssh.python}; create the same virtual environment "
            "there or set launch.remote_python"
        )
    if done.returncode != 0:
        raise ssh_failure(f"node {rank} ({host})", done.returncode, done.stderr)
    return done.stdout.strip()


def probe_host(launch: LaunchConfig, slot: int) -> str | None:
    """An elastic run's probe of the host in `slot` of launch.hosts (launch/elastic.py): check_host's problem in one
    line, or None. The node's own preflight follows when it starts."""
    host = parse_host(launch.hosts[slot], f"launch.hosts[{slot}]")
    ssh = Ssh(launch)
    try:
        check_host(ssh, slot, host)
    except (UserError, RetryableError) as exc:
        return str(exc)
    finally:
        ssh.close([host])
    return None
