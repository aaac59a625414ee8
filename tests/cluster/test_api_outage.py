"""The Prefect API goes away under a training run: the local cluster's server (tools/cluster.sh, on PostgreSQL) is
stopped once the nodes train and started again 90 s after both nodes recorded the end of their training (longer than
Prefect's own client retries, about a minute, so their flow runs cannot report their ends): the nodes trained on
without it, the node flow runs' ends lost to the outage are taken from the nodes' records, the pipeline then
evaluates and registers, `flows.submit --wait` follows it across the outage, and no node process is left. Minutes:
pytest -m cluster. The same fault at random steps and lengths, five times over: tests/chaos/test_api_restart.py."""

from __future__ import annotations

import time

import pytest

from launch.command import free_port
from tests.cluster.stack import HAS_POSTGRES, Stack, run_processes, wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.skipif(not HAS_POSTGRES, reason="PostgreSQL is not installed")]

RUN = "outage"
# After both nodes ended: longer than Prefect's client retries (2 + 4 + 8 + 16 + 32 s, 20% jitter), so that the node
# flow runs' engines fail to report their end.
AFTER_END_S = 90


def test_the_prefect_api_stopped_and_restarted_under_training_loses_nothing() -> None:
    stack = Stack("outage")
    submit = None
    try:
        stack.up()
        submit = stack.submit(RUN, f"launch.master_port={free_port()}", "train.max_steps=400", "train.save_steps=50")
        wait_until(lambda: stack.steps_logged(RUN) > 0, 600, "training started")
        before = stack.complete_steps(RUN)
        stack.stop_server()
        assert not any(stack.node_ended(RUN, r, "train") for r in (0, 1)), "the training ended before the outage"
        wait_until(lambda: all(stack.node_ended(RUN, r, "train") for r in (0, 1)), 600, "both nodes ended training")
        time.sleep(AFTER_END_S)
        during = stack.complete_steps(RUN)
        assert len(during) > len(before), (before, during)  # the nodes trained and saved without the API
        stack.up()
        out, _ = submit.communicate(timeout=900)
        assert submit.returncode == 0, out
        assert "does not answer" in out and "answers again" in out, out  # submit --wait followed across it
        assert "Completed (registered tandem-tiny v0001" in out, out
        assert "eval.json" in stack.keys(RUN) and "step-00000400" in stack.complete_steps(RUN)
        pipeline_log = (stack.state / "worker-pipeline.log").read_text()
        assert "the Prefect API answers again" in pipeline_log  # the pipeline's follow loop waited for it
        nodes = stack.node_flow_runs(RUN)
        assert [(r["name"], r["state"]) for r in nodes] == [
            (f"{RUN}-eval-node0", "Completed"),
            (f"{RUN}-eval-node1", "Completed"),
            (f"{RUN}-train-node0", "Completed"),
            (f"{RUN}-train-node1", "Completed"),
        ], nodes
        # Both train flow runs ended during the outage: their engines could not report it, their nodes' records did.
        assert all("could not report its end" in (r["message"] or "") for r in nodes if "-train-" in r["name"]), nodes
        assert not run_processes(RUN), run_processes(RUN)
    finally:
        if submit is not None and submit.poll() is None:
            submit.kill()
        stack.down()
