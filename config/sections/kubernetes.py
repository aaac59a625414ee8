"""`launch.kubernetes`: how the `kubernetes` backend's pods look (image, namespace, scheduling, GPUs and the fabric's
resources, storage, credentials) and which object carries them: a Kubeflow Trainer `TrainJob` when `runtime` names a
training runtime, else an indexed Job with a headless Service.

Parsing only: nothing here talks to a cluster (launch/backends/kubernetes_render.py renders the objects).
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import Field, field_validator, model_validator

from config.sections.base import ENV_FIX, Section, refuse_secrets

# A DNS-1123 label (namespace, Secret, service account, queue, runtime and claim names).
DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
# A Kubernetes quantity: 16Gi, 500M, 2, 0.5.
QUANTITY = r"^[0-9]+(\.[0-9]+)?([KMGTPE]i?|[mkMGTPE]|e[0-9]+)?$"


class KubernetesConfig(Section):
    """The pods of `launch.backend: kubernetes`, one per node."""

    image: str | None = Field(
        None,
        min_length=1,
        description="The container image every node's pod runs (docker/train.Dockerfile builds one): Tandem at "
        "launch.kubernetes.checkout with its environment. Required with launch.backend=kubernetes.",
    )
    namespace: str = Field("default", pattern=DNS_LABEL, description="The namespace of every object a run submits.")
    runtime: str | None = Field(
        None,
        pattern=DNS_LABEL,
        description="A Kubeflow Trainer ClusterTrainingRuntime (e.g. torch-distributed): each phase is a TrainJob of "
        "it, and the node reads the PET_* variables its controller injects; empty: an indexed Job (the completion "
        "index is the node rank) with a headless Service for the rendezvous, on a cluster without Kubeflow Trainer.",
    )
    checkout: str = Field("/opt/tandem", min_length=1, description="Tandem's checkout in the image (working dir).")
    python: str = Field("python", min_length=1, description="The Python in the image that has Tandem's environment.")
    service_account: str | None = Field(
        None, pattern=DNS_LABEL, description="The pods' service account; empty: the namespace's default."
    )
    node_selector: dict[str, str] = Field(
        default_factory=dict, description="The pods' nodeSelector, e.g. nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3."
    )
    tolerations: list[dict[str, Any]] = Field(
        default_factory=list,
        description="The pods' tolerations as Kubernetes writes them, e.g. {key: nvidia.com/gpu, operator: Exists, "
        "effect: NoSchedule}.",
    )
    priority_class: str | None = Field(
        None,
        pattern=DNS_LABEL,
        description="Indexed Job: the pods' PriorityClass. TrainJob (its API has no pod priority): Kueue's "
        "workload priority class label.",
    )
    queue: str | None = Field(
        None,
        pattern=DNS_LABEL,
        description="A Kueue LocalQueue: the job is created suspended with Kueue's queue label, and Kueue admits all "
        "its pods at once (gang admission), so a partial allocation never holds GPUs waiting for the rest. Empty: "
        "the cluster's scheduler places pods one by one.",
    )
    secret: str | None = Field(
        None,
        pattern=DNS_LABEL,
        description="The Secret holding launch.forward_env's names as keys: the pods take each value from it "
        "(secretKeyRef), never from the manifest. Required when launch.forward_env is set.",
    )
    gpu_resource: str | None = Field(
        "nvidia.com/gpu",
        min_length=1,
        description="The extended resource of one GPU: each pod asks for launch.nproc_per_node of it; empty: none "
        "(CPU pods).",
    )
    resources: dict[str, str] = Field(
        default_factory=dict,
        description="More resources per pod, as limits: the fabric's (rdma/ib: '1', nvidia.com/hostdev: '8'), "
        "cpu, memory.",
    )
    ipc_lock: bool = Field(False, description="Add the IPC_LOCK capability (RDMA registers pinned memory).")
    annotations: dict[str, str] = Field(
        default_factory=dict,
        description="Pod annotations, e.g. k8s.v1.cni.cncf.io/networks for a secondary (RDMA) network.",
    )
    shm_size: str = Field(
        "16Gi", pattern=QUANTITY, description="/dev/shm as a memory emptyDir of this size (NCCL and the data loaders)."
    )
    pvc: str | None = Field(
        None,
        pattern=DNS_LABEL,
        description="A PersistentVolumeClaim (ReadWriteMany) mounted at launch.kubernetes.pvc_path on every pod, "
        "for run.storage on a shared filesystem; empty: run.storage is an object store.",
    )
    pvc_path: str = Field("/data", pattern=r"^/", description="Where launch.kubernetes.pvc is mounted in each pod.")
    node_cache_host_path: str | None = Field(
        None,
        pattern=r"^/",
        description="A directory on each Kubernetes node's own disk (a hostPath volume, created if missing) mounted "
        "as the pods' node cache (launch.node_cache_dir, else /var/cache/tandem in the pod), so that a retry or a "
        "later run scheduled on the same machine reuses its dataset copy and file digests instead of fetching them "
        "again; empty: the cache is in the container's own filesystem and goes with the pod.",
    )
    active_deadline_s: int | None = Field(
        None,
        gt=0,
        description="The job's activeDeadlineSeconds: the cluster stops it after this long whatever the pipeline "
        "does (a bound for a pipeline that died outside the cluster); empty: none.",
    )
    schedule_timeout_s: int = Field(
        900,
        gt=0,
        description="Fail the phase (retryable) when not every pod runs this many seconds after the submission; the "
        "scheduler's reason (insufficient nvidia.com/gpu, a taint) is in the line. Time in a Kueue queue counts.",
    )
    env: dict[str, str] = Field(
        default_factory=dict, description="Extra environment of the pods only (not the ranks'), e.g. HF_HOME."
    )

    @field_validator("env", mode="before")
    @classmethod
    def _no_credentials(cls, value: object) -> object:
        return refuse_secrets(value, "launch.kubernetes.env", ENV_FIX)

    @field_validator("resources")
    @classmethod
    def _quantities(cls, value: dict[str, str]) -> dict[str, str]:
        for name, quantity in value.items():
            if not re.match(QUANTITY, str(quantity)):
                raise ValueError(
                    f"launch.kubernetes.resources.{name}: {quantity!r} is not a Kubernetes quantity "
                    "(e.g. 1, 500m, 16Gi)"
                )
        return value

    @model_validator(mode="after")
    def _tolerations(self) -> KubernetesConfig:
        for index, toleration in enumerate(self.tolerations):
            unknown = sorted(set(toleration) - {"key", "operator", "value", "effect", "tolerationSeconds"})
            if unknown:
                raise ValueError(
                    f"launch.kubernetes.tolerations[{index}]: unknown field {unknown[0]!r} (a toleration has key, "
                    "operator, value, effect, tolerationSeconds)"
                )
        return self
