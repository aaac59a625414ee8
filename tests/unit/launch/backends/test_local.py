"""The local backend (launch/backends/local.py): what it describes (each node's steps, its ranks' environment beyond
this process's, with launch.forward_env's values masked, and its agent's torchrun line), and its node threads under
the one supervise loop with stand-ins for the nodes (run_node): which failure is reported, and with which grace the
other nodes are stopped. Real nodes run in tests/distributed and tests/e2e."""

from __future__ import annotations

import re
import shlex
import threading
import time

import pytest

from config.loader import load_config
from core.errors import UserError
from launch.agent import FAILED_GRACE_S, KILL_GRACE_S
from launch.backend import run_job
from launch.backends import local
from launch.dry_run import planned_job
from launch.job import EVAL, TRAIN, NodePlan, PhaseJob
from launch.node import NodeStop, NodeStopped
from pipeline.plan import build_spec
from storage.location import join
from storage.spec import DatasetRef, WrittenSpec

CANARY = "hf_canary_value_123"


def test_the_description_is_each_nodes_torchrun_line_and_what_its_ranks_get(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("OMP_NUM_THREADS", "NCCL_DEBUG"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_TOKEN", CANARY)
    settings = ["run.storage=/s", "run.name=r", "launch.nnodes=2", "launch.nproc_per_node=3"]
    cfg = load_config(
        None, [*settings, "launch.master_port=6123", "launch.forward_env=[HF_TOKEN]", "launch.env={X: 'a b'}"]
    )
    planned = planned_job(cfg, TRAIN)
    job = PhaseJob(planned.written, TRAIN, env={"NCCL_DEBUG": "INFO"})
    text = local.LocalBackend().describe(job)
    assert text.startswith("# launch.backend=local: 2 node(s) on this machine") and CANARY not in text
    nodes = text.split("# node ")[1:]
    assert [node.split(":")[0] for node in nodes] == ["0 of 2", "1 of 2"]
    for rank, node in enumerate(nodes):
        assert "preflight" in node.splitlines()[0]
        for line in ("NCCL_DEBUG=INFO", "OMP_NUM_THREADS=1", "X='a b'"):  # the job's, a default, launch.env
            assert f"  {line} \\\n" in node, (line, node)
        assert "HF_TOKEN" not in node  # a thread of this process: its agent inherits the forwarded name as it is
        command = shlex.split(node.splitlines()[-1])
        assert command[1:3] == ["-m", "torch.distributed.run"] and command[-4:] == [
            "-m",
            "trainer",
            "--spec",
            "/s/runs/r/spec.json",
        ]
        assert {f"--node-rank={rank}", "--nnodes=2", "--nproc-per-node=3", "--master-port=6123"} <= set(command)


def test_without_a_master_port_the_description_says_which_free_one_it_shows() -> None:
    text = local.LocalBackend().describe(planned_job(load_config(None, ["run.storage=/s"]), EVAL))
    port = re.search(r"rendezvous port (\d+) is a free one, picked again at submission", text)
    assert port is not None and text.count(f"--master-port={port.group(1)}") == 2
    assert "preflight" not in text  # evaluation runs no preflight


def job(tmp_path, nnodes: int, extra: list[str] = ()) -> PhaseJob:
    cfg = load_config(None, [f"run.storage={tmp_path}", f"launch.nnodes={nnodes}", "train.max_steps=8", *extra])
    spec = build_spec(
        cfg,
        "r",
        str(tmp_path),
        DatasetRef(dataset_id="d", url=str(tmp_path), manifest_digest="x", split_records={"train": 100}),
    )
    return PhaseJob(WrittenSpec(spec, join(spec.run, "spec.json"), "0" * 64), EVAL)


class Nodes:
    """Stand-in for run_node: node `failing` raises `error` at once; the others run until their stop is tripped."""

    def __init__(self, failing: int | None, error: BaseException | None = None) -> None:
        self.failing, self.error = failing, error
        self.graces: dict[int, float | None] = {}
        self.threads: dict[int, threading.Thread] = {}

    def __call__(self, job: PhaseJob, plan: NodePlan, info, *, stop: NodeStop) -> None:
        self.threads[plan.node_rank] = threading.current_thread()
        if plan.node_rank == self.failing:
            raise self.error
        try:
            while True:
                stop.poll()
                time.sleep(0.01)
        except NodeStopped:
            self.graces[plan.node_rank] = stop.grace_s
            raise


def test_the_local_backend_reports_a_nodes_failure_and_stops_the_others_with_the_failure_grace(
    tmp_path, monkeypatch
) -> None:
    error = UserError("train failed on node 1, rank 1: bad data")
    nodes = Nodes(failing=1, error=error)
    monkeypatch.setattr(local, "run_node", nodes)
    with pytest.raises(UserError) as info:
        run_job(local.LocalBackend(), job(tmp_path, 3), lambda _: None)
    assert info.value is error
    assert nodes.graces == {0: FAILED_GRACE_S, 2: FAILED_GRACE_S}
    assert not any(thread.is_alive() for thread in nodes.threads.values())  # every node stopped before the raise
    assert threading.main_thread() not in nodes.threads.values()


@pytest.mark.parametrize(
    ("extra", "grace"), [([], KILL_GRACE_S), (["launch.checkpoint_on_cancel=true", "launch.cancel_grace_s=77"], 77)]
)
def test_a_cancel_of_the_pipeline_stops_every_node_with_the_cancel_grace(tmp_path, monkeypatch, extra, grace) -> None:
    nodes = Nodes(failing=None)
    monkeypatch.setattr(local, "run_node", nodes)

    def cancelled(*_: object) -> None:
        time.sleep(0.2)
        raise KeyboardInterrupt

    monkeypatch.setattr(local, "supervise", cancelled)
    with pytest.raises(KeyboardInterrupt):
        run_job(local.LocalBackend(), job(tmp_path, 2, extra), lambda _: None)
    assert nodes.graces == {0: grace, 1: grace}
    assert not any(thread.is_alive() for thread in nodes.threads.values())
