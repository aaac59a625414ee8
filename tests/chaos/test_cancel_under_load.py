"""Scenario 7, cancellation under load: the pipeline, deployed to a real Prefect process worker, is cancelled
through the API (the UI's Cancel button) at a random moment — while staging, during the rendezvous, while
training, while a checkpoint is half saved, or while evaluating — with the nodes as local torchrun agents or
as node flow runs on two more workers (launch.backend local or prefect). Afterwards no process that descends
from the workers may be left (no flow run, no torchrun agent, no rank; found by the test server's API URL,
which every descendant inherits), and storage may hold nothing half written under a final name: every
dataset directory has a manifest its files match or none, every checkpoint is complete and whole or ignored
by readers, every JSON document and metrics line parses.
"""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

from config.loader import load_config
from launch.agent import tagged_processes
from launch.command import free_port
from storage import layout
from storage.checkpoints import step_of
from tests.chaos.runs import half_written, run_processes, steps_logged, wait_for
from tests.flows.conftest import node_workers, pipeline_worker  # noqa: F401 - fixtures, a real cluster

# Each moment: what shows it has begun, and how long after that to wait at most before cancelling.
MOMENTS = ("staging", "rendezvous", "training", "saving", "evaluating")
STOP_BOUND_S = 30.0  # every rank gone within 30 s of the cancel (as a dead node fails the job within 30 s)


def reached(moment: str, storage: Path, run_dir: Path) -> bool:
    """Whether the pipeline has got to `moment` (it may be past it already)."""
    if moment == "staging":
        return (storage / "datasets").exists()
    if moment == "rendezvous":  # the last node's agent started; no step done yet
        return (run_dir / "nodes" / "1" / layout.LOG).exists()
    if moment == "training":
        return bool(steps_logged(run_dir))
    if moment == "saving":  # a step directory without COMPLETE: shards being written (slowed to 2 s)
        return any(
            step_of(p.name) is not None and not (p / layout.COMPLETE).exists()
            for p in (run_dir / "checkpoints").glob("step-*")
        )
    return (run_dir / "nodes" / "0" / "heartbeat-eval").exists()


def current(storage: Path, run_dir: Path) -> str:
    """The furthest moment reached so far (what was really going on when the cancel was sent)."""
    if (run_dir / "eval.json").exists():
        return "registering"
    return next((m for m in reversed(MOMENTS) if reached(m, storage, run_dir)), "starting")


def flow_run_state(run_id) -> str:
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        return client.read_flow_run(run_id).state.name


def worker_descendants(api_url: str) -> list[str]:
    """Command lines of the processes the workers started (flow runs and all below them), not the workers nor the
    session's Prefect server (whose environment names its own URL too)."""
    found = []
    for pid in tagged_processes(api_url, "PREFECT_API_URL"):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as handle:
                cmd = handle.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if pid != os.getpid() and " worker start " not in cmd and " server start " not in cmd:
            found.append(f"{pid} {cmd}")
    return found


def test_cancel_at_a_random_moment(
    node_workers,  # noqa: F811 - the fixture imported above
    pipeline_worker,  # noqa: F811 - the fixture imported above
    chaos_run: int,
    chaos_rng,
    chaos_record,
    tmp_path,
) -> None:
    from prefect.client.orchestration import get_client
    from prefect.deployments import run_deployment
    from prefect.states import Cancelling

    moment = MOMENTS[chaos_run % len(MOMENTS)] if chaos_run < len(MOMENTS) else chaos_rng.choice(MOMENTS)
    delay = chaos_rng.uniform(0, 0.3 if moment in ("staging", "saving") else 1.5)
    backend = chaos_rng.choice(("local", "prefect"))
    name, storage = f"cancel-{chaos_run}", tmp_path
    run_dir = storage / "runs" / name
    cfg = load_config(
        None,
        [
            f"run.storage={storage}",
            f"run.name={name}",
            f"launch.backend={backend}",
            "launch.nnodes=2",
            f"launch.master_port={free_port()}",
            "launch.retries=0",
            "train.max_steps=8",
            "train.save_steps=4",
            "launch.env={TANDEM_TEST_SLOW_RANK: '0:0.1', TANDEM_TEST_SLOW_SAVE: '2'}",
        ],
    )
    # The key makes the client's own retry of a slow request (a loaded server) the same flow run, not a second
    # pipeline on the same run that nobody cancels.
    run = run_deployment(
        pipeline_worker, parameters={"config": cfg.model_dump(mode="json")}, timeout=0, idempotency_key=uuid.uuid4().hex
    )
    wait_for(lambda: reached(moment, storage, run_dir), 300, f"the pipeline to reach {moment}")
    time.sleep(delay)
    observed = current(storage, run_dir)
    running = run_processes(name)
    with get_client(sync_client=True) as client:
        client.set_flow_run_state(run.id, Cancelling(), force=True)
    cancelled_at = time.monotonic()
    wait_for(lambda: not run_processes(name), 60, "every torchrun agent and rank to stop", every=0.2)
    stop_s = time.monotonic() - cancelled_at
    wait_for(lambda: flow_run_state(run.id) in ("Cancelled", "Completed", "Failed"), 90, "the flow run to end", 0.5)
    state = flow_run_state(run.id)
    try:
        wait_for(lambda: not worker_descendants(node_workers), 60, "every process the workers started to exit", 0.5)
    finally:
        left = worker_descendants(node_workers)
    problems = half_written(storage)
    chaos_record(
        "cancellation under load",
        detect_s=stop_s,
        data_lost=bool(problems),
        moment=moment,
        observed=observed,
        delay_s=round(delay, 2),
        backend=backend,
        state=state,
        ranks_at_cancel=len(running),
        left=left,
    )
    assert not left
    assert state == "Cancelled", f"cancelled while {observed}, the flow run ended {state}"
    assert observed in ("starting", "staging", "registering") or running  # the cancel really met running agents
    assert not problems, "\n".join(problems)
    assert stop_s < STOP_BOUND_S
