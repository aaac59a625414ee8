"""Scenarios of the other side's faults (docs/operations.md): the pipeline process killed outright (kill -9) at a
random step, with its nodes on the local backend (agents stopped by the parent-death signal) and as node flow runs
of the prefect backend (nodes following the pipeline's liveness record); and run.storage filling up during a save.

Recorded: for a killed pipeline, the seconds from the kill until no agent or rank of the run is left; for a full
store, the seconds from the run's start to its one-line error. Lost data: the checkpoint the ranks saved on the way
out (launch.checkpoint_on_cancel) missing or incomplete, or anything half written under a final name."""

from __future__ import annotations

import time

import pytest

from storage.checkpoints import latest_complete
from storage.location import Location
from tests.chaos.runs import half_written
from tests.conftest import run_cli
from tests.flows.conftest import node_workers  # noqa: F401 - fixture: the prefect backend's node workers
from tests.flows.test_orphans import node_runs, start, wait_gone
from tests.tmpfs import NEEDS_ROOT, mounted


@pytest.mark.parametrize("backend", ["local", "prefect"])
def test_the_pipeline_killed_at_a_random_step(
    request, backend: str, tmp_path, tiny_model, prefect_server, chaos_run: int, chaos_rng, chaos_record
) -> None:
    from launch.command import free_port

    extra = ["launch.rdzv_timeout=60"]
    if backend == "prefect":
        request.getfixturevalue("node_workers")
        extra += ["launch.backend=prefect", f"launch.master_port={free_port()}"]
    step = chaos_rng.randint(2, 20)
    name = f"k{chaos_run}{backend[0]}"
    process, run, _ = start(tmp_path, tiny_model, name, *extra, step=step)
    process.kill()
    process.wait()
    stopped_s = wait_gone(run)
    newest = latest_complete(Location(str(run)))
    lost = newest is None or newest.step < step or bool(half_written(run.parent.parent))
    chaos_record(f"orchestrator killed (kill -9): {backend} backend", detect_s=stopped_s, data_lost=lost, step=step)
    if backend == "prefect":
        deadline = time.monotonic() + 90
        while not all(r.state is not None and r.state.is_final() for r in node_runs(f"{name}-train-node")):
            assert time.monotonic() < deadline, "a node flow run is still running"
            time.sleep(1)
    assert not lost, (newest, half_written(run.parent.parent))


@NEEDS_ROOT
def test_storage_fills_up_during_a_save(tmp_path, tiny_model, prefect_server, chaos_run: int, chaos_rng, chaos_record):
    # The first checkpoint (about 1.4 MB) fits in 2 MB beside the dataset, the second never does; where the run is
    # cut varies with the save interval.
    save_steps = chaos_rng.randint(4, 12)
    with mounted(tmp_path / "store", "2m") as store:
        started = time.monotonic()
        sets = [
            f"run.storage={store}",
            "run.name=r",
            f"model.name_or_path={tiny_model}",
            "launch.require_space=false",
            "train.max_steps=30",
            f"train.save_steps={save_steps}",
        ]
        result = run_cli("flows.finetune", *(a for s in sets for a in ("--set", s)), timeout=300)
        seconds = time.monotonic() - started
        errors = [line for line in (result.stdout + result.stderr).splitlines() if line.startswith("error:")]
        newest = latest_complete(Location(str(store / "runs" / "r")))
        lost = newest is None or newest.step != save_steps or bool(half_written(store))
        chaos_record("storage full mid-save (2 MB tmpfs)", detect_s=seconds, data_lost=lost, save_steps=save_steps)
        assert result.returncode == 2 and "Traceback" not in result.stdout + result.stderr
        assert len(errors) == 1 and "storage full: " in errors[0], errors
        assert not lost, (newest, half_written(store))
