"""`tools/cluster.sh` (make cluster-up / cluster-down) for real: PostgreSQL, the Prefect server, the S3
endpoint and the workers start once, a run of finetune/manual trains through the node workers and stores
on S3, and `down` leaves no process behind. Several minutes, so not in the default run: pytest -m cluster."""

from __future__ import annotations

import base64
import glob
import os
import shutil
import stat
import subprocess
import sys
import urllib.error
import urllib.request

import pytest

from core.processes import pid_alive
from launch.command import free_port
from tests.conftest import ROOT

pytestmark = pytest.mark.cluster


def cluster(command: str, env: dict[str, str], timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", "tools/cluster.sh", command], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )


def pids(state) -> dict[str, int]:
    return {path.stem: int(path.read_text()) for path in state.glob("*.pid")}


def off_loopback_address() -> str | None:
    """An IPv4 address of this machine beyond loopback (eth0's), or None."""
    if shutil.which("ip") is None:
        return None
    out = subprocess.run(["ip", "-4", "-o", "addr", "show", "scope", "global"], capture_output=True, text=True).stdout
    return next((line.split()[3].split("/")[0] for line in out.splitlines() if len(line.split()) > 3), None)


def api_status(api: str, auth: str | None = None) -> int:
    """The HTTP status of a read of the Prefect API, with or without basic auth."""
    return status_of(
        urllib.request.Request(
            f"{api}/flow_runs/filter", data=b"{}", method="POST", headers={"Content-Type": "application/json"}
        ),
        auth,
    )


def status_of(request: urllib.request.Request | str, auth: str | None = None) -> int:
    """The HTTP status of a request (a URL: a GET), with or without basic auth ("user:password")."""
    request = urllib.request.Request(request) if isinstance(request, str) else request
    if auth:
        request.add_header("Authorization", "Basic " + base64.b64encode(auth.encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


@pytest.mark.skipif(
    shutil.which("initdb") is None and not glob.glob("/usr/lib/postgresql/*/bin/initdb"),
    reason="PostgreSQL is not installed",
)
@pytest.mark.parametrize("where", ["loopback", "off-loopback"])
def test_cluster_up_runs_a_deployment_on_s3_and_down_stops_everything(where: str) -> None:
    """On 127.0.0.1, and bound to an address beyond loopback, where the Prefect API requires the auth string that
    `up` generated into a file only its owner reads: every worker and the deploy step use it (the run completes),
    a request without it gets 401."""
    host = "127.0.0.1" if where == "loopback" else off_loopback_address()
    if host is None:
        pytest.skip("this machine has no address beyond loopback")
    state = ROOT / ".tandem" / f"test-cluster-{where}"  # not under /tmp: the postgres user must reach its data
    shutil.rmtree(state, ignore_errors=True)
    ports = {
        "TANDEM_PREFECT_PORT": free_port(),
        "TANDEM_PG_PORT": free_port(),
        "TANDEM_S3_PORT": free_port(),
        "TANDEM_MLFLOW_PORT": free_port(),
    }
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "AWS_", "MLFLOW_"))},
        **{k: str(v) for k, v in ports.items()},
        "TANDEM_CLUSTER_DIR": str(state),
        "TANDEM_CLUSTER_HOST": host,
    }
    started: dict[str, int] = {}
    try:
        up = cluster("up", env)
        assert up.returncode == 0, up.stdout + up.stderr
        api = f"http://{host}:{ports['TANDEM_PREFECT_PORT']}/api"
        assert f"export PREFECT_API_URL={api}" in up.stdout
        started = pids(state)
        assert set(started) == {"server", "s3", "mlflow", "worker-pipeline", "worker-node-0", "worker-node-1"}
        again = cluster("up", env)
        assert again.returncode == 0, again.stdout + again.stderr
        assert pids(state) == started and "already running" in again.stdout  # nothing started twice

        auth_file = state / "prefect-auth"
        mlflow_uri = f"http://{host}:{ports['TANDEM_MLFLOW_PORT']}"
        mlflow_api = f"{mlflow_uri}/api/2.0/mlflow/experiments/search?max_results=1"
        auth, mlflow_auth = {}, {}
        if where == "loopback":
            assert not auth_file.exists() and api_status(api) == 200
            assert status_of(mlflow_api) == 200
        else:
            password = (state / "mlflow-password").read_text().strip()
            assert stat.S_IMODE((state / "mlflow-password").stat().st_mode) == 0o600 and password not in up.stdout
            assert (status_of(mlflow_api), status_of(mlflow_api, f"tandem:{password}")) == (401, 200)
            mlflow_auth = {"MLFLOW_TRACKING_USERNAME": "tandem", "MLFLOW_TRACKING_PASSWORD": password}
            secret = auth_file.read_text().strip()
            assert stat.S_IMODE(auth_file.stat().st_mode) == 0o600
            assert f'export PREFECT_API_AUTH_STRING="$(cat {auth_file})"' in up.stdout and secret not in up.stdout
            assert (api_status(api), api_status(api, "tandem:wrong"), api_status(api, secret)) == (401, 401, 200)
            auth = {"PREFECT_API_AUTH_STRING": secret}
        run_env = {
            **env,
            "PREFECT_API_URL": api,
            "PREFECT_HOME": str(state / "client"),
            **auth,
            "AWS_ENDPOINT_URL": f"http://{host}:{ports['TANDEM_S3_PORT']}",
            "AWS_ACCESS_KEY_ID": "tandem",
            "AWS_SECRET_ACCESS_KEY": "tandem",
            "AWS_DEFAULT_REGION": "us-east-1",
        }
        submitted = subprocess.run(
            [
                sys.executable,
                "-m",
                "flows.submit",
                "finetune/manual",
                "--wait",
                "--set",
                "run.storage=s3://tandem/t",
                "--set",
                "run.name=cluster",
                "--set",
                "launch.backend=prefect",
                "--set",
                f"launch.master_port={free_port()}",
                "--set",
                "train.max_steps=4",
                "--set",
                "train.save_steps=4",
            ],
            cwd=ROOT,
            env=run_env,
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert submitted.returncode == 0, submitted.stdout + submitted.stderr
        assert "Completed (registered tandem-tiny v0001" in submitted.stdout
        listing = subprocess.run(
            [
                sys.executable,
                "-c",
                "import boto3; print(boto3.client('s3').get_object("
                "Bucket='tandem', Key='t/runs/cluster/eval.json')['Body'].read().decode())",
            ],
            env=run_env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert '"tandem.eval/1"' in listing.stdout, listing.stderr
        # The pipeline worker tracked the run in the cluster's MLflow (MLFLOW_TRACKING_URI) and mirrored the model.
        mirrored = subprocess.run(
            [
                sys.executable,
                "-c",
                "from mlflow import MlflowClient; import sys; c = MlflowClient(sys.argv[1]); "
                "r = c.search_runs([c.get_experiment_by_name('tandem').experiment_id])[0]; "
                "print(r.info.run_name, r.data.metrics['eval/loss'] > 0, "
                "c.get_model_version_by_alias('tandem-tiny', 'champion').version)",
                mlflow_uri,
            ],
            env={**run_env, **mlflow_auth},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert mirrored.stdout.split() == ["cluster", "True", "1"], mirrored.stdout + mirrored.stderr
    finally:
        down = cluster("down", env)
    assert down.returncode == 0, down.stdout + down.stderr
    assert not pids(state)
    assert not [name for name, pid in started.items() if pid_alive(pid)]
    assert "postgres: stopped" in cluster("status", env).stdout
