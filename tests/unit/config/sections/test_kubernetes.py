"""`launch.kubernetes`: how the pods look, each value checked as the API server would (names, quantities,
tolerations), no credential in the pods' environment, one line naming the key for each mistake."""

from __future__ import annotations

import pytest

from config.loader import load_config
from config.sections.kubernetes import KubernetesConfig
from core.errors import UserError

IMAGE = "launch.kubernetes.image=registry.example/tandem:1"


def test_a_full_setting_loads_as_written() -> None:
    cfg = load_config(
        None,
        [
            "launch.backend=kubernetes",
            IMAGE,
            "run.storage=s3://models/tandem",
            "launch.kubernetes.namespace=ml-team",
            "launch.kubernetes.runtime=torch-distributed",
            "launch.kubernetes.resources={rdma/ib: '1', memory: 64Gi, cpu: 500m}",
            "launch.kubernetes.tolerations=[{key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}]",
            "launch.kubernetes.node_selector={nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3}",
            "launch.kubernetes.env={HF_HOME: /cache/hf}",
        ],
    )
    kube = cfg.launch.kubernetes
    assert (kube.image, kube.namespace, kube.runtime) == ("registry.example/tandem:1", "ml-team", "torch-distributed")
    assert kube.resources == {"rdma/ib": "1", "memory": "64Gi", "cpu": "500m"}
    assert kube.tolerations == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert (kube.shm_size, kube.gpu_resource, kube.schedule_timeout_s) == ("16Gi", "nvidia.com/gpu", 900)


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("launch.kubernetes.namespace=ML_Team", "launch.kubernetes.namespace: String should match pattern"),
        (
            "launch.kubernetes.resources={memory: lots}",
            "launch.kubernetes.resources.memory: 'lots' is not a Kubernetes quantity (e.g. 1, 500m, 16Gi)",
        ),
        (
            "launch.kubernetes.tolerations=[{key: a, operator: Exists}, {key: b, effect: NoSchedule, seconds: 5}]",
            "launch.kubernetes.tolerations[1]: unknown field 'seconds' (a toleration has key, operator, value, "
            "effect, tolerationSeconds)",
        ),
        ("launch.kubernetes.shm_size=16 gigs", "launch.kubernetes.shm_size: String should match pattern"),
        ("launch.kubernetes.pvc_path=data", "launch.kubernetes.pvc_path: String should match pattern '^/'"),
        ("launch.kubernetes.schedule_timeout_s=0", "launch.kubernetes.schedule_timeout_s: Input should be greater"),
        ("launch.kubernetes.env={HF_TOKEN: hf_abcdefghijklmnop}", "launch.kubernetes.env.HF_TOKEN looks like a"),
    ],
)
def test_a_bad_value_is_one_line_naming_its_key(override: str, expected: str) -> None:
    with pytest.raises(UserError) as info:
        load_config(None, ["launch.backend=kubernetes", IMAGE, override])
    assert expected in str(info.value) and "\n" not in str(info.value)
    assert "hf_abcdefghijklmnop" not in str(info.value)


def test_the_defaults_are_an_indexed_job_in_the_default_namespace() -> None:
    kube = KubernetesConfig()
    assert (kube.runtime, kube.namespace, kube.queue, kube.secret, kube.pvc) == (None, "default", None, None, None)
