"""A Prefect server started as users start one (`prefect server start`, so it also serves the UI), the
deployments of prefect.yaml applied to it with tools/deploy.py, and one process worker serving the pipeline
pool's manual queue from this checkout (TANDEM_ROOT, as prefect.yaml's pull step expects)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest

from launch.command import free_port
from tests.conftest import ROOT
from tests.servers import PrefectServer, spawn, start_prefect_server, stop


@pytest.fixture(scope="package")  # stopped as soon as this folder's last test is done
def deployed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrefectServer]:
    """`prefect server start` on 127.0.0.1, prefect.yaml deployed to it, and a worker on tandem-pipeline."""
    server, process = start_prefect_server(
        tmp_path_factory.mktemp("prefect-server"), ROOT / ".tandem" / "test-deploy", free_port()
    )
    worker = None
    try:
        deploy = subprocess.run(
            [sys.executable, "tools/deploy.py"], cwd=ROOT, env=server.env, capture_output=True, text=True, timeout=300
        )
        assert deploy.returncode == 0, deploy.stdout[-3000:] + deploy.stderr[-3000:]
        # Only the manual queue: finetune/nightly's run for 02:00 UTC (on queue scheduled) must not start here.
        worker = spawn(
            [
                sys.executable,
                "-m",
                "prefect",
                "worker",
                "start",
                "--pool",
                "tandem-pipeline",
                "--work-queue",
                "manual",
                "--name",
                "test-deploy-pipeline",
            ],
            server.env,
            server.logs / "worker.log",
        )
        yield server
    finally:
        if worker is not None:
            stop(worker, grace_s=2)  # before its server: a worker whose server is gone retries until killed
        stop(process, grace_s=5)  # a test server: nothing in it outlives the session
