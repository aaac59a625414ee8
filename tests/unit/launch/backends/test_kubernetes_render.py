"""The kubernetes backend's objects as rendered, against the pinned API schemas: the core objects (Service, Job)
against Kubernetes 1.33's OpenAPI schemas in strict mode (kubernetes-validate: an unknown or mistyped field fails),
the TrainJob against the pydantic models of kubeflow-trainer-api 2.3.0 (parsed and dumped back unchanged: a field the
model does not know would be dropped). Then the pods' contract with launch.node and the config's refusals (no cluster
runs here). What a pod's status becomes is test_kubernetes_status.py; the objects as a dry run prints them,
test_kubernetes.py."""

from __future__ import annotations

import dataclasses
import json

import kubernetes_validate
import pytest
from kubeflow_trainer_api.models.trainer_v1alpha1_train_job import TrainerV1alpha1TrainJob

from config.loader import load_config
from core.errors import UserError
from launch.backends.kubernetes import DESCRIBED_SUFFIX, pod_job
from launch.backends.kubernetes_render import MAX_NAME, Owner, PodJob, master_host, object_name, render
from launch.dry_run import planned_job
from launch.job import EVAL, PROBE, TRAIN, Phase

K8S_VERSION = "1.33"
FULL = [
    "run.storage=s3://bucket/tandem",
    "run.name=qwen7b-lora",
    "launch.backend=kubernetes",
    "launch.nnodes=4",
    "launch.nproc_per_node=8",
    "launch.forward_env=[HF_TOKEN, AWS_SECRET_ACCESS_KEY]",
    "launch.env={NCCL_IB_HCA: mlx5}",
    "train.preempt_grace_s=25",
    "launch.kubernetes.image=registry.example/tandem:0.1",
    "launch.kubernetes.namespace=ml",
    "launch.kubernetes.secret=tandem-creds",
    "launch.kubernetes.queue=gpu-queue",
    "launch.kubernetes.priority_class=training",
    "launch.kubernetes.service_account=tandem",
    "launch.kubernetes.node_selector={nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3}",
    "launch.kubernetes.tolerations=[{key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}]",
    "launch.kubernetes.resources={rdma/ib: '1', memory: 900Gi}",
    "launch.kubernetes.ipc_lock=true",
    "launch.kubernetes.annotations={k8s.v1.cni.cncf.io/networks: ib-net}",
    "launch.kubernetes.active_deadline_s=86400",
]


def job(overrides: list[str], phase: Phase = TRAIN) -> PodJob:
    """The renderer's view of `phase` of a run of this config, as a dry run describes it."""
    return pod_job(planned_job(load_config(None, overrides), phase), suffix=DESCRIBED_SUFFIX)


@pytest.mark.parametrize("phase", [TRAIN, EVAL, PROBE])
@pytest.mark.parametrize("extra", [[], ["launch.kubernetes.pvc=shared", "run.storage=/data/tandem"]])
def test_the_indexed_job_and_its_service_validate_against_the_api_schemas(phase: Phase, extra: list[str]) -> None:
    service, indexed = render(job([*FULL, *extra], phase))
    for obj in (service, indexed):
        assert kubernetes_validate.validate(obj, K8S_VERSION, strict=True) == K8S_VERSION
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["publishNotReadyAddresses"] is True
    spec = indexed["spec"]
    assert (spec["completionMode"], spec["completions"], spec["parallelism"], spec["backoffLimit"]) == (
        "Indexed",
        4,
        4,
        0,
    )
    assert spec["suspend"] is True and indexed["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "gpu-queue"
    pod = spec["template"]["spec"]
    assert pod["subdomain"] == service["metadata"]["name"] == indexed["metadata"]["name"]
    assert set(service["spec"]["selector"].items()) <= set(spec["template"]["metadata"]["labels"].items())
    assert pod["terminationGracePeriodSeconds"] >= 25 + 60 and pod["priorityClassName"] == "training"
    container = pod["containers"][0]
    assert container["resources"]["limits"] == {"rdma/ib": "1", "memory": "900Gi", "nvidia.com/gpu": "8"}
    assert container["securityContext"] == {"capabilities": {"add": ["IPC_LOCK"]}}
    assert {"name": "dshm", "mountPath": "/dev/shm"} in container["volumeMounts"]
    env = {item["name"]: item for item in container["env"]}
    assert env["MASTER_ADDR"]["value"] == master_host(job([*FULL, *extra], phase))
    assert env["NODE_RANK"]["valueFrom"]["fieldRef"]["fieldPath"].endswith(
        "['batch.kubernetes.io/job-completion-index']"
    )
    assert env["HF_TOKEN"] == {
        "name": "HF_TOKEN",
        "valueFrom": {"secretKeyRef": {"name": "tandem-creds", "key": "HF_TOKEN"}},
    }
    command = container["command"]
    assert command[:3] == ["python", "-m", "launch.node"] and command[command.index("--phase") + 1] == phase.name
    assert ("--spec-digest" in command) is phase.preflights and ("--model" in command) is phase.takes_model
    assert indexed["metadata"]["labels"]["tandem.dev/phase"] == phase.name


@pytest.mark.parametrize("cache_dir", [None, "/scratch/tandem"])
def test_the_node_cache_on_the_machines_own_disk_outlives_the_pod(cache_dir: str | None) -> None:
    """launch.kubernetes.node_cache_host_path: a hostPath volume mounted where the node looks for its cache (the
    configured launch.node_cache_dir, else /var/cache/tandem named by TANDEM_NODE_CACHE), valid for both kinds."""
    extra = ["launch.kubernetes.node_cache_host_path=/mnt/nvme/tandem-cache"]
    extra += [f"launch.node_cache_dir={cache_dir}"] if cache_dir else []
    mount = {"name": "node-cache", "mountPath": cache_dir or "/var/cache/tandem"}
    volume = {"name": "node-cache", "hostPath": {"path": "/mnt/nvme/tandem-cache", "type": "DirectoryOrCreate"}}
    _, indexed = render(job([*FULL, *extra]))
    assert kubernetes_validate.validate(indexed, K8S_VERSION, strict=True) == K8S_VERSION
    pod = indexed["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert volume in pod["volumes"] and mount in container["volumeMounts"]
    env = {item["name"]: item.get("value") for item in container["env"]}
    assert env.get("TANDEM_NODE_CACHE") == (None if cache_dir else "/var/cache/tandem")
    (train_job,) = render(job([*FULL, *extra, "launch.kubernetes.runtime=torch-distributed"]))
    assert TrainerV1alpha1TrainJob.from_dict(train_job).to_dict() == train_job
    patch = train_job["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]
    pod = patch["template"]["spec"]["template"]["spec"]
    assert volume in pod["volumes"] and mount in pod["containers"][0]["volumeMounts"]
    env = {item["name"]: item.get("value") for item in train_job["spec"]["trainer"]["env"]}
    assert env.get("TANDEM_NODE_CACHE") == (None if cache_dir else "/var/cache/tandem")
    _, plain = render(job(FULL))
    assert "node-cache" not in json.dumps(plain) and "TANDEM_NODE_CACHE" not in json.dumps(plain)


def test_a_train_job_round_trips_through_kubeflow_trainers_models() -> None:
    (train_job,) = render(job([*FULL, "launch.kubernetes.runtime=torch-distributed"]))
    assert TrainerV1alpha1TrainJob.from_dict(train_job).to_dict() == train_job
    trainer = train_job["spec"]["trainer"]
    assert (trainer["numNodes"], trainer["numProcPerNode"]) == (4, 8)
    assert train_job["spec"]["runtimeRef"] == {
        "name": "torch-distributed",
        "kind": "ClusterTrainingRuntime",
        "apiGroup": "trainer.kubeflow.org",
    }
    # The controller injects the place (PET_*): nothing of Qwen's names is set, so launch.node reads PET_*.
    assert not {"NODE_RANK", "NNODES", "MASTER_ADDR"} & {item["name"] for item in trainer["env"]}
    assert train_job["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] == "training"


@pytest.mark.parametrize("runtime", [[], ["launch.kubernetes.runtime=torch-distributed"]])
def test_the_pipelines_pod_owns_the_phases_objects_in_its_own_namespace_only(runtime: list[str]) -> None:
    """So the garbage collector deletes them with the pipeline's pod; an owner in another namespace counts as absent
    there and would get them deleted at once, so it is left out."""
    planned_job = job([*FULL, *runtime])
    mine = dataclasses.replace(planned_job, owner=Owner("pipeline-7xk2p", "5f1c-uid", "ml"))
    for obj in render(mine):
        assert obj["metadata"]["ownerReferences"] == [
            {"apiVersion": "v1", "kind": "Pod", "name": "pipeline-7xk2p", "uid": "5f1c-uid"}
        ]
        if obj["kind"] != "TrainJob":
            assert kubernetes_validate.validate(obj, K8S_VERSION, strict=True) == K8S_VERSION
        else:
            assert TrainerV1alpha1TrainJob.from_dict(obj).to_dict() == obj
    elsewhere = dataclasses.replace(planned_job, owner=Owner("pipeline-7xk2p", "5f1c-uid", "prefect"))
    assert not any("ownerReferences" in obj["metadata"] for obj in render(elsewhere))


def test_the_schema_check_catches_what_it_is_there_for() -> None:
    """The checks above can fail: a misspelt field and a wrong type are refused."""
    _, indexed = render(job(FULL))
    indexed["spec"]["template"]["spec"]["containers"][0]["comand"] = ["python"]
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(indexed, K8S_VERSION, strict=True)
    (train_job,) = render(job([*FULL, "launch.kubernetes.runtime=torch-distributed"]))
    train_job["spec"]["trainer"]["numNode"] = 4
    assert TrainerV1alpha1TrainJob.from_dict(train_job).to_dict() != train_job


def test_a_pod_gets_the_runs_storage_options_in_its_spec_argument_not_its_environment() -> None:
    """run.storage_options (a store's endpoint) travel with the spec's location in the node's --spec, parsed once by
    launch.node; no variable carries them."""
    options = {"endpoint_url": "http://minio.ml.svc:9000"}
    _, indexed = render(job([*FULL, f"run.storage_options={json.dumps(options)}"]))
    [container] = indexed["spec"]["template"]["spec"]["containers"]
    spec = container["command"][container["command"].index("--spec") + 1]
    assert json.loads(spec) == {"url": "s3://bucket/tandem/runs/qwen7b-lora/spec.json", "options": options}
    assert not [e for e in container["env"] if "STORAGE" in e["name"] or "minio" in str(e.get("value"))]
    _, plain = render(job(FULL))
    [container] = plain["spec"]["template"]["spec"]["containers"]
    assert container["command"][container["command"].index("--spec") + 1] == (
        "s3://bucket/tandem/runs/qwen7b-lora/spec.json"
    )


def test_names_fit_dns_and_the_index_suffix() -> None:
    name = object_name("My_Run.With/Odd chars and a very long name that goes on and on" * 2, TRAIN, "ab12")
    assert len(name) <= MAX_NAME and name.endswith("-train-ab12") and name == name.lower()
    assert object_name("short", EVAL, "ab12") == "tandem-short-eval-ab12"


@pytest.mark.parametrize(
    ("overrides", "said"),
    [
        (["launch.backend=kubernetes", "run.storage=s3://b/t"], "needs launch.kubernetes.image"),
        (
            [
                "launch.backend=kubernetes",
                "run.storage=s3://b/t",
                "launch.kubernetes.image=i",
                "launch.forward_env=[HF_TOKEN]",
            ],
            "needs launch.kubernetes.secret: a Secret in launch.kubernetes.namespace with the keys HF_TOKEN",
        ),
        (["launch.backend=kubernetes", "launch.kubernetes.image=i"], "is a path the pods cannot reach"),
        (
            ["launch.kubernetes.resources={rdma/ib: lots}"],
            "launch.kubernetes.resources.rdma/ib: 'lots' is not a Kubernetes quantity",
        ),
        (["launch.kubernetes.tolerations=[{key: a, efect: NoSchedule}]"], "unknown field 'efect'"),
    ],
)
def test_a_config_the_pods_cannot_run_is_one_line(overrides: list[str], said: str) -> None:
    with pytest.raises(UserError) as info:
        load_config(None, overrides)
    assert said in str(info.value)
