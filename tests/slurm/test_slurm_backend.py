"""launch.backend=slurm against a real slurmctld + slurmd on localhost (tests/slurm/conftest.py): the
rendered sbatch script, submission with `sbatch --parsable`, following the job to COMPLETE, and a
failing rank turning into a failed step with the job's output. One SLURM node is all one machine can
host here, so the real runs use 1 node x 2 ranks; the 2-node script is checked as rendered."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from config.loader import load_config
from core.errors import RetryableError
from launch.backends.slurm import render_sbatch
from launch.command import free_port
from launch.job import TRAIN, PhaseJob
from launch.phase import run_phase
from pipeline.plan import build_spec
from storage import layout
from storage.checkpoints import latest_complete
from storage.location import Location, join
from storage.spec import WrittenSpec, write_spec
from tests.distributed.harness import Staged, config
from tests.flows.test_orphans import GONE_WAIT_S, saved_whole, start_phase, wait_gone


def test_the_script_mirrors_qwens_slurm_recipe(staged: Staged) -> None:
    cfg = config(
        staged,
        "render",
        [
            "launch.backend=slurm",
            "launch.nnodes=4",
            "launch.nproc_per_node=8",
            "launch.master_port=6001",
            "launch.slurm_args=[--partition=gpu, --time=24:00:00]",
            "launch.env={NCCL_SOCKET_IFNAME: ib0}",
        ],
    )
    spec = build_spec(cfg, "render", staged.model_path, staged.dataset)
    script = render_sbatch(
        PhaseJob(WrittenSpec(spec, Location("/shared/runs/render/spec.json"), "ab" * 32), TRAIN),
        output="/shared/out-%j.txt",
    )
    lines = script.splitlines()
    assert lines[0] == "#!/bin/bash"
    for expected in (
        "#SBATCH --nodes=4",
        "#SBATCH --ntasks-per-node=1",
        "#SBATCH --partition=gpu",
        "#SBATCH --time=24:00:00",
        "#SBATCH --output=/shared/out-%j.txt",
        'export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        "export MASTER_PORT=6001",
        "export NNODES=$SLURM_JOB_NUM_NODES",
        "export GPUS_PER_NODE=8",
        "export NCCL_SOCKET_IFNAME=ib0",
    ):
        assert expected in lines, expected
    srun = script[script.index("srun") :]
    assert "--nodes=4 --ntasks-per-node=1 --kill-on-bad-exit=1" in srun
    assert "export NODE_RANK=$SLURM_NODEID; exec" in srun
    assert "-m launch.node --spec /shared/runs/render/spec.json --phase train --spec-digest " + "ab" * 32 in srun
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0  # valid bash


def test_the_pipeline_runs_through_sbatch(slurm_cluster, prefect_server, tmp_path, tiny_model) -> None:
    from flows.finetune import finetune

    summary = finetune(
        load_config(
            None,
            [
                f"run.storage={tmp_path}",
                "run.name=via-slurm",
                f"model.name_or_path={tiny_model}",
                "launch.backend=slurm",
                "launch.nnodes=1",
                "launch.nproc_per_node=2",
                f"launch.master_port={free_port()}",
                "train.max_steps=4",
                "train.save_steps=2",
            ],
        )
    )
    assert latest_complete(Location(summary["run_url"])).step == 4
    assert summary["registered"] and summary["registration"].startswith("tandem-tiny v")
    jobs = sorted(p.name for p in (tmp_path / "runs" / "via-slurm" / "slurm").iterdir())
    assert "train.sbatch" in jobs and "eval.sbatch" in jobs and any(j.startswith("train-") for j in jobs)


def test_a_failing_rank_fails_the_job_with_its_output(slurm_cluster, staged: Staged) -> None:
    cfg = config(
        staged,
        "slurm-fail",
        [
            "launch.backend=slurm",
            "launch.nnodes=1",
            "launch.nproc_per_node=2",
            f"launch.master_port={free_port()}",
            "train.max_steps=8",
            "launch.env={TANDEM_TEST_EXIT_AT_STEP: '1:3'}",
        ],
    )
    spec = build_spec(cfg, "slurm-fail", staged.model_path, staged.dataset)
    digest = write_spec(spec)
    with pytest.raises(RetryableError) as info:
        run_phase(WrittenSpec(spec, join(spec.run, layout.SPEC), digest), TRAIN, lambda _: None)
    message = str(info.value)
    assert (
        message.startswith("train: SLURM job ")
        and " ended FAILED (exit 75:0): train failed on node 0, rank 1 exited with code 137" in message
    )
    queued = subprocess.run(["squeue", "-h"], capture_output=True, text=True).stdout
    assert queued.strip() == ""


@pytest.mark.orphans
def test_kill_9_of_the_pipeline_ends_the_slurm_job_and_leaves_no_rank(slurm_cluster, staged: Staged) -> None:
    """The pipeline killed outright while its SLURM job trains: the node (launch.node under srun) sees the pipeline's
    liveness record go stale, its ranks save and stop, and the job ends; nothing of the run is left running and the
    checkpoint saved on the way out is whole. Marker `orphans` (make test-suites)."""
    cfg = config(
        staged,
        "slurm-orphan",
        [
            "launch.backend=slurm",
            "launch.nnodes=1",
            "launch.nproc_per_node=2",
            f"launch.master_port={free_port()}",
            "train.max_steps=400",
            "train.save_steps=1000",
            "launch.checkpoint_on_cancel=true",
        ],
    )
    spec = build_spec(cfg, "slurm-orphan", staged.model_path, staged.dataset)
    written = WrittenSpec(spec, join(spec.run, layout.SPEC), write_spec(spec))
    run = Path(spec.run.url)
    pipeline = start_phase(str(written.url), run)
    pipeline.kill()
    pipeline.wait()
    print(f"slurm backend: no process of the run left {wait_gone(run):.1f} s after kill -9")
    deadline = time.monotonic() + GONE_WAIT_S
    while subprocess.run(["squeue", "-h"], capture_output=True, text=True).stdout.strip():
        assert time.monotonic() < deadline, "the SLURM job is still queued or running"
        time.sleep(1)
    saved_whole(run)
