"""The ssh backend's hosts as a config gives them: host entries, host files (DeepSpeed/OpenMPI and PBS/Torque, a path
with variables), and the shape and the master the hosts give the config."""

from __future__ import annotations

import re

import pytest

from config.hosts import Host, parse_host, parse_hostfile, read_hostfile
from config.loader import load_config
from core.errors import UserError


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
