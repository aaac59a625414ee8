"""A small real cluster on this machine: the session's Prefect server, a process work pool, the `node`
deployment, and one process worker per node queue (node-0, node-1), each started like on a real node."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator

import pytest

from tests.conftest import ROOT
from tests.servers import PrefectServer, spawn, stop

POOL = "tandem-test-nodes"
PIPELINE_POOL = "tandem-test-pipeline"
WORKER_START_S = 120
# A worker that has run flows can sit out its whole SIGTERM grace (measured: 20 s each, 80 s of the suite's
# teardown); it holds nothing a test still needs, so it gets a short one. The fixtures are package-scoped: under
# xdist this folder runs on one worker, and its workers stop as soon as its last test is done.
WORKER_STOP_S = 2


def deploy(pool: str, entrypoint: str, name: str) -> None:
    """Create the process pool (if missing) and deploy `entrypoint` from this checkout to it."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.flows import Flow

    with get_client(sync_client=True) as client:
        client.create_work_pool(WorkPoolCreate(name=pool, type="process"), overwrite=True)
    Flow.from_source(source=str(ROOT), entrypoint=entrypoint).deploy(
        name=name, work_pool_name=pool, build=False, push=False, print_next_steps=False
    )


def start_workers(server: PrefectServer, pool: str, queues: dict[str, str | None]) -> list:
    """One `prefect worker start` per {name: queue}; returns once the server has seen every one of them poll."""
    from prefect.client.orchestration import get_client

    workers = []
    for name, queue in queues.items():
        args = [sys.executable, "-m", "prefect", "worker", "start", "--pool", pool, "--name", name]
        workers.append(
            spawn([*args, "--work-queue", queue] if queue else args, server.env, server.logs / f"worker-{name}.log")
        )
    deadline = time.monotonic() + WORKER_START_S
    with get_client(sync_client=True) as client:
        while {w.name for w in client.read_workers_for_work_pool(pool)} < set(queues):
            if time.monotonic() > deadline or any(w.poll() is not None for w in workers):
                stop(*workers)
                raise RuntimeError(f"workers {sorted(queues)} did not start; see {server.logs}/worker-*.log")
            time.sleep(0.5)
    return workers


@pytest.fixture(scope="package")
def node_workers(prefect_server: PrefectServer) -> Iterator[str]:
    """Deploy flows/node.py:node to a process pool and start one worker per node queue; yields the API URL."""
    deploy(POOL, "flows/node.py:node", "node")
    workers = start_workers(prefect_server, POOL, {f"test-node-{rank}": f"node-{rank}" for rank in (0, 1)})
    try:
        yield prefect_server.api_url
    finally:
        stop(*workers, grace_s=WORKER_STOP_S)


@pytest.fixture(scope="package")
def pipeline_worker(prefect_server: PrefectServer, node_workers: str) -> Iterator[str]:
    """The finetune flow deployed as finetune/test to a process pool, with one worker serving it."""
    deploy(PIPELINE_POOL, "flows/finetune.py:finetune", "test")
    workers = start_workers(prefect_server, PIPELINE_POOL, {"test-pipeline": None})
    try:
        yield "finetune/test"
    finally:
        stop(*workers, grace_s=WORKER_STOP_S)
