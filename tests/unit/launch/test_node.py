"""A failed node is classified by its exit code, also when the pipeline follows it from elsewhere (the `prefect`
backend reads what the node recorded in its status.json), never by the text of its message.

`python -m launch.node` as a user or a launcher runs it, on a spec.json that storage/spec.py wrote, with Prefect made
unimportable (a node process never imports it): `--dry-run` prints this node's place, read from Qwen's variables (the
GPUs, else the spec's launch.nproc_per_node, for its ranks), and the torchrun line it would start, and starts or claims
nothing; `--spec` takes the JSON location form; a NODE_RANK that is not a number is one line naming it, exit code 2,
and so is a malformed --spec, an unknown --phase or an evaluation without its model (argparse's). The commands run at
once; a node that trains is tests/test_nodes_by_hand_cli.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from core.errors import EXIT_RETRYABLE, EXIT_USER_ERROR, RetryableError, UserError
from launch import claim as claims
from launch.claim import NodeClaim
from launch.diagnose import error_for
from launch.job import TRAIN
from launch.node import clear_failure, failure_exit_code, main, record_failure, root_cause
from launch.preflight import visible_gpus
from storage import layout
from storage.location import Location
from storage.spec import publish_spec
from tests.conftest import ROOT
from tests.specs import spec_for


def test_the_exit_code_decides_whether_a_retry_may_help() -> None:
    assert isinstance(error_for(EXIT_USER_ERROR, "UserError in the text changes nothing"), UserError)
    assert isinstance(error_for(EXIT_RETRYABLE, "bad config"), RetryableError)
    assert isinstance(error_for(None, "no code known"), RetryableError)


def test_a_node_records_its_failure_next_to_its_status_and_a_new_attempt_forgets_it(tmp_path) -> None:
    run = Location(str(tmp_path / "runs" / "r"))
    assert failure_exit_code(run, 1) is None
    status = tmp_path / "runs" / "r" / "nodes" / "1" / layout.STATUS
    status.parent.mkdir(parents=True)
    status.write_text(json.dumps({"node_rank": 1, "phase": "train", "exit_code": 1, "host": "h"}))
    record_failure(run, 1, TRAIN, EXIT_USER_ERROR)
    assert failure_exit_code(run, 1) == EXIT_USER_ERROR
    assert json.loads(status.read_text())["host"] == "h"  # what the agent wrote is kept
    clear_failure(run, 1)
    assert failure_exit_code(run, 1) is None
    assert json.loads(status.read_text()) == {"node_rank": 1, "phase": "train", "exit_code": 1, "host": "h"}


def test_a_node_that_failed_before_its_agent_ran_still_records_why(tmp_path) -> None:
    run = Location(str(tmp_path / "runs" / "r"))
    record_failure(run, 0, TRAIN, EXIT_USER_ERROR)  # e.g. its preflight refused the node
    assert failure_exit_code(run, 0) == EXIT_USER_ERROR


def test_a_node_whose_ranks_lost_their_peers_to_a_non_retryable_failure_names_that_failure(tmp_path) -> None:
    """Two hosts started as node 1: the later one fails (exit 2) and tells the others; node 0 stops, and the first
    node 1's ranks lose their rendezvous store before that node reads the note. Its lost connection (exit 75,
    'retry') must not hide the duplicate rank, which no retry can fix (a CI run of the by-hand recipe saw it)."""
    run = Location(str(tmp_path / "runs" / "r"))
    first = NodeClaim(run, 1, 3, "10.0.0.2")
    second = NodeClaim(run, 1, 3, "10.0.0.3")
    lost = RetryableError("train failed on node 1, Failed to recv, got 0 bytes")
    assert root_cause(first, lost) is lost  # no note yet: its own error
    second.stop_all("duplicate NODE_RANK=1: nodes on a and on b were both started as node 1", EXIT_USER_ERROR)
    cause = root_cause(first, lost)
    assert isinstance(cause, UserError)
    assert str(cause) == (
        f"node 1 stopped: node 1 on {second.name} failed: duplicate NODE_RANK=1: nodes on a and "
        "on b were both started as node 1"
    )
    own = UserError("bad data on node 1")
    assert root_cause(first, own) is own  # its own 'retry cannot help' error stands


def test_a_retryable_peer_failure_does_not_replace_a_nodes_own_error(tmp_path) -> None:
    run = Location(str(tmp_path / "runs" / "r"))
    mine, peer = NodeClaim(run, 0, 2, "10.0.0.1"), NodeClaim(run, 1, 2, "10.0.0.2")
    peer.stop_all("train failed on node 1, rank 1 was killed by SIGKILL", EXIT_RETRYABLE)
    own = RetryableError("train failed on node 0, rank 0 was killed by SIGKILL")
    assert root_cause(mine, own) is own


def test_a_peers_lost_connection_note_waits_for_this_nodes_own_failure(tmp_path, monkeypatch) -> None:
    """Node 1's rank is killed; node 0's rank says at once that it lost its peer, and node 0 leaves its note before
    node 1's agent notices its own dead rank. Node 1 must not stop on that echo at once (it would report node 0's lost
    connection as the cause, and lose its own: a CI run of the resume test saw it); a note that is not an echo stops
    it at the next renewal, and an echo does after ECHO_GRACE_S of its own clock."""
    run = Location(str(tmp_path / "runs" / "r"))
    now = [1000.0]
    monkeypatch.setattr(claims.time, "monotonic", lambda: now[0])
    node0, node1 = NodeClaim(run, 0, 2, "127.0.0.1"), NodeClaim(run, 1, 2, "127.0.0.1")
    node0.take(), node1.take()
    node0.stop_all("train failed on node 0, rank 0: RuntimeError in dist_sum: Connection reset by peer", 75)
    now[0] += claims.RENEW_S
    node1.poll()  # the echo: node 1 keeps following its agent
    assert not node1.stopped_by_peer
    now[0] += claims.ECHO_GRACE_S
    with pytest.raises(RetryableError, match=r"^node 1 stopped: node 0 on .*Connection reset by peer"):
        node1.poll()
    assert node1.stopped_by_peer  # no cause of its own came: the peer's note stops it

    other = NodeClaim(run, 1, 2, "127.0.0.1")
    other.take()
    node0.stop_all("train failed on node 0, rank 0: ValueError in step (trainer/loop.py:1)", 75)
    now[0] += claims.RENEW_S
    with pytest.raises(RetryableError, match="ValueError in step"):
        other.poll()
    assert other.stopped_by_peer  # not an echo: at once


PLACE = {"NNODES": "2", "NODE_RANK": "1", "MASTER_ADDR": "10.0.0.5", "MASTER_PORT": "6123"}
# What else would place the node (launch/node_env.py): a TrainJob's variables, an indexed Job's index, GPUS_PER_NODE.
UNSET = ("GPUS_PER_NODE", "PET_NODE_RANK", "PET_NNODES", "PET_MASTER_ADDR", "PET_MASTER_PORT", "PET_NPROC_PER_NODE")
UNSET += ("JOB_COMPLETION_INDEX",)
# `python -m launch.node ARGS` in an interpreter where importing Prefect fails, as on a node without it.
WITHOUT_PREFECT = """
import runpy, sys
class NoPrefect:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "prefect":
            raise ImportError("Prefect is not installed on this machine")
sys.meta_path.insert(0, NoPrefect())
sys.argv = ["launch.node", *sys.argv[1:]]
runpy.run_module("launch.node", run_name="__main__", alter_sys=True)
"""


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
            [sys.executable, "-c", WITHOUT_PREFECT, "--spec", location, *args],
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


def test_a_dry_run_without_prefect_prints_the_place_and_the_torchrun_line_and_starts_nothing(runs) -> None:
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
        'python -m launch.node: error: argument --spec: {"url": 5}: expected a URL or path, or a JSON object '
        '{"url": URL, "options": {...}}'
    )


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--phase", "tune"], "argument --phase: phase 'tune' is none of train, eval, probe"),
        (["--phase", "eval"], "--phase eval needs --model, the model to evaluate (final/ or checkpoints/step-N)"),
        (["--model", "/runs/r/final"], "--model: --phase train evaluates no model; leave --model out"),
        (["--phase", "eval", "--model", "{"], "argument --model: {: not valid JSON"),
    ],
)
def test_a_phase_and_its_model_are_checked_before_anything_is_read(args: list[str], said: str, capsys) -> None:
    with pytest.raises(SystemExit) as refused:
        main(["--spec", "/nowhere/spec.json", *args])
    assert refused.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1].startswith(f"python -m launch.node: error: {said}")
