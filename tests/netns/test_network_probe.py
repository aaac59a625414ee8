"""The network probe across three namespaces (the `probe` phase: preflight and the probe, no training): one node's
link shaped with tc's tbf is named as the slow one and fails the job with launch.require_bandwidth. (The figures on
unshaped veths are checked on the pipeline run of test_ssh_backend.py.)"""

from __future__ import annotations

import json

import pytest

from core.errors import UserError
from launch.job import PROBE
from launch.phase import run_phase
from pipeline.plan import build_spec
from storage import layout
from storage.location import join
from storage.spec import WrittenSpec, write_spec
from tests.distributed.harness import Staged, config
from tests.netns.hosts import Machines, shape, unshape

pytestmark = pytest.mark.netns
RATE_MBIT = 200


def probe(staged: Staged, machines: Machines, name: str, overrides: list[str]) -> None:
    """Run the probe phase over ssh on three namespaces."""
    cfg = config(
        staged,
        name,
        [
            "launch.backend=ssh",
            f"launch.hosts=[{', '.join(machines.hosts(3))}]",
            f"launch.ssh_options=[{', '.join(machines.ssh_options)}]",
            "launch.probe_mb=4",
            *overrides,
        ],
    )
    spec = build_spec(cfg, name, staged.model_path, staged.dataset)
    written = WrittenSpec(spec, join(spec.run, layout.SPEC), write_spec(spec))
    lines: list[str] = []
    try:
        run_phase(written, PROBE, lines.append)
    finally:
        print("\n".join(lines))
        assert machines.strays() == {}


def test_the_probe_names_a_shaped_node_as_the_slow_one(staged: Staged, machines: Machines) -> None:
    slow = machines.machines[2]
    shape(slow, f"{RATE_MBIT}mbit")
    try:
        with pytest.raises(UserError) as failed:
            probe(
                staged,
                machines,
                "probe-shaped",
                ["launch.require_bandwidth=true", f"launch.min_bandwidth_gbps={2 * RATE_MBIT / 1000}"],
            )
    finally:
        unshape(slow)
    message = str(failed.value).splitlines()[0]
    assert f"network probe: node 2 (vm, {slow.addr}) is slow: " in message, message
    assert "below launch.min_bandwidth_gbps=0.4" in message and "unset launch.require_bandwidth" in message
    reports = [
        json.loads((staged.storage / "runs" / "probe-shaped" / "nodes" / str(r) / "preflight.json").read_text())
        for r in range(3)
    ]
    figures = reports[2]["checks"]["bandwidth"]
    print("shaped:", json.dumps(figures))
    assert all(r["checks"]["bandwidth"] == figures for r in reports)  # every node records the job's figures
    assert all(r["checks"]["gpus across nodes"] == "no GPU on every node (3)" for r in reports)
    assert figures["ranks"] == 3 and figures["probe_mb"] == 4.0 and figures["slowest_node"] == 2
    measured = figures["nodes"]["2"]
    assert min(figures["nodes"]["1"].values()) > 2 * RATE_MBIT / 1000  # the unshaped node is far faster
    for gbps in measured.values():  # both directions are shaped: within a factor of the configured rate
        assert RATE_MBIT / 1000 / 3 < gbps < RATE_MBIT / 1000 * 1.5, measured
