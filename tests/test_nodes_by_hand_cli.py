"""The "by hand" path of docs/launching.md, command for command: `python -m flows.prepare --write-spec` writes the run's
spec.json, `python -m launch.node --spec SPEC --dry-run` shows what a node would run, then `python -m launch.node
--spec SPEC` on each node with Qwen's NNODES/NODE_RANK/MASTER_ADDR/MASTER_PORT variables trains the run to a complete
final checkpoint.

The prepare step runs as on a machine with no Prefect server (Prefect's temporary server: the one test of that
path); the nodes import no Prefect at all (tests/unit/launch/test_node.py holds that)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from launch.command import free_port
from storage.checkpoints import latest_complete
from storage.location import Location
from tests.conftest import ROOT, run_cli


def test_write_spec_then_start_each_node_by_hand(tmp_path, tiny_model, prefect_server) -> None:
    storage = tmp_path / "storage"
    env = {
        "PREFECT_HOME": str(tmp_path / "prefect"),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_API_URL": None,
    }
    prepared = run_cli(
        "flows.prepare",
        "--storage",
        str(storage),
        "--set",
        "run.name=r1",
        "--set",
        "train.max_steps=2",
        "--set",
        f"model.name_or_path={tiny_model}",
        "--write-spec",
        env=env,
    )
    assert prepared.returncode == 0, prepared.stderr[-3000:]
    spec_url = dict(re.findall(r"^(\w+) +(.+)$", prepared.stdout, flags=re.MULTILINE))["spec"]
    assert spec_url == str(storage / "runs" / "r1" / "spec.json")

    common = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "NNODES": "2",
        "GPUS_PER_NODE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
    }
    # What node 1 would run, as its environment places it; it starts nothing (no claim taken).
    shown = subprocess.run(
        [sys.executable, "-m", "launch.node", "--spec", spec_url, "--dry-run"],
        cwd=ROOT,
        env={**common, "NODE_RANK": "1"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith("# node 1 of 2: claims its rank, preflight, then starts one torchrun agent")
    assert f"--node-rank=1 --master-addr=127.0.0.1 --master-port={common['MASTER_PORT']}" in shown.stdout
    assert f"-m trainer --spec {spec_url}" in shown.stdout
    assert not (storage / "runs" / "r1" / "nodes").exists()
    nodes = [
        subprocess.Popen(
            [sys.executable, "-m", "launch.node", "--spec", spec_url],
            cwd=ROOT,
            env={**common, "NODE_RANK": str(rank)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in (0, 1)
    ]
    try:
        outputs = [node.communicate(timeout=300)[0] for node in nodes]
    finally:
        for node in nodes:
            node.kill()
    assert [node.returncode for node in nodes] == [0, 0], outputs
    assert "node 0 preflight ok" in outputs[0] and "node 1 preflight ok" in outputs[1]
    assert latest_complete(Location(str(storage / "runs" / "r1"))).step == 2
