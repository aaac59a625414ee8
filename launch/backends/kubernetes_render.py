"""The objects the `kubernetes` backend submits for one phase, as plain dicts (what the API server receives): a
Kubeflow Trainer `TrainJob` of `launch.kubernetes.runtime`, or on a bare cluster an indexed `batch/v1` Job (the
completion index is the node rank) with a headless Service whose name gives node 0's pod a DNS name.

One pod per node runs `python -m launch.node`, as srun and ssh do, which reads its place from the environment: Qwen's
NNODES / NODE_RANK / MASTER_ADDR / MASTER_PORT / GPUS_PER_NODE here, the PET_* variables Kubeflow Trainer's torch
plugin injects into a TrainJob's pods (launch/node_env.py `ALTERNATIVES`). Credentials are references to the Secret
`launch.kubernetes.secret` (secretKeyRef), never values: the manifests hold no secret. Pure: nothing here talks to a
cluster, so the same functions serve the submission and its description (`python -m flows.finetune --dry-run`).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from typing import Any

from config.schema import FinetuneConfig
from launch.command import DEFAULT_MASTER_PORT
from launch.job import NODE_MODULE, Phase
from storage.location import Location
from storage.node_cache import CACHE_ENV

TRAINER_API = "trainer.kubeflow.org/v1alpha1"
TRAINER_GROUP = "trainer.kubeflow.org"
# The replicated job and the container of Kubeflow Trainer's torch runtimes that the node's patch addresses.
TRAINER_NODE = "node"
CONTAINER = "node"
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
WORKLOAD_PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
PATCH_MANAGER = "tandem.dev/launcher"
# Labels on every object of a run's phase, to find its pods and to clean up after it.
RUN_LABEL = "tandem.dev/run"
PHASE_LABEL = "tandem.dev/phase"
JOB_LABEL = "tandem.dev/job"  # an indexed Job's pods: the Service selects them by it
SHM_VOLUME = "dshm"
STORAGE_VOLUME = "storage"
CACHE_VOLUME = "node-cache"
CACHE_MOUNT = "/var/cache/tandem"  # the pods' node cache when launch.node_cache_dir is empty
# A save after the ranks stop (launch.checkpoint_on_cancel, train.preempt_grace_s) may take this long beyond the
# grace itself before the kubelet's SIGKILL: the pod's terminationGracePeriodSeconds covers both.
SAVE_ALLOWANCE_S = 60
# An indexed Job's pods are named {job}-{index}: the job's name leaves room for the index within 63 characters.
MAX_NAME = 52


@dataclass(frozen=True)
class Owner:
    """The pod the pipeline runs in (Prefect's Kubernetes worker runs it in one): the phase's objects name it as their
    owner, so that the cluster's garbage collector deletes them with that pod when the pipeline could not."""

    name: str
    uid: str
    namespace: str


@dataclass(frozen=True)
class PodJob:
    """What every pod of one phase runs: the config, where the run is, the phase and `launch.node`'s arguments."""

    config: FinetuneConfig
    run_id: str
    run: Location
    phase: Phase
    node_args: list[str]
    suffix: str  # distinguishes the submissions of one run's phase (retries): 4 hex
    owner: Owner | None = None  # None: the pipeline runs outside the objects' namespace (or outside the cluster)
    env: dict[str, str] = field(default_factory=dict)  # what the job adds to the ranks' environment (PhaseJob.env)


def object_name(run_id: str, phase: Phase, suffix: str) -> str:
    """A DNS-1035 label for a phase's objects: tandem-{run}-{phase}-{suffix}, cut with a digest of the run id when
    longer than MAX_NAME."""
    run = re.sub(r"[^a-z0-9-]+", "-", run_id.lower()).strip("-") or "run"
    tail = f"-{phase.name}-{suffix}"
    name = f"tandem-{run}{tail}"
    if len(name) > MAX_NAME:
        digest = hashlib.sha256(run_id.encode()).hexdigest()[:6]
        name = f"tandem-{run[: MAX_NAME - len(tail) - len('tandem--') - 6].rstrip('-')}-{digest}{tail}"
    return name


def label_value(text: str) -> str:
    """A label value (63 characters of [A-Za-z0-9._-], alphanumeric at both ends)."""
    value = re.sub(r"[^A-Za-z0-9._-]+", "-", text)[:63]
    return value.strip("-._") or "x"


def render(job: PodJob) -> list[dict[str, Any]]:
    """Every object of the phase, in the order they are created."""
    if job.config.launch.kubernetes.runtime:
        return [train_job(job)]
    return [headless_service(job), indexed_job(job)]


def labels(job: PodJob) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "tandem",
        "app.kubernetes.io/managed-by": "tandem",
        RUN_LABEL: label_value(job.run_id),
        PHASE_LABEL: job.phase.name,
    }


def metadata(job: PodJob, name: str, extra: dict[str, str] | None = None) -> dict[str, Any]:
    namespace = job.config.launch.kubernetes.namespace
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "labels": {**labels(job), **(extra or {})}}
    # Only an owner in the same namespace: the garbage collector treats an owner in another namespace as absent and
    # would delete the objects at once.
    if job.owner is not None and job.owner.namespace == namespace:
        meta["ownerReferences"] = [{"apiVersion": "v1", "kind": "Pod", "name": job.owner.name, "uid": job.owner.uid}]
    return meta


def master_port(job: PodJob) -> int:
    return job.config.launch.master_port or DEFAULT_MASTER_PORT


def headless_service(job: PodJob) -> dict[str, Any]:
    """The rendezvous's DNS: {job}-0.{service}.{namespace}.svc is node 0's pod (the Job's pods use it as subdomain);
    published before the pods are ready, since nothing here has a readiness probe."""
    name = object_name(job.run_id, job.phase, job.suffix)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(job, name),
        "spec": {
            "clusterIP": "None",
            "selector": {**labels(job), JOB_LABEL: name},
            "publishNotReadyAddresses": True,
            "ports": [{"name": "rendezvous", "port": master_port(job), "protocol": "TCP"}],
        },
    }


def master_host(job: PodJob) -> str:
    """Node 0's pod: {job}-0 under the headless Service of the same name."""
    name = object_name(job.run_id, job.phase, job.suffix)
    return f"{name}-0.{name}.{job.config.launch.kubernetes.namespace}.svc"


def environment(job: PodJob) -> list[dict[str, Any]]:
    """The container's variables other than the node's place: the job's own (PodJob.env), launch.env and
    launch.kubernetes.env, Tandem's checkout on the import path, and each launch.forward_env name from the Secret (the
    run's storage options are in the node's `--spec`: launch/job.py)."""
    launch = job.config.launch
    kube = launch.kubernetes
    # PYTHONPATH: a TrainJob's container has no working directory of ours (the image's WORKDIR applies).
    values = {
        **job.env,
        **launch.env,
        **kube.env,
        "PYTHONPATH": kube.checkout,
        "PYTHONUNBUFFERED": "1",
        # The node cache on the mounted host directory (launch.node_cache_dir, when set, is read before this).
        **({CACHE_ENV: CACHE_MOUNT} if kube.node_cache_host_path and not launch.node_cache_dir else {}),
    }
    env: list[dict[str, Any]] = [{"name": k, "value": v} for k, v in sorted(values.items())]
    for name in launch.forward_env:
        env.append({"name": name, "valueFrom": {"secretKeyRef": {"name": kube.secret, "key": name}}})
    return env


def place(job: PodJob) -> list[dict[str, Any]]:
    """An indexed Job pod's place in the job, in Qwen's names: the rank from the completion index (downward API)."""
    launch = job.config.launch
    return [
        {"name": "NNODES", "value": str(launch.nnodes)},
        {"name": "NODE_RANK", "valueFrom": {"fieldRef": {"fieldPath": f"metadata.annotations['{COMPLETION_INDEX}']"}}},
        {"name": "MASTER_ADDR", "value": master_host(job)},
        {"name": "MASTER_PORT", "value": str(master_port(job))},
        {"name": "GPUS_PER_NODE", "value": str(launch.nproc_per_node)},
    ]


def node_command(job: PodJob) -> list[str]:
    kube = job.config.launch.kubernetes
    return [kube.python, "-m", NODE_MODULE, *job.node_args]


def resources(job: PodJob) -> dict[str, Any]:
    """Limits (and equal requests) per pod: launch.nproc_per_node GPUs and launch.kubernetes.resources."""
    kube = job.config.launch.kubernetes
    limits = dict(kube.resources)
    if kube.gpu_resource:
        limits[kube.gpu_resource] = str(job.config.launch.nproc_per_node)
    return {"limits": limits, "requests": dict(limits)} if limits else {}


def volumes(job: PodJob) -> list[dict[str, Any]]:
    kube = job.config.launch.kubernetes
    found: list[dict[str, Any]] = [{"name": SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": kube.shm_size}}]
    if kube.pvc:
        found.append({"name": STORAGE_VOLUME, "persistentVolumeClaim": {"claimName": kube.pvc}})
    if kube.node_cache_host_path:
        found.append(
            {"name": CACHE_VOLUME, "hostPath": {"path": kube.node_cache_host_path, "type": "DirectoryOrCreate"}}
        )
    return found


def volume_mounts(job: PodJob) -> list[dict[str, Any]]:
    kube = job.config.launch.kubernetes
    mounts: list[dict[str, Any]] = [{"name": SHM_VOLUME, "mountPath": "/dev/shm"}]
    if kube.pvc:
        mounts.append({"name": STORAGE_VOLUME, "mountPath": kube.pvc_path})
    if kube.node_cache_host_path:
        mounts.append({"name": CACHE_VOLUME, "mountPath": job.config.launch.node_cache_dir or CACHE_MOUNT})
    return mounts


def security_context(job: PodJob) -> dict[str, Any]:
    return {"capabilities": {"add": ["IPC_LOCK"]}} if job.config.launch.kubernetes.ipc_lock else {}


def termination_grace_s(job: PodJob) -> int:
    """Long enough for the ranks' own stop: the preemption save's grace or a cancel's, plus a save."""
    cfg = job.config
    grace = max(cfg.train.preempt_grace_s or 0, cfg.launch.cancel_grace_s if cfg.launch.checkpoint_on_cancel else 0)
    return grace + SAVE_ALLOWANCE_S


def pod_spec_fields(job: PodJob) -> dict[str, Any]:
    """What both kinds set on the pod itself (scheduling, identity, stop, volumes)."""
    kube = job.config.launch.kubernetes
    fields: dict[str, Any] = {"terminationGracePeriodSeconds": termination_grace_s(job), "volumes": volumes(job)}
    if kube.service_account:
        fields["serviceAccountName"] = kube.service_account
    if kube.node_selector:
        fields["nodeSelector"] = dict(kube.node_selector)
    if kube.tolerations:
        fields["tolerations"] = [dict(t) for t in kube.tolerations]
    return fields


def indexed_job(job: PodJob) -> dict[str, Any]:
    """One pod per node (completion index = node rank), none restarted by the Job: a failed pod fails the phase and
    the pipeline decides on a retry (launch.retries), as on every backend."""
    launch, kube = job.config.launch, job.config.launch.kubernetes
    name = object_name(job.run_id, job.phase, job.suffix)
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": kube.image,
        "command": node_command(job),
        "workingDir": kube.checkout,
        "env": place(job) + environment(job),
        "ports": [{"name": "rendezvous", "containerPort": master_port(job)}],
        "volumeMounts": volume_mounts(job),
    }
    if found := resources(job):
        container["resources"] = found
    if found := security_context(job):
        container["securityContext"] = found
    pod: dict[str, Any] = {
        "subdomain": name,
        "restartPolicy": "Never",
        "containers": [container],
        **pod_spec_fields(job),
    }
    if kube.priority_class:
        pod["priorityClassName"] = kube.priority_class
    spec: dict[str, Any] = {
        "completionMode": "Indexed",
        "completions": launch.nnodes,
        "parallelism": launch.nnodes,
        "backoffLimit": 0,
        "template": {
            "metadata": {"labels": {**labels(job), JOB_LABEL: name}, "annotations": dict(kube.annotations)},
            "spec": pod,
        },
    }
    if kube.active_deadline_s:
        spec["activeDeadlineSeconds"] = kube.active_deadline_s
    if kube.queue:  # Kueue unsuspends it once every pod's resources are admitted together
        spec["suspend"] = True
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": metadata(job, name, {QUEUE_LABEL: kube.queue} if kube.queue else None),
        "spec": spec,
    }


def train_job(job: PodJob) -> dict[str, Any]:
    """A TrainJob of launch.kubernetes.runtime: the controller makes the JobSet and injects PET_* (the node's place);
    the rest of the pod comes as a runtime patch of the runtime's `node` job."""
    launch, kube = job.config.launch, job.config.launch.kubernetes
    name = object_name(job.run_id, job.phase, job.suffix)
    trainer: dict[str, Any] = {
        "image": kube.image,
        "command": node_command(job),
        "numNodes": launch.nnodes,
        "numProcPerNode": launch.nproc_per_node,
        "env": environment(job),
    }
    if found := resources(job):
        trainer["resourcesPerNode"] = found
    container: dict[str, Any] = {"name": CONTAINER, "volumeMounts": volume_mounts(job)}
    if found := security_context(job):
        container["securityContext"] = found
    pod_patch = {
        "metadata": {"annotations": dict(kube.annotations)},
        "spec": {**pod_spec_fields(job), "containers": [container]},
    }
    node_patch = {"name": TRAINER_NODE, "template": {"spec": {"template": pod_patch}}}
    spec: dict[str, Any] = {
        "runtimeRef": {"name": kube.runtime, "kind": "ClusterTrainingRuntime", "apiGroup": TRAINER_GROUP},
        "trainer": trainer,
        "runtimePatches": [
            {"manager": PATCH_MANAGER, "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [node_patch]}}}}
        ],
    }
    if kube.active_deadline_s:
        spec["activeDeadlineSeconds"] = kube.active_deadline_s
    if kube.queue:
        spec["suspend"] = True
    extra = {QUEUE_LABEL: kube.queue} if kube.queue else {}
    if kube.priority_class:
        extra[WORKLOAD_PRIORITY_LABEL] = kube.priority_class
    return {"apiVersion": TRAINER_API, "kind": "TrainJob", "metadata": metadata(job, name, extra), "spec": spec}
