"""The network interface checks (launch/network.py) on this machine's own interfaces."""

from __future__ import annotations

import pytest

from core.errors import UserError
from launch.network import check_interfaces, interface_environment, route_interface


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
