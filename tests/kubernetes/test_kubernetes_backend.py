"""launch.backend=kubernetes, run for real up to the cluster: the official client submits, follows and deletes the
objects through HTTP, and every pod's container runs as rendered (launch.node, torchrun and the ranks, real storage).

Mocked, because no Kubernetes API server or container runtime can run here: the API server and the kubelet are
tests/kubernetes/fake_cluster.py, which answers the client's calls, runs each pod's command with the environment the
Job controller or Kubeflow Trainer would inject, and resolves the pods' DNS names through a hosts file of each pod's
own. Scheduling, images, resource limits and the controllers' other work are not exercised (docs/kubernetes.md lists
what was and was not verified)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prefect.client.orchestration import get_client

from config.loader import load_config
from core.checkout import PROJECT_ROOT
from core.errors import RetryableError, TooFewNodes, UserError
from launch.backends import kubernetes_api
from launch.command import free_port
from launch.job import PROBE, TRAIN
from launch.phase import run_phase
from pipeline.plan import build_spec, record_model
from storage import layout
from storage.checkpoints import latest_complete
from storage.location import Location, join
from storage.spec import WrittenSpec, write_spec
from tasks.train import train_attempts
from tests.distributed.harness import Staged, config
from tests.flows.test_orphans import GONE_WAIT_S, saved_whole, start_phase, wait_gone
from tests.kubernetes.fake_cluster import FakeCluster, fake_cluster
from tests.servers import PrefectServer, spawn

pytestmark = pytest.mark.kubernetes

CANARY_NAME = "TANDEM_K8S_CANARY"
# Prefect's kubernetes worker, started as on a real cluster's worker node; its observer setting (see the test).
WORKER = [sys.executable, "-m", "prefect", "worker", "start", "--name", "test-kubernetes"]
OBSERVER = "PREFECT_INTEGRATIONS_KUBERNETES_OBSERVER_ENABLED"
RUN_TIMEOUT_S = 600
CANARY = "canary-7f3e9a1c0b"


def pod_settings(storage: Path | str) -> list[str]:
    """A 2-node kubernetes launch whose pods run this checkout's Python, storage on a claim mounted at its path."""
    return [
        "launch.backend=kubernetes",
        "launch.nnodes=2",
        "launch.nproc_per_node=1",
        f"launch.master_port={free_port()}",
        "launch.kubernetes.image=registry.example/tandem:test",
        f"launch.kubernetes.python={sys.executable}",
        f"launch.kubernetes.checkout={PROJECT_ROOT}",
        "launch.kubernetes.gpu_resource=null",
        "launch.kubernetes.pvc=shared",
        f"launch.kubernetes.pvc_path={storage}",
        "launch.kubernetes.schedule_timeout_s=60",
    ]


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[FakeCluster]:
    with fake_cluster(tmp_path / "cluster") as found:
        found.secrets[("default", "tandem-creds")] = {CANARY_NAME: CANARY}
        yield found


def written(staged: Staged, name: str, overrides: list[str]) -> WrittenSpec:
    cfg = config(staged, name, [*pod_settings(staged.storage), *overrides])
    digest = record_model(cfg, name, staged.model_path)
    spec = build_spec(cfg, name, staged.model_path, staged.dataset, digest)
    return WrittenSpec(spec, join(spec.run, layout.SPEC), write_spec(spec))


def test_a_prefect_kubernetes_worker_runs_the_pipeline_in_a_pod_and_its_nodes_as_pods_of_their_own(
    cluster: FakeCluster, prefect_server: PrefectServer, tmp_path: Path, tiny_model: str
) -> None:
    """finetune/kubernetes as users deploy it (tools/deploy.py: the pool of deploy/kubernetes/pipeline-pool.json),
    served by Prefect's own kubernetes worker (prefect-kubernetes; its observer, a kopf operator that watches the
    cluster, is off: the stand-in serves no watches, and the flow run's state comes from the pod's own engine). The
    worker renders the pipeline's Job from the pool's template and creates it; the pipeline runs in that Job's pod
    (the image's entrypoint, `prefect flow-run execute`), finds the cluster through the service account mounted in
    it, as in a real cluster, and runs its train and eval phases as indexed Jobs of its own, owned by its pod."""
    storage = tmp_path / "pvc"
    cfg = load_config(
        None,
        [
            f"run.storage={storage}",
            "run.name=via-kubernetes",
            f"model.name_or_path={tiny_model}",
            *pod_settings(storage),
            f"launch.forward_env=[{CANARY_NAME}]",
            "launch.kubernetes.secret=tandem-creds",
            "train.max_steps=4",
            "train.save_steps=2",
        ],
    )
    deploy = subprocess.run(
        [sys.executable, "tools/deploy.py", "--name", "finetune/kubernetes"],
        cwd=PROJECT_ROOT,
        env=prefect_server.env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert deploy.returncode == 0, deploy.stdout[-3000:] + deploy.stderr[-3000:]
    with get_client(sync_client=True) as client:
        deployment = client.read_deployment_by_name("finetune/kubernetes")
        # The pipeline's own credential: in its pod's environment (a real deployment would take it from a Secret).
        run = client.create_flow_run_from_deployment(
            deployment.id,
            parameters={"config": cfg.model_dump(mode="json")},
            job_variables={"env": {CANARY_NAME: CANARY}},
        )
    worker_env = {**prefect_server.env, "KUBECONFIG": os.environ["KUBECONFIG"], OBSERVER: "false"}
    worker_log = prefect_server.logs / "worker-kubernetes.log"
    worker = spawn([*WORKER, "--pool", "tandem-kubernetes", "--run-once"], worker_env, worker_log)
    assert worker.wait(timeout=180) == 0, worker_log.read_text()[-3000:]
    state = final_state(run.id)
    pipeline = next(pod for pod in cluster.pods.values() if "prefect.io/flow-run-id" in pod.labels)
    assert state.is_completed(), f"{state.name}: {state.message}\n{pipeline.log.read_text()[-3000:]}"
    assert state.message == "registered tandem-tiny v0001 (champion)"
    job = next(body for body in cluster.received if "prefect.io/flow-run-id" in body["metadata"]["labels"])
    spec = job["spec"]["template"]["spec"]  # the pool's template, as the worker rendered it
    assert (spec["serviceAccountName"], spec["containers"][0]["image"]) == (
        "tandem-pipeline",
        "registry.example/tandem:latest",
    )
    nodes = [body for body in cluster.received if body["metadata"]["labels"].get("app.kubernetes.io/name") == "tandem"]
    assert sorted(body["kind"] for body in nodes) == ["Job", "Job", "Service", "Service"]  # train and eval
    owner = [{"apiVersion": "v1", "kind": "Pod", "name": pipeline.name, "uid": pipeline.uid}]
    assert all(body["metadata"]["ownerReferences"] == owner for body in nodes)  # found from inside its pod
    assert CANARY not in json.dumps(nodes)  # the nodes read it from the Secret; no object of theirs holds it
    assert latest_complete(Location(str(storage / "runs" / "via-kubernetes"))).step == 4
    assert pipeline.process is not None and pipeline.process.wait(timeout=60) == 0  # the engine's exit ends its pod
    assert cluster.alive() == []
    assert [key[0] for key in cluster.objects] == ["Job"]  # the pipeline's own, kept for finished_job_ttl


def final_state(flow_run_id: Any) -> Any:
    """The flow run's state once final (or as it stands after RUN_TIMEOUT_S)."""
    deadline = time.monotonic() + RUN_TIMEOUT_S
    with get_client(sync_client=True) as client:
        while not (state := client.read_flow_run(flow_run_id).state).is_final() and time.monotonic() < deadline:
            time.sleep(2)
    return state


def test_a_trainjobs_pods_take_their_place_from_the_trainer_variables(cluster: FakeCluster, staged: Staged) -> None:
    job = written(staged, "k8s-trainjob", ["launch.kubernetes.runtime=torch-distributed"])
    lines: list[str] = []
    run_phase(job, PROBE, lines.append)
    assert [what.split()[0] for method, what in cluster.requests if method == "POST"] == ["TrainJob"]
    logs = "".join(path.read_text() for path in cluster.root.glob("*.log"))
    assert "node 0/2: probe started" in logs and "node 1/2: probe started" in logs
    assert "rendezvous tandem-k8s-trainjob-probe-" in logs and "-node-0-0.tandem-k8s-trainjob-probe-" in logs
    assert cluster.alive() == [] and cluster.objects == {}


def test_a_failing_rank_is_its_nodes_error_line_with_its_exit_class(
    cluster: FakeCluster, staged: Staged, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pipeline runs in a pod of the namespace here (its service account's namespace file, its hostname): the
    phase's objects name that pod as their owner."""
    account = tmp_path / "serviceaccount"
    account.mkdir()
    (account / "namespace").write_text("default\n")
    monkeypatch.setattr(kubernetes_api, "SERVICE_ACCOUNT", account)
    monkeypatch.setenv("HOSTNAME", "pipeline-7xk2p")
    owner = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "pipeline-7xk2p", "uid": "5f1c-uid"}}
    cluster.objects[("Pod", "default", "pipeline-7xk2p")] = owner
    job = written(staged, "k8s-fail", ["train.max_steps=8", "launch.env={TANDEM_TEST_EXIT_AT_STEP: '1:3'}"])
    with pytest.raises(RetryableError) as info:
        run_phase(job, TRAIN, lambda _: None)
    message = str(info.value)
    assert message.startswith("train: ") and "rank 1 exited with code 137" in message, message
    assert "(pod tandem-k8s-fail-train-" in message and "\n" not in message
    del cluster.objects[("Pod", "default", "pipeline-7xk2p")]
    assert cluster.alive() == [] and cluster.objects == {}
    assert [(body["kind"], body["metadata"]["ownerReferences"]) for body in cluster.received] == [
        (kind, [{"apiVersion": "v1", "kind": "Pod", "name": "pipeline-7xk2p", "uid": "5f1c-uid"}])
        for kind in ("Service", "Job")
    ]


def test_an_elastic_run_starts_again_on_the_pods_the_cluster_can_place(cluster: FakeCluster, staged: Staged) -> None:
    """Room for one pod of two: the first attempt's second pod stays unschedulable, and once
    launch.kubernetes.schedule_timeout_s passes the run starts again on one node (the same task, not a retry),
    records why, and trains to its last step with the same global batch."""
    cluster.capacity = 1
    elastic = [
        "launch.min_nnodes=1",
        "train.global_batch_size=8",
        "train.max_steps=4",
        "launch.kubernetes.schedule_timeout_s=6",
    ]
    job = written(staged, "k8s-elastic", elastic)
    lines: list[str] = []
    finished = train_attempts(job, lines.append)
    first, second = finished.spec.attempts
    assert (first.nodes, first.world_size, second.nodes, second.world_size) == ([0, 1], 2, [0], 1)
    why = second.left_out["1"]
    assert why.startswith("train: not every pod runs after 6 s (pod tandem-k8s-elastic-train-") and (
        "0/1 nodes are available: 1 Insufficient nvidia.com/gpu" in why
    ), why
    assert any("the elastic run starts again on the 1 node(s) the cluster can place" in line for line in lines)
    assert finished.spec.config.accumulation_steps(1) == 4  # 8 rows = 2 x 4 x 1 rank (2 x 2 x 2 ranks before)
    assert latest_complete(finished.spec.run).step == 4
    jobs = [body["spec"]["completions"] for body in cluster.received if body["kind"] == "Job"]
    assert jobs == [2, 1]
    assert cluster.alive() == [] and cluster.objects == {}


def test_a_queue_that_admits_nothing_is_one_node_fewer_and_below_the_minimum_one_line(
    cluster: FakeCluster, staged: Staged
) -> None:
    """Kueue admits all of a job's pods or none: a job that does not fit gets no pod, the timeout names the queue,
    and the node count to try next is one fewer; the elastic loop stops at launch.min_nnodes with the same line."""
    cluster.capacity = 1
    settings = [
        "launch.kubernetes.queue=gpus",
        "launch.kubernetes.schedule_timeout_s=3",
        "launch.min_nnodes=2",
        "launch.max_nnodes=3",
        "train.global_batch_size=12",
    ]
    job = written(staged, "k8s-queue", settings)
    with pytest.raises(TooFewNodes) as info:
        run_phase(job, PROBE, lambda _: None)
    assert info.value.nodes == 1 and str(info.value) == (
        "probe: not every pod runs after 3 s (queue gpus admitted none of the 2 pods); free the nodes or raise "
        "launch.kubernetes.schedule_timeout_s"
    )
    with pytest.raises(TooFewNodes, match=r"^train: not every pod runs after 3 s \(queue gpus admitted none"):
        train_attempts(job, lambda _: None)  # 1 < launch.min_nnodes=2: the line as it is, to retry later
    assert cluster.pods == {} and cluster.objects == {}


def test_an_image_that_cannot_be_pulled_is_one_line_and_nothing_is_left(cluster: FakeCluster, staged: Staged) -> None:
    cluster.unpullable.add("registry.example/tandem:missing")
    job = written(staged, "k8s-image", ["launch.kubernetes.image=registry.example/tandem:missing"])
    with pytest.raises(UserError) as info:
        run_phase(job, TRAIN, lambda _: None)
    assert str(info.value).startswith("pod tandem-k8s-image-train-")
    assert "image 'registry.example/tandem:missing' cannot be pulled (ErrImagePull" in str(info.value)
    assert "fix launch.kubernetes.image" in str(info.value)
    assert cluster.objects == {}


def test_kill_9_of_the_pipeline_stops_every_pod(cluster: FakeCluster, staged: Staged) -> None:
    """The pipeline killed outright while its pods train: each pod's node sees the pipeline's liveness record go
    stale and stops after its ranks saved, so no pod keeps its GPUs. The Job and Service stay on the cluster (nothing
    is left to delete them: no owner reference yet, docs/kubernetes.md); the rerun's objects have names of their
    own."""
    settings = ["train.max_steps=400", "train.save_steps=1000", "launch.checkpoint_on_cancel=true"]
    job = written(staged, "k8s-orphan", settings)
    run = Path(job.spec.run.url)
    pipeline = start_phase(str(job.url), run)
    assert cluster.alive(), "no pod runs"
    pipeline.kill()
    pipeline.wait()
    print(f"kubernetes backend: no process of the run left {wait_gone(run):.1f} s after kill -9")
    deadline = time.monotonic() + GONE_WAIT_S
    while cluster.alive():
        assert time.monotonic() < deadline, cluster.alive()
        time.sleep(0.5)
    saved_whole(run)
