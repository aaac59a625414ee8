"""A small real cluster on this machine: the Prefect test server, a process work pool, the `node`
deployment, and one process worker per node queue (node-0, node-1), each started like on a real node."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from tests.conftest import ROOT

POOL = "tandem-test-nodes"


def worker_env(api_url: str) -> dict[str, str]:
    return {**os.environ, "PREFECT_API_URL": api_url, "PREFECT_WORKER_QUERY_SECONDS": "1",
            "PREFECT_WORKER_PREFETCH_SECONDS": "1", "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="session")
def node_workers(prefect_server) -> Iterator[str]:
    """Deploy flows/node.py:node to a process pool and start one worker per node queue; yields the API URL."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.flows import Flow
    from prefect.settings import PREFECT_API_URL

    api_url = PREFECT_API_URL.value()
    with get_client(sync_client=True) as client:
        client.create_work_pool(WorkPoolCreate(name=POOL, type="process"), overwrite=True)
    node = Flow.from_source(source=str(ROOT), entrypoint="flows/node.py:node")
    node.deploy(name="node", work_pool_name=POOL, build=False, push=False, print_next_steps=False)
    workers = []
    for rank in (0, 1):
        log = open(ROOT / ".tandem" / f"test-worker-{rank}.log", "ab")  # noqa: SIM115 - lives with the worker
        workers.append(subprocess.Popen(
            [sys.executable, "-m", "prefect", "worker", "start", "--pool", POOL, "--work-queue", f"node-{rank}",
             "--name", f"test-node-{rank}"],
            cwd=ROOT, env=worker_env(api_url), stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
    time.sleep(3)
    try:
        yield api_url
    finally:
        for worker in workers:
            os.killpg(worker.pid, signal.SIGTERM)
        for worker in workers:
            try:
                worker.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(worker.pid, signal.SIGKILL)


PIPELINE_POOL = "tandem-test-pipeline"


@pytest.fixture(scope="session")
def pipeline_worker(node_workers) -> Iterator[str]:
    """The finetune flow deployed as finetune/test to a process pool, with one worker serving it."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.flows import Flow

    api_url = node_workers
    with get_client(sync_client=True) as client:
        client.create_work_pool(WorkPoolCreate(name=PIPELINE_POOL, type="process"), overwrite=True)
    pipeline = Flow.from_source(source=str(ROOT), entrypoint="flows/finetune.py:finetune")
    pipeline.deploy(name="test", work_pool_name=PIPELINE_POOL, build=False, push=False, print_next_steps=False)
    log = open(ROOT / ".tandem" / "test-pipeline-worker.log", "ab")  # noqa: SIM115 - lives with the worker
    worker = subprocess.Popen([sys.executable, "-m", "prefect", "worker", "start", "--pool", PIPELINE_POOL,
                               "--name", "test-pipeline"], cwd=ROOT, env=worker_env(api_url), stdout=log,
                              stderr=subprocess.STDOUT, start_new_session=True)
    time.sleep(3)
    try:
        yield "finetune/test"
    finally:
        os.killpg(worker.pid, signal.SIGTERM)
        try:
            worker.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(worker.pid, signal.SIGKILL)
