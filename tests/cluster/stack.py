"""A `tools/cluster.sh` stack of a test's own (its state directory and free ports): its clients' environment, runs
of finetune/manual submitted to it, what they wrote on its S3 endpoint, and its Prefect server stopped and started
again (the API's outage)."""

from __future__ import annotations

import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import boto3

from core.processes import pid_alive
from launch.command import free_port
from tests.cluster.test_cluster import cluster, pids
from tests.conftest import ROOT

# Whether this machine can run the stack (its PostgreSQL).
HAS_POSTGRES = shutil.which("initdb") is not None or bool(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
BUCKET = "tandem"


def wait_until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what} within {timeout:.0f} s"
        time.sleep(1)


class Stack:
    """One local cluster on 127.0.0.1; `up()` and `down()` around its use."""

    def __init__(self, name: str) -> None:
        self.state = ROOT / ".tandem" / f"test-cluster-{name}"  # not under /tmp: the postgres user must reach it
        shutil.rmtree(self.state, ignore_errors=True)
        self.ports = {name: free_port() for name in ("PREFECT", "PG", "S3", "MLFLOW")}
        self.env = {
            **{k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "AWS_", "MLFLOW_"))},
            **{f"TANDEM_{name}_PORT": str(port) for name, port in self.ports.items()},
            "TANDEM_CLUSTER_DIR": str(self.state),
        }
        s3_url = f"http://127.0.0.1:{self.ports['S3']}"
        credentials = {"aws_access_key_id": "tandem", "aws_secret_access_key": "tandem", "region_name": "us-east-1"}
        self.client_env = {
            **self.env,
            "PREFECT_API_URL": f"http://127.0.0.1:{self.ports['PREFECT']}/api",
            "PREFECT_HOME": str(self.state / "client"),
            "AWS_ENDPOINT_URL": s3_url,
            "AWS_ACCESS_KEY_ID": "tandem",
            "AWS_SECRET_ACCESS_KEY": "tandem",
            "AWS_DEFAULT_REGION": "us-east-1",
        }
        self.s3 = boto3.client("s3", endpoint_url=s3_url, **credentials)

    def up(self) -> None:
        """Start what is not running (the first time: everything, and deploy prefect.yaml)."""
        result = cluster("up", self.env)
        assert result.returncode == 0, result.stdout + result.stderr

    def down(self) -> None:
        result = cluster("down", self.env)
        assert result.returncode == 0, result.stdout + result.stderr

    def stop_server(self) -> None:
        """Stop the Prefect server (SIGTERM to its process group, as `down` does); everything else runs on."""
        server = pids(self.state)["server"]
        os.killpg(server, signal.SIGTERM)
        wait_until(lambda: not pid_alive(server), 60, "the Prefect server stopped")

    def submit(self, run: str, *sets: str) -> subprocess.Popen:
        """`flows.submit finetune/manual --wait` of run `run` on the prefect backend, storing on S3, with `sets`."""
        settings = ["run.storage=s3://tandem/t", f"run.name={run}", "launch.backend=prefect", *sets]
        arguments = [a for s in settings for a in ("--set", s)]
        return subprocess.Popen(
            [sys.executable, "-m", "flows.submit", "finetune/manual", "--wait", *arguments],
            cwd=ROOT,
            env=self.client_env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )

    def keys(self, run: str) -> list[str]:
        """Keys under the run's directory, relative to it."""
        prefix = f"t/runs/{run}/"
        pages = self.s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
        return [item["Key"][len(prefix) :] for page in pages for item in page.get("Contents", [])]

    def read(self, run: str, key: str) -> bytes | None:
        try:
            return self.s3.get_object(Bucket=BUCKET, Key=f"t/runs/{run}/{key}")["Body"].read()
        except self.s3.exceptions.NoSuchKey:
            return None

    def steps_logged(self, run: str) -> int:
        """Optimizer steps in the run's metrics.jsonl."""
        data = self.read(run, "metrics.jsonl") or b""
        return sum(1 for line in data.splitlines() if line.strip() and "event" not in json.loads(line))

    def complete_steps(self, run: str) -> set[str]:
        """The run's checkpoint directories that have their COMPLETE marker."""
        keys = self.keys(run)
        return {key.split("/")[1] for key in keys if key.startswith("checkpoints/") and key.endswith("/COMPLETE")}

    def node_ended(self, run: str, rank: int, phase: str) -> bool:
        """Whether node `rank` recorded the end of `phase` (its status.json)."""
        data = self.read(run, f"nodes/{rank}/status.json")
        return data is not None and json.loads(data)["phase"] == phase

    def node_flow_runs(self, run: str) -> list[dict[str, Any]]:
        """The run's node flow runs on the server: name, state, message (sorted by name)."""
        code = (
            "import json, sys\n"
            "from prefect.client.orchestration import get_client\n"
            "with get_client(sync_client=True) as c:\n"
            "    print(json.dumps([{'name': r.name, 'state': r.state.name, 'message': r.state.message}\n"
            "                      for r in c.read_flow_runs() if r.name.startswith(sys.argv[1] + '-')]))"
        )
        command = [sys.executable, "-c", code, run]
        out = subprocess.run(command, cwd=ROOT, env=self.client_env, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        return sorted(json.loads(out.stdout), key=lambda r: r["name"])


def run_processes(run: str) -> list[str]:
    """Command lines of this machine's processes that belong to the run (its spec's URL is among their arguments)."""
    found = []
    for path in glob.glob("/proc/[0-9]*/cmdline"):
        try:
            with open(path, "rb") as handle:
                line = handle.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if f"/runs/{run}/" in line and "pytest" not in line:
            found.append(line)
    return found
