"""The network probe on two real gloo ranks as two nodes: the job's bus bandwidth and each node's link to node 0,
recorded in every node's preflight.json; below launch.min_bandwidth_gbps a warning, or with launch.require_bandwidth
one line on every rank naming the slow node; nodes with different GPUs refused."""

from __future__ import annotations

import json

import pytest

from core.errors import UserError
from tests.gloo import on_ranks
from tests.specs import spec_for
from trainer.parallel.distributed import Dist
from trainer.watch.probe import _same_gpus, run_probe


def probe(dist: Dist, specs: list) -> list[dict | str]:
    """Each spec's probe in turn on this rank: its report, or its one-line refusal."""
    out: list[dict | str] = []
    for spec in specs:
        try:
            out.append(run_probe(spec, dist))
        except UserError as exc:
            out.append(str(exc))
    return out


def test_the_probe_measures_records_and_judges_the_links(tmp_path) -> None:
    fine = spec_for(tmp_path / "fine", ["launch.probe_mb=0.25", "launch.min_bandwidth_gbps=0.001"])
    strict = ["launch.probe_mb=0.25", "launch.min_bandwidth_gbps=1000000", "launch.require_bandwidth=true"]
    slow = spec_for(tmp_path / "slow", strict)
    reports, refusals = zip(*on_ranks(probe, 2, [fine, slow], per_node=1), strict=True)
    assert reports[0] == reports[1] and reports[0]["gpus across nodes"] == "no GPU on every node (2)"
    figures = reports[0]["bandwidth"]
    assert figures["ranks"] == 2 and figures["bus_gbps"] > 0 and figures["slowest_node"] == 1
    assert set(figures["nodes"]) == {1} and set(figures["nodes"][1]) == {"from_node0_gbps", "to_node0_gbps"}
    for node in (0, 1):
        doc = json.loads((tmp_path / "fine" / "runs" / "r" / "nodes" / str(node) / "preflight.json").read_text())
        assert doc["node_rank"] == node and doc["checks"]["bandwidth"]["bus_gbps"] == figures["bus_gbps"]
    assert refusals[0] == refusals[1]
    assert refusals[0].startswith("network probe: node 1 (") and "is slow: " in refusals[0]
    assert refusals[0].endswith("; or unset launch.require_bandwidth to train anyway")


def test_a_node_with_other_gpus_is_named() -> None:
    nodes = [
        {"node": 0, "host": "g0", "addr": "10.0.0.1", "gpus": "8 x NVIDIA H100"},
        {"node": 1, "host": "g1", "addr": "10.0.0.2", "gpus": "8 x NVIDIA A100"},
        {"node": 2, "host": "g2", "addr": "10.0.0.3", "gpus": "8 x NVIDIA H100"},
    ]
    with pytest.raises(
        UserError, match=r"^node 1 \(g1, 10.0.0.2\) has 8 x NVIDIA A100, the other nodes 8 x NVIDIA H100"
    ):
        _same_gpus(nodes)
