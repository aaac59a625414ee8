"""The ssh backend's messages without a network: ssh's failures as one line, the interface checks on this machine's own
interfaces, and the node claim that catches a duplicate NODE_RANK. Host entries and host files are
tests/unit/config/test_hosts.py."""

from __future__ import annotations

import os
import socket

import pytest

from core.errors import RetryableError, UserError
from launch.backends.ssh_errors import ssh_failure
from launch.claim import NodeClaim
from launch.network import check_interfaces, interface_environment, route_interface
from storage.location import Location


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
