"""The slurm backend's description (launch/backends/slurm.py): the sbatch line and the job script it submits, the
job's own environment exported in the script and launch.forward_env's values never in it; a run directory the nodes
cannot share is the same one line as at submission. The script run by real SLURM daemons is tests/slurm."""

from __future__ import annotations

import subprocess

import pytest

from config.loader import load_config
from config.sections.launch import LaunchConfig
from core.errors import UserError
from launch.backends.slurm import SlurmBackend, render_sbatch, sbatch_command, script_paths
from launch.command import rank_environment
from launch.dry_run import planned_job
from launch.job import EVAL, TRAIN, PhaseJob

CANARY = "hf_canary_value_123"


def test_the_description_is_the_sbatch_line_and_the_script_it_submits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_TOKEN", CANARY)
    cfg = load_config(
        None,
        [
            "run.storage=/shared/tandem",
            "run.name=r1",
            "launch.backend=slurm",
            "launch.nnodes=4",
            "launch.forward_env=[HF_TOKEN]",
            "launch.slurm_args=[--partition=gpu]",
        ],
    )
    job = PhaseJob(planned_job(cfg, TRAIN).written, TRAIN, env={"NCCL_DEBUG": "INFO"})
    text = SlurmBackend().describe(job)
    script, output = script_paths(job)
    assert (script, output) == (
        "/shared/tandem/runs/r1/slurm/train.sbatch",
        "/shared/tandem/runs/r1/slurm/train-%j.out",
    )
    head, shown, body = text.split("\n", 2)
    assert head == f"# launch.backend=slurm: sbatch --parsable --export=ALL {script}"  # the credential's channel
    assert shown == f"# {script}:" and body == render_sbatch(job, output=output)
    assert "export NCCL_DEBUG=INFO" in body.splitlines() and "#SBATCH --partition=gpu" in body.splitlines()
    assert CANARY not in text and "HF_TOKEN" not in body
    assert subprocess.run(["bash", "-n"], input=body, text=True).returncode == 0  # valid bash


def test_a_run_directory_the_nodes_cannot_share_is_one_line() -> None:
    cfg = load_config(None, ["run.storage=s3://bucket/tandem", "launch.backend=slurm"])
    with pytest.raises(UserError, match=r"^launch.backend=slurm needs run.storage on a shared filesystem \(NFS\)"):
        SlurmBackend().describe(planned_job(cfg, EVAL))


def test_ranks_get_forwarded_values_and_sbatch_exports_them(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_TOKEN", CANARY)
    launch = LaunchConfig(forward_env=["HF_TOKEN"])
    assert rank_environment(launch)["HF_TOKEN"] == CANARY
    assert sbatch_command("/s/train.sbatch", launch) == ["sbatch", "--parsable", "--export=ALL", "/s/train.sbatch"]
    assert sbatch_command("/s/t", LaunchConfig()) == ["sbatch", "--parsable", "/s/t"]
    own = LaunchConfig(forward_env=["HF_TOKEN"], slurm_args=["--export=NONE"])
    assert sbatch_command("/s/t", own) == ["sbatch", "--parsable", "/s/t"]  # the user's choice stands
