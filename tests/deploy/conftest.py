"""A real Prefect server started as users start one (`prefect server start`, so it also serves the UI), the
deployments of prefect.yaml applied to it with tools/deploy.py, and one process worker serving the
pipeline pool's manual queue from this checkout (TANDEM_ROOT, as prefect.yaml's pull step expects)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import ROOT, free_port

STARTUP_S = 120  # a server start takes 10-20 s on an idle machine, several times that under a loaded test run


@dataclass(frozen=True)
class Server:
    """The server the deployment tests share."""

    api_url: str
    ui_url: str
    env: dict[str, str]  # environment for a client or worker of this server
    logs: Path


def _stop(process: subprocess.Popen) -> None:
    """SIGTERM the process group, SIGKILL it if it is still there after 20 s."""
    if process.poll() is not None:
        return
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)


def _wait_healthy(api_url: str, process: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + STARTUP_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"prefect server exited with {process.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"{api_url}/health", timeout=5):
                return
        except OSError:
            time.sleep(1)
    raise RuntimeError(f"prefect server not healthy after {STARTUP_S} s:\n{log.read_text()[-3000:]}")


def _spawn(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    with open(log, "ab") as out:
        return subprocess.Popen(args, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


@pytest.fixture(scope="session")
def deployed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """`prefect server start` on 127.0.0.1, prefect.yaml deployed to it, and a worker on tandem-pipeline."""
    home = tmp_path_factory.mktemp("prefect-server")
    logs = ROOT / ".tandem" / "test-deploy"
    logs.mkdir(parents=True, exist_ok=True)
    port = free_port()
    api_url = f"http://127.0.0.1:{port}/api"
    env = {key: value for key, value in os.environ.items() if not key.startswith("PREFECT_")}
    env.update(PREFECT_HOME=str(home), PREFECT_SERVER_ANALYTICS_ENABLED="false", PREFECT_API_URL=api_url,
               # Without it the UI asks the default port (4200) for its API.
               PREFECT_UI_API_URL=api_url, PREFECT_WORKER_QUERY_SECONDS="1", PREFECT_WORKER_PREFETCH_SECONDS="1",
               OMP_NUM_THREADS="1", TANDEM_ROOT=str(ROOT))
    server = _spawn([sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port", str(port)],
                    env, logs / "server.log")
    worker = None
    try:
        _wait_healthy(api_url, server, logs / "server.log")
        deploy = subprocess.run([sys.executable, "tools/deploy.py"], cwd=ROOT, env=env, capture_output=True, text=True,
                                timeout=300)
        assert deploy.returncode == 0, deploy.stdout[-3000:] + deploy.stderr[-3000:]
        # Only the manual queue: finetune/nightly's run for 02:00 UTC (on queue scheduled) must not start here.
        worker = _spawn([sys.executable, "-m", "prefect", "worker", "start", "--pool", "tandem-pipeline",
                         "--work-queue", "manual", "--name", "test-deploy-pipeline"], env, logs / "worker.log")
        yield Server(api_url, f"http://127.0.0.1:{port}", env, logs)
    finally:
        if worker is not None:
            _stop(worker)
        _stop(server)

