"""launch.backend=prefect: the pipeline sends one `node` flow run per node to queues node-0/node-1, real
process workers run them (preflight + torchrun), and the pipeline follows them to COMPLETE, retrying a lost rank
from the newest checkpoint — or names the node that failed, within seconds, leaving no process behind."""

from __future__ import annotations

import json
import re
import subprocess
import time
from datetime import datetime
from uuid import UUID

import pytest

from config.loader import load_config
from core.errors import RetryableError
from launch.command import free_port
from storage.checkpoints import latest_complete
from storage.location import Location

pytestmark = pytest.mark.e2e


def settings(storage, name: str, model: str, extra: list[str]) -> list[str]:
    return [
        f"run.storage={storage}",
        f"run.name={name}",
        f"model.name_or_path={model}",
        "launch.backend=prefect",
        "launch.nnodes=2",
        f"launch.master_port={free_port()}",
        "launch.rdzv_timeout=60",
        "train.max_steps=6",
        "train.save_steps=3",
        *extra,
    ]


def node_runs(flow_run_name_prefix: str) -> list:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName

    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(like_=flow_run_name_prefix)))
    return [r for r in runs if r.name.startswith(flow_run_name_prefix)]


def stopped_at(flow_run_id: UUID) -> datetime:
    """When the flow run first reached a final state (a cancelled one may go Crashed, then Cancelled)."""
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        return min(state.timestamp for state in client.read_flow_run_states(flow_run_id) if state.is_final())


@pytest.mark.cancel
def test_the_pipeline_trains_through_node_flows_and_a_lost_rank_is_retried(node_workers, tmp_path, tiny_model) -> None:
    """Rank 1 dies once at step 4: the train task fails as retryable, Prefect retries it (launch.retries=1), new node
    flow runs resume from the newest complete checkpoint (step 2) and the run trains, evaluates and registers."""
    from flows.finetune import finetune

    marker = tmp_path / "died-once"
    summary = finetune(
        load_config(
            None,
            settings(
                tmp_path,
                "via-workers",
                tiny_model,
                [
                    "train.save_steps=2",
                    "launch.retries=1",
                    "launch.retry_delay_s=0",
                    f"launch.env={{TANDEM_TEST_EXIT_AT_STEP: '1:4', TANDEM_TEST_EXIT_ONCE: '{marker}'}}",
                ],
            ),
        )
    )
    assert marker.exists()  # rank 1 really died once
    assert summary["registered"] and summary["registration"].startswith("tandem-tiny v0001")
    assert latest_complete(Location(summary["run_url"])).step == 6
    run_dir = tmp_path / "runs" / "via-workers"
    assert "resumed from step 2" in (run_dir / "nodes" / "0" / "log.txt").read_text()
    steps = [
        json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines() if "event" not in line
    ]
    assert steps == [1, 2, 3, 4, 5, 6]  # one uninterrupted trajectory
    runs = sorted(node_runs("via-workers-train-node"), key=lambda r: r.created)
    assert [(r.name, r.work_queue_name) for r in runs[:2]] == [  # both attempts ran on the nodes' own queues
        ("via-workers-train-node0", "node-0"),
        ("via-workers-train-node1", "node-1"),
    ]
    first, retry = runs[:2], runs[2:]
    assert any(r.state.name != "Completed" for r in first)  # the attempt the lost rank failed
    # The retry was sent only once every node of the failed attempt had stopped (node 0 is usually still running when
    # rank 1's failure is seen): node 0's rendezvous port, the same on a retry, was free again, and the attempts
    # never overlapped.
    assert min(r.created for r in retry) >= max(stopped_at(r.id) for r in first)
    assert sorted((r.name, r.work_queue_name, r.state.name) for r in retry) == [
        ("via-workers-train-node0", "node-0", "Completed"),
        ("via-workers-train-node1", "node-1", "Completed"),
    ]
    preflight = json.loads((run_dir / "nodes" / "1" / "preflight.json").read_text())
    assert preflight["checks"]["master port"].endswith("reachable")
    # The memory plan held against this node (CPU ranks: host memory only).
    assert preflight["checks"]["memory"].startswith("host ") and "GB available" in preflight["checks"]["memory"]


def test_a_dead_node_fails_the_pipeline_fast_and_leaves_no_process(node_workers, tmp_path, tiny_model) -> None:
    from flows.finetune import finetune

    cfg = load_config(
        None,
        settings(
            tmp_path, "dead-node", tiny_model, ["launch.env={TANDEM_TEST_SIGNAL_AT_STEP: '1:4'}", "train.max_steps=40"]
        ),
    )
    started = time.monotonic()
    with pytest.raises(RetryableError) as info:  # a real SIGKILL to rank 1, as the out-of-memory killer sends it
        finetune(cfg)
    elapsed = time.monotonic() - started
    assert str(info.value).startswith("train failed on node 1 ")
    # One line: the signal by name and number, the step, the likely cause with the plan's figure and the check.
    said = re.search(r"rank 1 was killed by SIGKILL \(signal 9\) after step (\d+); likely cause: (.*)", str(info.value))
    assert said is not None and "\n" not in said[0], str(info.value)
    assert 0 <= int(said[1]) <= 4 and said[2].startswith("the kernel's out-of-memory killer sends this; the memory ")
    assert re.search(r"the memory plan said \d+\.\d GB per rank; check `dmesg`", said[2]), said[2]
    assert elapsed < 120
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        left = subprocess.run(["pgrep", "-f", "trainer --spec .*dead-node"], capture_output=True, text=True).stdout
        if not left:
            break
        time.sleep(1)
    assert not left, f"processes left behind: {left}"
