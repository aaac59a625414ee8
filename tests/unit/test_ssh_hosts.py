"""The ssh backend's inputs and messages without a network: host entries, host files (DeepSpeed/OpenMPI and
PBS/Torque), the shape the hosts give a config, ssh's failures as one line, the interface checks on this machine's
own interfaces, and the node claim that catches a duplicate NODE_RANK."""

from __future__ import annotations

import os
import re
import socket

import pytest

from config.hosts import Host, parse_host, parse_hostfile, read_hostfile
from config.loader import load_config
from core.errors import RetryableError, UserError
from launch.backends.ssh_errors import ssh_failure
from launch.claim import NodeClaim
from launch.network import check_interfaces, interface_environment, route_interface
from storage.location import Location


def test_host_entries() -> None:
    assert parse_host("gpu1", "x") == Host("gpu1")
    assert parse_host("me@gpu1:2222", "x") == Host("gpu1", "me", 2222)
    assert parse_host("[fe80::1]:22", "x") == Host("fe80::1", None, 22)
    assert str(Host("fe80::1", "me", 22)) == "me@[fe80::1]:22" and Host("a", "me").target == "me@a"
    with pytest.raises(ValueError, match=r"launch.hosts\[1\]: 'a b' is not a host; write host, user@host"):
        parse_host("a b", "launch.hosts[1]")


def test_hostfiles_deepspeed_and_pbs() -> None:
    assert parse_hostfile("# cluster\nworker-1 slots=8\nworker-2 slots=8 max_slots=8\n\n", "hf") == [
        (Host("worker-1"), 8),
        (Host("worker-2"), 8),
    ]
    assert parse_hostfile("n1\nn1\nn2\nn2\n", "PBS_NODEFILE") == [(Host("n1"), 2), (Host("n2"), 2)]
    with pytest.raises(ValueError, match=r"hf:2: 'gpus=8' is not understood; write 'host slots=N'"):
        parse_hostfile("a slots=1\nb gpus=8\n", "hf")
    with pytest.raises(ValueError, match="hf: no host in the file"):
        parse_hostfile("# nothing\n", "hf")


def test_hostfile_path_expands_variables(tmp_path, monkeypatch) -> None:
    (tmp_path / "nodes").write_text("a\na\nb\nb\n")
    monkeypatch.setenv("PBS_NODEFILE", str(tmp_path / "nodes"))
    assert read_hostfile("$PBS_NODEFILE") == [(Host("a"), 2), (Host("b"), 2)]
    monkeypatch.delenv("PBS_NODEFILE")
    with pytest.raises(ValueError, match=r"names an unset environment variable; inside a PBS job \$PBS_NODEFILE"):
        read_hostfile("$PBS_NODEFILE")


def test_the_hosts_decide_the_shape_and_the_master(tmp_path) -> None:
    cfg = load_config(None, ["launch.backend=ssh", "launch.hosts=[me@10.0.0.5, 10.0.0.6:2222, 10.0.0.7]"])
    assert (cfg.launch.nnodes, cfg.launch.nproc_per_node, cfg.launch.rendezvous_addr) == (3, 1, "10.0.0.5")
    (tmp_path / "hf").write_text("g1 slots=4\ng2 slots=4\n")
    cfg = load_config(None, ["launch.backend=ssh", f"launch.hostfile={tmp_path / 'hf'}", "launch.master_addr=ib-g1"])
    assert (cfg.launch.nnodes, cfg.launch.nproc_per_node, cfg.launch.hosts) == (2, 4, ["g1", "g2"])
    assert cfg.launch.rendezvous_addr == "ib-g1"
    assert load_config(None, []).launch.rendezvous_addr == "127.0.0.1"
    with pytest.raises(UserError, match=r"launch.nnodes=3 contradicts the 2 ssh hosts \(g1, g2\); drop launch"):
        load_config(None, ["launch.backend=ssh", "launch.hosts=[g1, g2]", "launch.nnodes=3"])
    with pytest.raises(UserError, match=r"launch.nproc_per_node=2 contradicts launch.hostfile \(slots=4 per host\)"):
        load_config(None, ["launch.backend=ssh", f"launch.hostfile={tmp_path / 'hf'}", "launch.nproc_per_node=2"])
    with pytest.raises(UserError, match=re.escape("launch.backend=ssh needs launch.hosts")):
        load_config(None, ["launch.backend=ssh"])


def test_ssh_failures_are_one_line_with_the_fix() -> None:
    denied = ssh_failure("node 1 (10.0.0.2)", 255, "root@10.0.0.2: Permission denied (publickey).\n")
    assert isinstance(denied, UserError)
    assert str(denied) == (
        "node 1 (10.0.0.2): Permission denied (publickey). — install this machine's key on it "
        "(ssh-copy-id), or name the key with launch.ssh_options=[-i, KEY]"
    )
    down = ssh_failure("node 2 (gpu3)", 255, "ssh: connect to host gpu3 port 22: Connection timed out\n")
    assert isinstance(down, RetryableError) and "the host does not answer" in str(down)
    assert "ssh failed (weird)" in str(ssh_failure("node 0 (a)", 255, "weird\n"))


def test_the_interface_is_the_one_that_routes_to_the_master() -> None:
    assert route_interface("127.0.0.1") == "lo"
    assert interface_environment("127.0.0.1", {}) == {"GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "lo"}
    assert interface_environment("127.0.0.1", {"NCCL_SOCKET_IFNAME": "eth9"}) == {}  # the user's choice stays
    assert check_interfaces(0, "127.0.0.1", {}).startswith("lo (routes to 127.0.0.1;")
    with pytest.raises(
        UserError,
        match=r"node 1: GLOO_SOCKET_IFNAME=nosuch0: this host has no interface nosuch0 "
        r"\(it has: .*lo 127.0.0.1",
    ):
        check_interfaces(1, "127.0.0.1", {"GLOO_SOCKET_IFNAME": "nosuch0"})
    assert "(set by you)" in check_interfaces(1, "127.0.0.1", {"NCCL_SOCKET_IFNAME": "^docker,lo"})


def test_a_second_live_claim_on_a_rank_names_both_nodes(tmp_path) -> None:
    run = Location(str(tmp_path))
    first = NodeClaim(run, 1, 3, "10.0.0.2")
    first.take()
    second = NodeClaim(run, 1, 3, "10.0.0.3")
    host = socket.gethostname()
    # Another live process on this host holds it: not stale (a real duplicate), whatever host it claims from.
    with pytest.raises(
        UserError,
        match=rf"duplicate NODE_RANK=1: nodes on {host} \(10.0.0.2\) and on {host} "
        r"\(10.0.0.3\) were both started as node 1; give every node a unique "
        r"NODE_RANK in 0..2",
    ):
        _as_other_process(second.take)
    first.release()
    second.take()  # released: free again
    assert os.path.exists(tmp_path / "nodes" / "1" / "claim.json")


def _as_other_process(call) -> None:
    """Run `call` in a forked child so that the claim's holder is another live process; re-raise its UserError."""
    import multiprocessing

    queue = multiprocessing.get_context("fork").SimpleQueue()

    def child() -> None:
        try:
            call()
            queue.put(None)
        except UserError as exc:
            queue.put(str(exc))

    process = multiprocessing.get_context("fork").Process(target=child)
    process.start()
    process.join(10)
    message = queue.get()
    if message:
        raise UserError(message)
