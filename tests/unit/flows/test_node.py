"""`python -m flows.node` (flows/node.py) as a user or a launcher runs it, on a spec.json that storage/spec.py wrote:
`--dry-run` prints this node's place, read from Qwen's variables (the GPUs, else the spec's launch.nproc_per_node, for
its ranks), and the torchrun line it would start, and starts or claims nothing; `--spec` takes the JSON location form;
a NODE_RANK that is not a number is one line naming it, exit code 2, and so is a malformed --spec (argparse's). The
three commands run at once (each pays for importing Prefect); a node that trains is tests/test_nodes_by_hand_cli.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from launch.preflight import visible_gpus
from storage.spec import publish_spec
from tests.conftest import ROOT
from tests.specs import spec_for

PLACE = {"NNODES": "2", "NODE_RANK": "1", "MASTER_ADDR": "10.0.0.5", "MASTER_PORT": "6123"}
# What else would place the node (launch/node_env.py): a TrainJob's variables, an indexed Job's index, GPUS_PER_NODE.
UNSET = ("GPUS_PER_NODE", "PET_NODE_RANK", "PET_NNODES", "PET_MASTER_ADDR", "PET_MASTER_PORT", "PET_NPROC_PER_NODE")
UNSET += ("JOB_COMPLETION_INDEX",)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, subprocess.CompletedProcess]]:
    """name -> (the run directory, the finished command) for each command line below, started together."""
    commands = {
        "dry run": (["--dry-run"], {}),
        "bad rank": (["--dry-run"], {"NODE_RANK": "one"}),
        "bad spec": (["--spec", '{"url": 5}'], {}),
    }
    started = {}
    for name, (args, env) in commands.items():
        storage = tmp_path_factory.mktemp("node")
        written = publish_spec(spec_for(storage, ["launch.nproc_per_node=3", "run.name=r"]))
        location = json.dumps({"url": written.url.url, "options": {"auto_mkdir": True}})  # the JSON form
        base = {key: value for key, value in os.environ.items() if key not in UNSET}
        process = subprocess.Popen(
            [sys.executable, "-m", "flows.node", "--spec", location, *args],
            cwd=ROOT,
            env={**base, **PLACE, **env},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        started[name] = (written.spec.run, process)
    done = {}
    for name, (run, process) in started.items():
        stdout, stderr = process.communicate(timeout=180)
        done[name] = (Path(run.url), subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr))
    return done


def test_a_dry_run_prints_the_place_and_the_torchrun_line_and_starts_nothing(runs) -> None:
    run, shown = runs["dry run"]
    assert shown.returncode == 0, shown.stderr
    nproc = visible_gpus() or 3  # GPUS_PER_NODE unset: every visible GPU, else the spec's launch.nproc_per_node
    lines = shown.stdout.splitlines()
    assert lines[0] == (
        f"# node 1 of 2: claims its rank, preflight, then starts one torchrun agent of {nproc} rank(s), rendezvous "
        "10.0.0.5:6123"
    )
    assert lines[1] == f"cd {ROOT} && env \\"
    assert lines[-1].split(" -m torch.distributed.run ")[1] == (
        f"--nnodes=2 --nproc-per-node={nproc} --node-rank=1 --master-addr=10.0.0.5 --master-port=6123 --rdzv-conf "
        f"timeout=120 -m trainer --spec {run}/spec.json"
    )
    assert sorted(p.name for p in run.iterdir()) == ["spec.json"]  # no claim, no preflight, no status


def test_a_node_rank_that_is_not_a_number_is_one_line_and_exit_2(runs) -> None:
    run, refused = runs["bad rank"]
    assert refused.returncode == 2 and refused.stdout == ""
    assert refused.stderr.endswith("error: NODE_RANK='one': must be a non-negative integer\n")
    assert refused.stderr.count("error:") == 1 and "Traceback" not in refused.stderr
    assert sorted(p.name for p in run.iterdir()) == ["spec.json"]


def test_a_malformed_spec_location_is_argparses_one_line(runs) -> None:
    _, refused = runs["bad spec"]
    assert refused.returncode == 2
    assert refused.stderr.splitlines()[-1] == (
        'python -m flows.node: error: argument --spec: {"url": 5}: expected a URL or path, or a JSON object '
        '{"url": URL, "options": {...}}'
    )
