"""The ssh backend's hosts (launch/backends/ssh_hosts.py) without a network: the ssh command line (batch mode, the
connect timeout, keep-alives, one shared connection per host under the control directory, the port only where given,
launch.ssh_options before the host), and the host check, whose remote command is run here by an `ssh` on PATH that runs
it locally: a missing checkout or Python is one line naming the host and the key that fixes it, ssh's own failure is
ssh_errors' line, node 0 picks a free port, and an elastic run's probe returns the problem instead of raising."""

from __future__ import annotations

import shlex
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from config.hosts import Host
from config.loader import load_config
from config.sections.launch import LaunchConfig
from core.checkout import PROJECT_ROOT
from core.errors import RetryableError, UserError
from launch.backends.ssh_hosts import Ssh, check_command, check_host, check_hosts, probe_host

# Runs the remote command (the last argument) here; `-O exit` ends nothing; host `down` times out as ssh says it.
FAKE_SSH = """#!/bin/sh
case " $* " in *" -O exit "*) exit 0 ;; *" down "*) echo "ssh: connect to host down port 22: Connection timed out" >&2
exit 255 ;; esac
for last; do :; done
exec sh -c "$last"
"""


def launch(*settings: str) -> LaunchConfig:
    return load_config(None, ["launch.backend=ssh", "launch.hosts=[n0, 'u@n1:2222']", *settings]).launch


@pytest.fixture
def fake_ssh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ssh = tmp_path / "bin" / "ssh"
    ssh.parent.mkdir()
    ssh.write_text(FAKE_SSH)
    ssh.chmod(ssh.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{ssh.parent}:/usr/bin:/bin")


def test_the_command_shares_one_connection_per_host_and_fails_fast(tmp_path: Path) -> None:
    ssh = Ssh(launch("launch.ssh_options=[-i, /k]", "launch.ssh_connect_timeout=7"), control_dir=str(tmp_path))
    assert ssh.command(Host("n1", "u", 2222), "true") == [
        "ssh", "-T", "-o", "BatchMode=yes", "-o", "ConnectTimeout=7", "-o", "ServerAliveInterval=5",
        "-o", "ServerAliveCountMax=3", "-o", "ControlMaster=auto", "-o", f"ControlPath={tmp_path}/%C",
        "-o", "ControlPersist=120", "-p", "2222", "-i", "/k", "u@n1", "true",
    ]  # fmt: skip
    assert "-p" not in ssh.command(Host("n0"), "true")[:-2]
    assert (ssh.root, ssh.python) == (str(PROJECT_ROOT), sys.executable)  # the defaults: this checkout, this Python


def test_the_check_command_tests_the_checkout_then_python_and_quotes_paths(tmp_path: Path) -> None:
    root = tmp_path / "my checkout"
    ssh = Ssh(launch(f"launch.remote_root={root}"), control_dir=str(tmp_path))
    assert ssh.in_root("ls") == f"cd {shlex.quote(str(root))} && ls"
    assert subprocess.run(["sh", "-c", check_command(ssh, False)]).returncode == 91
    root.mkdir()
    done = subprocess.run(["sh", "-c", check_command(ssh, True)], capture_output=True, text=True)
    assert done.returncode == 0 and 0 < int(done.stdout) < 65536
    ssh.python = str(tmp_path / "no python")
    assert subprocess.run(["sh", "-c", check_command(ssh, False)]).returncode == 92


@pytest.mark.usefixtures("fake_ssh")
def test_node_0_picks_the_port_and_a_hosts_problem_names_it_and_its_fix(tmp_path: Path) -> None:
    ssh = Ssh(launch(), control_dir=str(tmp_path))
    port = check_hosts(ssh, [Host("n0"), Host("n1", "u", 2222)], pick_port=True)
    assert port is not None and 0 < port < 65536
    assert check_hosts(ssh, [Host("n0")], pick_port=False) is None
    with pytest.raises(RetryableError) as info:  # the first failure in node order
        check_hosts(ssh, [Host("n0"), Host("down", None, 2200), Host("down")], pick_port=False)
    assert str(info.value) == (
        "node 1 (down:2200): ssh: connect to host down port 22: Connection timed out — the host does not answer: "
        "is it up, and is launch.ssh_connect_timeout long enough?"
    )
    missing = Ssh(launch("launch.remote_root=/nowhere/tandem"), control_dir=str(tmp_path))
    with pytest.raises(UserError, match=r"^node 1 \(u@n1:2222\): no Tandem checkout at /nowhere/tandem; .*remote_root"):
        check_host(missing, 1, Host("n1", "u", 2222))
    ssh.python = "/nowhere/python"
    with pytest.raises(UserError, match=r"^node 0 \(n0\): no Python at /nowhere/python; .*launch\.remote_python$"):
        check_host(ssh, 0, Host("n0"))


@pytest.mark.usefixtures("fake_ssh")
def test_an_elastic_probe_returns_the_problem_as_one_line() -> None:
    assert probe_host(launch(), 1) is None
    problem = probe_host(launch("launch.remote_python=/nowhere/python"), 0)
    assert (
        problem is not None and problem.startswith("node 0 (n0): no Python at /nowhere/python") and "\n" not in problem
    )
