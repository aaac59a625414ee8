"""The Prefect API restarted under a run (docs/operations.md, "The Prefect API goes away"): on one local cluster
(tools/cluster.sh: PostgreSQL, the Prefect server, S3, a worker per node), each run stops the server at a random
step of training for a random time (from within Prefect's own client retries to well beyond them), starts it again,
and follows the run to its end with `flows.submit --wait`.

Recorded: the outage, and the seconds from the server's return to the run's end (evaluated and registered). Lost:
the run not completed, a checkpoint saved during the run missing at the end, or a process of the run left behind."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from launch.command import free_port
from tests.cluster.stack import HAS_POSTGRES, Stack, run_processes, wait_until

pytestmark = [pytest.mark.chaos, pytest.mark.skipif(not HAS_POSTGRES, reason="PostgreSQL is not installed")]


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    cluster = Stack("chaos-api")
    cluster.up()
    try:
        yield cluster
    finally:
        cluster.down()


def test_the_prefect_api_restarted_at_a_random_step(stack: Stack, chaos_run: int, chaos_rng, chaos_record) -> None:
    step = chaos_rng.randint(2, 150)
    outage_s = chaos_rng.uniform(20, 150)
    run = f"api{chaos_run}"
    submit = stack.submit(run, f"launch.master_port={free_port()}", "train.max_steps=400", "train.save_steps=50")
    try:
        wait_until(lambda: stack.steps_logged(run) >= step, 600, f"step {step}")
        stack.stop_server()
        time.sleep(outage_s)
        saved = stack.complete_steps(run)
        stack.up()
        back = time.monotonic()
        out, _ = submit.communicate(timeout=900)
        recover_s = time.monotonic() - back
    finally:
        if submit.poll() is None:
            submit.kill()
    completed = submit.returncode == 0 and "Completed (registered" in out
    lost = not completed or not saved <= stack.complete_steps(run) or bool(run_processes(run))
    chaos_record(
        "Prefect API restarted mid-training (prefect backend)",
        detect_s=recover_s,
        data_lost=lost,
        step=step,
        outage_s=round(outage_s, 1),
    )
    assert completed, out[-3000:]
    assert not lost, (saved, stack.complete_steps(run), run_processes(run))
    nodes = stack.node_flow_runs(run)
    assert {r["state"] for r in nodes} == {"Completed"}, nodes
