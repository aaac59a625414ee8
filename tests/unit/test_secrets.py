"""Credentials forwarded by name (launch.forward_env) to the ranks and through sbatch, reported "set"/"missing" by
preflight, and the local cluster's own auth string. Refusing them in the config is tests/unit/config/sections/
test_base.py, masking them tests/unit/core/test_redact.py; the whole pipeline with a canary value is
tests/secrets/test_canary.py (marker `secrets`)."""

from __future__ import annotations

import os
import re
import stat
import subprocess
from pathlib import Path

import pytest

from config.sections.launch import LaunchConfig
from core.errors import UserError
from launch.backends.slurm import sbatch_command
from launch.command import rank_environment
from launch.forward import check_forwarded, forward_env, forwarded_report
from tests.conftest import ROOT

CANARY = "canary-7f3a9c2e51d04b68"


def test_forward_env_reads_values_by_name_and_reports_only_set_or_missing() -> None:
    launch = LaunchConfig(forward_env=["HF_TOKEN", "AWS_SECRET_ACCESS_KEY", "EMPTY"])
    environ = {"HF_TOKEN": CANARY, "AWS_SECRET_ACCESS_KEY": "k" * 20, "EMPTY": "", "OTHER": "x"}
    assert forward_env(launch, environ) == {"HF_TOKEN": CANARY, "AWS_SECRET_ACCESS_KEY": "k" * 20}
    assert forwarded_report(launch, environ) == {"HF_TOKEN": "set", "AWS_SECRET_ACCESS_KEY": "set", "EMPTY": "missing"}
    with pytest.raises(UserError) as caught:
        check_forwarded(launch, 1, "gpu-07", environ)
    message = str(caught.value)
    assert message.startswith("node 1 (gpu-07): launch.forward_env names EMPTY, not set on this node")
    assert CANARY not in message and "\n" not in message
    both = LaunchConfig(forward_env=["HF_TOKEN"])
    assert check_forwarded(both, 0, "h", environ) == "HF_TOKEN set"
    assert check_forwarded(LaunchConfig(), 0, "h", environ) == "(launch.forward_env empty)"


def test_ranks_get_forwarded_values_and_sbatch_exports_them(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_TOKEN", CANARY)
    launch = LaunchConfig(forward_env=["HF_TOKEN"])
    assert rank_environment(launch)["HF_TOKEN"] == CANARY
    assert sbatch_command("/s/train.sbatch", launch) == ["sbatch", "--parsable", "--export=ALL", "/s/train.sbatch"]
    assert sbatch_command("/s/t", LaunchConfig()) == ["sbatch", "--parsable", "/s/t"]
    own = LaunchConfig(forward_env=["HF_TOKEN"], slurm_args=["--export=NONE"])
    assert sbatch_command("/s/t", own) == ["sbatch", "--parsable", "/s/t"]  # the user's choice stands


def cluster_env(tmp_path, host: str, **extra: str) -> tuple[subprocess.CompletedProcess, Path]:
    state = tmp_path / host
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")},
        "TANDEM_CLUSTER_HOST": host,
        "TANDEM_CLUSTER_DIR": str(state),
        **extra,
    }
    done = subprocess.run(
        ["bash", str(ROOT / "tools" / "cluster.sh"), "env"], env=env, capture_output=True, text=True, timeout=30
    )
    return done, state / "prefect-auth"


def test_the_local_cluster_off_loopback_gets_a_private_auth_string(tmp_path) -> None:
    """tools/cluster.sh (make cluster-up) bound beyond 127.0.0.1 generates the Prefect API's auth string once, into a
    file only its owner can read, and tells clients how to use it without printing it. (That such a server answers
    401 without it is tests/secrets/test_canary.py.)"""
    done, auth = cluster_env(tmp_path, "192.0.2.10")
    assert done.returncode == 0, done.stderr
    secret = auth.read_text().strip()
    assert stat.S_IMODE(auth.stat().st_mode) == 0o600 and re.fullmatch(r"tandem:[A-Za-z0-9]{24,}", secret)
    # MLflow's password file is made by `up` (with the server); `env` names it, never its content.
    assert done.stdout.splitlines() == [
        "export PREFECT_API_URL=http://192.0.2.10:4200/api MLFLOW_TRACKING_URI=http://192.0.2.10:5000",
        f'export PREFECT_API_AUTH_STRING="$(cat {auth})"',
        f'export MLFLOW_TRACKING_USERNAME=tandem MLFLOW_TRACKING_PASSWORD="$(cat {auth.parent / "mlflow-password"})"',
    ]
    again, _ = cluster_env(tmp_path, "192.0.2.10")
    assert auth.read_text().strip() == secret and secret not in again.stdout  # kept, never printed
    loopback, none = cluster_env(tmp_path, "127.0.0.1")
    assert loopback.stdout.splitlines() == [
        "export PREFECT_API_URL=http://127.0.0.1:4200/api MLFLOW_TRACKING_URI=http://127.0.0.1:5000"
    ]
    assert not none.exists()
    own, unused = cluster_env(tmp_path, "192.0.2.11", PREFECT_API_AUTH_STRING="me:mine-0123456789")
    assert not unused.exists() and "mine-0123456789" not in own.stdout
