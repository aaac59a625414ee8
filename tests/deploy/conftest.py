"""The deployments of prefect.yaml applied with tools/deploy.py to the session's Prefect server (a
`prefect server start`, which also serves the UI), and one process worker serving the pipeline pool's manual
queue from this checkout (TANDEM_ROOT, as prefect.yaml's pull step expects)."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from collections.abc import Iterator

import pytest

from tests.conftest import ROOT
from tests.servers import PrefectServer, spawn, stop


@pytest.fixture(scope="session")
def deployed(prefect_server: PrefectServer) -> Iterator[PrefectServer]:
    """prefect.yaml deployed to the session's server, and a worker on tandem-pipeline's manual queue."""
    server = dataclasses.replace(prefect_server, logs=prefect_server.logs / "deploy")
    server.logs.mkdir(parents=True, exist_ok=True)
    deploy = subprocess.run([sys.executable, "tools/deploy.py"], cwd=ROOT, env=server.env, capture_output=True,
                            text=True, timeout=300)
    assert deploy.returncode == 0, deploy.stdout[-3000:] + deploy.stderr[-3000:]
    # Only the manual queue: finetune/nightly's run for 02:00 UTC (on queue scheduled) must not start here.
    worker = spawn([sys.executable, "-m", "prefect", "worker", "start", "--pool", "tandem-pipeline",
                    "--work-queue", "manual", "--name", "test-deploy-pipeline"], server.env, server.logs / "worker.log")
    try:
        yield server
    finally:
        stop(worker)
