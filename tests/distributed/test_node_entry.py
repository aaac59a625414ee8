"""`python -m launch.node --spec SPEC` on each node, driven by Qwen's NNODES/NODE_RANK/MASTER_ADDR/MASTER_PORT/
GPUS_PER_NODE variables, as users launch nodes by hand or from another scheduler. The whole by-hand path
(prepare --write-spec, then two nodes training to COMPLETE) is tests/test_nodes_by_hand_cli.py."""

from __future__ import annotations

import os
import subprocess
import sys

from launch.command import free_port
from pipeline.plan import build_spec
from storage import layout
from storage.location import join
from storage.spec import write_spec
from tests.conftest import ROOT
from tests.distributed.harness import Staged, config


def launch(spec_url: str, **variables: str) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", **variables}
    return subprocess.Popen(
        [sys.executable, "-m", "launch.node", "--spec", spec_url],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def test_a_wrong_node_count_is_refused_before_training(staged: Staged) -> None:
    cfg = config(staged, "by-hand-mismatch", ["launch.nnodes=2"])
    spec = build_spec(cfg, "by-hand-mismatch", staged.model_path, staged.dataset)
    write_spec(spec)
    node = launch(
        join(spec.run, layout.SPEC).argument(),
        NNODES="3",
        NODE_RANK="0",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(free_port()),
        GPUS_PER_NODE="1",
    )
    output = node.communicate(timeout=120)[0]
    assert node.returncode == 2
    assert "error: node 0: rank mismatch: 3 nodes x 1 ranks (node rank 0) but spec.json was resolved for 2" in output
    assert "Traceback" not in output
