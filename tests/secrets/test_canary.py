"""A canary credential through the real entry points: `python -m flows.finetune` on the local backend and on the
prefect backend (real process workers, one per node queue), against a real `prefect server start` that requires
basic auth, as the local cluster does off loopback. The canary is forwarded by name (launch.forward_env): the local
run takes it from the pipeline's environment, the workers run from the node workers' own (the pipeline of that run
does not have it). Every rank writes the canary's sha256 (not the value) to its node's directory, proving the value
arrived. A second canary, tried in launch.env and in run.storage_options, is refused without being echoed.
Afterwards no canary, and not the server's auth string, is in any file under the storage root or PREFECT_HOME (the
SQLite database included), in any process's output (the CLIs', the server's, the workers', the nodes' logs), in a
rendered sbatch script or the kubernetes backend's objects, or in what the Prefect API serves: logs, flow-run
parameters, artifacts, variables. Several minutes, so not in the default run: `make test-suites` (marker `secrets`)."""

from __future__ import annotations

import base64
import hashlib
import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest

from launch.command import free_port
from storage.location import Location
from tests.conftest import ROOT
from tests.flows.conftest import deploy, start_workers
from tests.servers import PrefectServer, start_prefect_server, stop

pytestmark = pytest.mark.secrets

NAME = "TANDEM_CANARY"
POOL = "tandem-secrets-nodes"
LOG_WAIT_S = 60


@dataclass
class World:
    """Everything the runs left: where they wrote, what each process printed, what the API serves."""

    root: Path
    storage: Path
    home: Path
    server: PrefectServer
    canary: str
    refused: str
    auth: str
    outputs: dict[str, subprocess.CompletedProcess] = field(default_factory=dict)
    api: dict[str, list] = field(default_factory=dict)


def finetune(env: dict[str, str], *overrides: str, extra: list[str] | None = None) -> subprocess.CompletedProcess:
    args = [sys.executable, "-m", "flows.finetune", *(extra or [])] + [arg for o in overrides for arg in ("--set", o)]
    return subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def api_contents() -> dict[str, list]:
    """Everything the Prefect API serves about the runs, as JSON-ready dicts."""
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        logs, offset = [], 0
        while batch := client.read_logs(limit=200, offset=offset):
            logs += batch
            offset += len(batch)
        return {
            "logs": [log.model_dump(mode="json") for log in logs],
            "flow_runs": [run.model_dump(mode="json") for run in client.read_flow_runs(limit=200)],
            "artifacts": [a.model_dump(mode="json") for a in client.read_artifacts(limit=200)],
            "variables": [v.model_dump(mode="json") for v in client.read_variables()],
        }


def node_preflight_logs(api: dict[str, list]) -> list[str]:
    return [log["message"] for log in api["logs"] if "preflight ok" in log["message"]]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory, tiny_model: str) -> Iterator[World]:
    """The server, the node workers and every run of this module, made once; the API read while it is up."""
    from prefect.settings import PREFECT_API_AUTH_STRING, PREFECT_API_URL, temporary_settings

    root = tmp_path_factory.mktemp("canary")
    home, storage = root / "prefect-home", root / "storage"
    home.mkdir()
    auth = f"tandem:{uuid.uuid4().hex}"
    server, process = start_prefect_server(home, root / "logs", free_port(), auth=auth)
    world = World(root, storage, home, server, f"canary-{uuid.uuid4().hex}", f"refused-{uuid.uuid4().hex}", auth)
    try:
        with temporary_settings({PREFECT_API_URL: server.api_url, PREFECT_API_AUTH_STRING: auth}):
            deploy(POOL, "flows/node.py:node", "node")
            # The prefect backend's channel: the node workers' own environment.
            workers = start_workers(
                replace(server, env={**server.env, NAME: world.canary}),
                POOL,
                {f"canary-node-{rank}": f"node-{rank}" for rank in (0, 1)},
            )
            try:
                run_everything(world, tiny_model)
                world.api = api_contents()
                deadline = time.monotonic() + LOG_WAIT_S  # the nodes' logs reach the API in batches
                while len(node_preflight_logs(world.api)) < 2 and time.monotonic() < deadline:
                    time.sleep(1)
                    world.api = api_contents()
                yield world
            finally:
                stop(*workers, grace_s=2)
    finally:
        stop(process)


def run_everything(world: World, tiny_model: str) -> None:
    common = [
        f"run.storage={world.storage}",
        f"model.name_or_path={tiny_model}",
        "train.max_steps=4",
        "train.save_steps=4",
        "launch.rdzv_timeout=60",
        f"launch.forward_env=[{NAME}]",
        f"launch.env={{TANDEM_TEST_ENV_DIGEST: {NAME}}}",
    ]
    with_canary = {**world.server.env, NAME: world.canary}
    world.outputs["local"] = finetune(with_canary, *common, "run.name=canary-local")
    world.outputs["workers"] = finetune(
        world.server.env,
        *common,
        "run.name=canary-workers",
        "launch.backend=prefect",
        f"launch.master_port={free_port()}",
    )
    world.outputs["missing"] = finetune(
        with_canary, *common, "run.name=canary-missing", f"launch.forward_env=[{NAME}, TANDEM_ABSENT]"
    )
    world.outputs["manifests"] = finetune(  # the kubernetes backend's objects, printed as they would be submitted
        with_canary,
        *common,
        "launch.backend=kubernetes",
        "launch.kubernetes.image=registry.example/tandem:test",
        "launch.kubernetes.secret=tandem-creds",
        "launch.kubernetes.pvc=shared",
        f"launch.kubernetes.pvc_path={world.storage}",
        extra=["--dry-run"],
    )
    world.outputs["refused"] = finetune(  # one CLI start for both: the loader reports every refused key at once
        with_canary,
        *common,
        f"launch.env={{HF_TOKEN: {world.refused}}}",
        f"run.storage_options={{endpoint_url: 'http://127.0.0.1:9', secret: {world.refused}}}",
    )


def test_ranks_receive_the_forwarded_value_on_both_backends(world: World) -> None:
    for name in ("local", "workers"):
        done = world.outputs[name]
        assert done.returncode == 0, f"{name}:\n{done.stdout}\n{done.stderr}"
        assert "registered" in done.stdout and "tandem-tiny v000" in done.stdout
        run = world.storage / "runs" / f"canary-{name}"
        digest = hashlib.sha256(world.canary.encode()).hexdigest()
        for node, rank in ((0, 0), (1, 1)):
            assert (run / "nodes" / str(node) / f"env-digest-rank-{rank:05d}.txt").read_text() == digest, (name, rank)
            preflight = json.loads((run / "nodes" / str(node) / "preflight.json").read_text())
            assert preflight["checks"]["forwarded environment"] == f"{NAME} set"
        spec = json.loads((run / "spec.json").read_text())
        assert spec["config"]["launch"]["forward_env"] == [NAME]  # the name travels, the value does not
    preflights = node_preflight_logs(world.api)
    assert len(preflights) >= 2 and all(f"forwarded environment: {NAME} set" in line for line in preflights)


def test_a_name_missing_on_the_nodes_is_one_line_before_training(world: World) -> None:
    done = world.outputs["missing"]
    assert done.returncode == 2, done.stdout + done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert (
        errors
        and errors[0].startswith("error: node 0 (")
        and "launch.forward_env names TANDEM_ABSENT, not set" in errors[0]
    ), done.stderr
    assert not (world.storage / "runs" / "canary-missing" / "checkpoints").exists()  # stopped before training


def test_a_credential_in_the_config_is_refused_without_echoing_it(world: World) -> None:
    done = world.outputs["refused"]
    assert done.returncode == 2
    assert done.stderr.startswith("error: ") and len(done.stderr.strip().splitlines()) == 1, done.stderr
    for key in ("launch.env.HF_TOKEN", "run.storage_options.secret"):
        assert f"{key} looks like a credential" in done.stderr
    assert sorted(p.name for p in (world.storage / "runs").iterdir()) == [  # the refused run made nothing
        "canary-local",
        "canary-missing",
        "canary-workers",
    ]


def test_the_kubernetes_objects_name_the_secret_never_the_value(world: World) -> None:
    """The rendered objects (printed by --dry-run, what the backend submits) take the forwarded name from the
    Secret; test_no_canary_anywhere checks that output with the others."""
    done = world.outputs["manifests"]
    assert done.returncode == 0, done.stderr
    assert f"key: {NAME}" in done.stdout and "name: tandem-creds" in done.stdout and "secretKeyRef" in done.stdout


def test_no_canary_anywhere(world: World) -> None:
    """Files (storage, PREFECT_HOME with the database, every process's log), the CLIs' output, a rendered sbatch
    script and the API: none holds either canary or the auth string."""
    needles = {world.canary, world.refused, world.auth}
    files = [path for path in world.root.rglob("*") if path.is_file() and not path.is_symlink()]
    digest = hashlib.sha256(world.canary.encode()).hexdigest()
    # The scan finds what is there: the digest the ranks wrote, in exactly the files they wrote it to.
    assert {p.name for p in files if digest.encode() in p.read_bytes()} == {
        "env-digest-rank-00000.txt",
        "env-digest-rank-00001.txt",
    }
    names = {path.name for path in files}
    # The scan covers what matters: the database, spec.json, the nodes' logs and status, the workers' logs.
    assert {
        "prefect.db",
        "spec.json",
        "log.txt",
        "status.json",
        "preflight.json",
        "worker-canary-node-1.log",
        "server.log",
        "model_card.md",
        "v0001.json",
    } <= names
    database = (world.home / "prefect.db").read_bytes()
    assert b"canary-workers-train-node1" in database  # what a leak would sit next to is really in it
    leaks = [f"{path}: {needle}" for path in files for needle in needles if needle.encode() in path.read_bytes()]
    assert not leaks
    for name, done in world.outputs.items():
        assert not [n for n in needles if n in done.stdout + done.stderr], name
    assert world.api["logs"] and world.api["flow_runs"] and world.api["artifacts"]
    served = json.dumps(world.api)
    assert "canary-local" in served and f'"forward_env": ["{NAME}"]' in served
    assert not [n for n in needles if n in served]
    assert world.canary not in rendered_sbatch(world)


def rendered_sbatch(world: World) -> str:
    """The slurm backend's script for the local run's spec, rendered with the canary in this process's environment."""
    import os

    from launch.backends.slurm import render_sbatch, sbatch_command
    from launch.job import TRAIN, PhaseJob
    from storage.spec import WrittenSpec, load_spec

    url = Location(str(world.storage / "runs" / "canary-local" / "spec.json"))
    spec, digest = load_spec(url)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(NAME, world.canary)
        script = render_sbatch(PhaseJob(WrittenSpec(spec, url, digest), TRAIN), output="/x/%j.out")
        assert "--export=ALL" in sbatch_command("/x/train.sbatch", spec.config.launch)
        assert os.environ[NAME] == world.canary
    return script


def test_the_api_refuses_requests_without_the_auth_string(world: World) -> None:
    """Prefect's basic auth as the cluster uses it: 401 without the string or with a wrong one; /health stays open."""

    def status(path: str, auth: str | None, method: str = "POST") -> int:
        request = urllib.request.Request(
            f"{world.server.api_url}/{path}",
            method=method,
            data=b"{}" if method == "POST" else None,
            headers={"Content-Type": "application/json"},
        )
        if auth:
            request.add_header("Authorization", "Basic " + base64.b64encode(auth.encode()).decode())
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status
        except urllib.error.HTTPError as exc:
            return exc.code

    assert status("flow_runs/filter", None) == 401
    assert status("flow_runs/filter", "tandem:wrong") == 401
    assert status("flow_runs/filter", world.auth) == 200
    assert status("health", None, "GET") == 200
