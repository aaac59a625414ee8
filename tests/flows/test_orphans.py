"""The pipeline's own faults, as a user meets them through `python -m flows.finetune` (docs/operations.md): SIGHUP
and SIGTERM cancel the run (its nodes save and stop, the flow run ends Cancelled, exit 128 + the signal), and a
pipeline killed outright (kill -9) leaves no agent, rank or node flow run behind on the local backend (the agents'
parent-death signal) and on the prefect backend (the nodes follow the pipeline's liveness record). Nothing is lost:
the checkpoint the ranks saved on the way out is complete. Marker `orphans`: several pipeline runs, not in the
default run (make test-suites)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from launch.command import free_port
from storage.checkpoints import latest_complete, read_complete
from storage.location import Location
from tests.conftest import ROOT
from tests.flows.test_prefect_backend import node_runs

pytestmark = pytest.mark.orphans
# Generous limits for a loaded 2-core machine: these bound a wait, they are not the figures measured.
STEP_WAIT_S = 240
GONE_WAIT_S = 90


def shared_settings(tmp_path: Path, tiny_model: str, name: str) -> list[str]:
    """The settings every run of these tests shares: saving every 1,000 steps and on a cancel."""
    return [
        f"run.storage={tmp_path / 'storage'}",
        f"run.name={name}",
        f"model.name_or_path={tiny_model}",
        "train.save_steps=1000",
        "launch.checkpoint_on_cancel=true",
        "launch.cancel_grace_s=20",
    ]


def start(
    tmp_path: Path, tiny_model: str, name: str, *extra: str, step: int = 3
) -> tuple[subprocess.Popen, Path, Path]:
    """`python -m flows.finetune` on a long run (400 steps, saving on cancel), returned once `step` was logged."""
    storage, out = tmp_path / "storage", tmp_path / f"{name}.out"
    sets = [*shared_settings(tmp_path, tiny_model, name), "train.max_steps=400", *extra]
    with open(out, "w") as handle:
        process = subprocess.Popen(
            [sys.executable, "-m", "flows.finetune", *(a for s in sets for a in ("--set", s))],
            cwd=ROOT,
            stdout=handle,
            stderr=subprocess.STDOUT,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        )
    deadline = time.monotonic() + STEP_WAIT_S
    while f"step {step}/400" not in out.read_text():
        assert process.poll() is None and time.monotonic() < deadline, out.read_text()[-3000:]
        time.sleep(0.3)
    return process, storage / "runs" / name, out


# One phase of a written spec run as the pipeline runs it (launch/phase.py), in a process of its own that a test can
# kill: how the ssh and slurm backends' kill -9 tests start their pipeline.
PHASE_PIPELINE = """
import sys
from launch.job import TRAIN
from launch.phase import run_phase
from storage.location import Location
from storage.spec import WrittenSpec, load_spec
spec_url = Location.parse(sys.argv[1])
spec, digest = load_spec(spec_url)
run_phase(WrittenSpec(spec, spec_url, digest), TRAIN, print, on_progress=lambda _: None)
"""


def start_phase(spec_url: str, run: Path, steps: int = 3) -> subprocess.Popen:
    """PHASE_PIPELINE on the spec at spec_url, returned once `steps` optimizer steps are in the run's metrics."""
    process = subprocess.Popen(
        [sys.executable, "-c", PHASE_PIPELINE, spec_url],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    metrics = run / "metrics.jsonl"
    deadline = time.monotonic() + STEP_WAIT_S
    while len(metrics.read_text().splitlines() if metrics.exists() else []) < steps:
        assert time.monotonic() < deadline and process.poll() is None, process.returncode
        time.sleep(0.2)
    return process


def run_processes(run: Path) -> list[int]:
    """Pids whose command line names the run's spec.json: its torchrun agents and ranks."""
    needle = str(run / "spec.json").encode()
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if needle in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(int(pid))
        except OSError:
            continue
    return found


def wait_gone(run: Path) -> float:
    """Seconds until no process of the run is left (fails after GONE_WAIT_S)."""
    started = time.monotonic()
    while run_processes(run):
        assert time.monotonic() - started < GONE_WAIT_S, f"still running: {run_processes(run)}"
        time.sleep(0.25)
    return time.monotonic() - started


def saved_whole(run: Path, step: int = 3) -> None:
    """The checkpoint saved on the way out is complete; any other step directory is simply not a checkpoint."""
    newest = latest_complete(Location(str(run)))
    assert newest is not None and newest.step >= step
    for step_dir in (run / "checkpoints").iterdir():
        if (step_dir / "COMPLETE").exists():
            assert read_complete(Location(str(step_dir))) is not None


@pytest.mark.parametrize("signum", [signal.SIGHUP, signal.SIGTERM])
def test_a_hangup_or_termination_cancels_the_run(tmp_path, tiny_model, prefect_server, signum) -> None:
    process, run, out = start(tmp_path, tiny_model, "h")
    process.send_signal(signum)
    code = process.wait(timeout=GONE_WAIT_S)
    text = out.read_text()
    assert code == 128 + signum, text[-4000:]
    assert f"cancelled: run h cancelled by {signal.Signals(signum).name}: its nodes stopped after saving" in text
    assert "Finished in state Cancelled(" in text and "Traceback" not in text
    assert run_processes(run) == []
    assert not (run / "LOCK").exists()
    saved_whole(run)


def test_kill_9_of_the_pipeline_leaves_no_rank_on_the_local_backend(tmp_path, tiny_model, prefect_server) -> None:
    """Then the same run is taken back: `run.take_over=true` replaces the dead pipeline's lease at once, and the run
    resumes from the checkpoint saved on the way out and finishes."""
    process, run, _ = start(tmp_path, tiny_model, "k")
    process.kill()
    process.wait()
    print(f"local backend: no process of the run left {wait_gone(run):.1f} s after kill -9")
    saved_whole(run)
    newest = latest_complete(Location(str(run)))
    assert newest is not None
    settings = [*shared_settings(tmp_path, tiny_model, "k"), f"train.max_steps={newest.step + 2}", "run.take_over=true"]
    again = subprocess.run(
        [sys.executable, "-m", "flows.finetune", *(a for s in settings for a in ("--set", s))],
        cwd=ROOT, capture_output=True, text=True, timeout=STEP_WAIT_S,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert again.returncode == 0, (again.stdout + again.stderr)[-3000:]
    assert f"resumed from step {newest.step}" in (run / "nodes" / "0" / "log.txt").read_text()
    finished = latest_complete(Location(str(run)))
    assert finished is not None and finished.step == newest.step + 2


def test_kill_9_of_the_pipeline_stops_the_node_flows(tmp_path, tiny_model, node_workers) -> None:
    process, run, _ = start(
        tmp_path,
        tiny_model,
        "p",
        "launch.backend=prefect",
        f"launch.master_port={free_port()}",
        "launch.rdzv_timeout=60",
    )
    process.kill()
    process.wait()
    print(f"prefect backend: no process of the run left {wait_gone(run):.1f} s after kill -9")
    deadline = time.monotonic() + GONE_WAIT_S
    while not all(r.state is not None and r.state.is_final() for r in node_runs("p-train-node")):
        assert time.monotonic() < deadline, [r.state for r in node_runs("p-train-node")]
        time.sleep(1)
    saved_whole(run)
