"""The local cluster script (tools/cluster.sh, `make cluster-up`) and its own auth string: generated once beyond
loopback, readable by its owner only, never printed. Forwarded credentials are tests/unit/launch/test_forward.py, the
whole pipeline with a canary value tests/secrets/test_canary.py (marker `secrets`)."""

from __future__ import annotations

import os
import re
import stat
import subprocess
from pathlib import Path

from tests.conftest import ROOT


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
