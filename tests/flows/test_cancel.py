"""Cancelling a pipeline run through the API (what the UI's Cancel button calls) while it trains: the
worker stops the flow run, the flow run stops every torchrun agent and rank on every node, and no
process is left behind — for the local backend and for node flows on other workers."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from config.loader import load_config
from launch.command import free_port
from storage.checkpoints import latest_complete
from storage.location import Location

# Two pipeline runs (about a minute of a worker): a suite of its own, after the default run (make test-suites).
pytestmark = [pytest.mark.e2e, pytest.mark.cancel]


def wait_for(predicate, timeout: float, what: str) -> float:
    """Seconds it took for predicate() to hold; fails naming `what` after timeout."""
    started = time.monotonic()
    while not predicate():
        if time.monotonic() - started > timeout:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.5)
    return time.monotonic() - started


def processes(pattern: str) -> str:
    return subprocess.run(["pgrep", "-af", pattern], capture_output=True, text=True).stdout


def state_name(run_id) -> str:
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        return client.read_flow_run(run_id).state.name


# Each backend once, and each value of launch.checkpoint_on_cancel once: the save on cancel happens in the ranks
# (trainer/watch/cancel.py) whichever backend stopped them, so the two cases cover every path.
@pytest.mark.parametrize(("backend", "save"), [("local", False), ("prefect", True)])
def test_cancel_while_training_leaves_no_process(
    pipeline_worker, tmp_path, tiny_model, backend: str, save: bool
) -> None:
    from prefect.client.orchestration import get_client
    from prefect.deployments import run_deployment
    from prefect.states import Cancelling

    name = f"cancel-{backend}-{'save' if save else 'nosave'}"
    cfg = load_config(
        None,
        [
            f"run.storage={tmp_path}",
            f"run.name={name}",
            f"model.name_or_path={tiny_model}",
            f"launch.backend={backend}",
            "launch.nnodes=2",
            f"launch.master_port={free_port()}",
            "train.max_steps=100000",
            "train.save_steps=100000",
            "launch.env={TANDEM_TEST_SLOW_RANK: '0:0.05'}",
            f"launch.checkpoint_on_cancel={str(save).lower()}",
        ],
    )
    run = run_deployment(pipeline_worker, parameters={"config": cfg.model_dump(mode="json")}, timeout=0)
    metrics = Path(tmp_path) / "runs" / name / "metrics.jsonl"
    wait_for(lambda: metrics.exists() and metrics.stat().st_size > 0, 180, "training to start")
    assert processes(f"trainer --spec .*{name}")

    with get_client(sync_client=True) as client:
        client.set_flow_run_state(run.id, Cancelling(), force=True)
    gone_after = wait_for(lambda: not processes(f"trainer --spec .*{name}"), 30, "every rank to stop")
    wait_for(lambda: not processes(f"torch.distributed.run.*{name}"), 30, "every torchrun agent to stop")
    wait_for(lambda: state_name(run.id) == "Cancelled", 60, "the flow run to be Cancelled")
    assert gone_after < 30
    saved = latest_complete(Location(str(Path(tmp_path) / "runs" / name)))
    if save:  # stopped at a step boundary every rank agreed on, with a whole checkpoint
        assert saved is not None and saved.step > 0
    else:
        assert saved is None
