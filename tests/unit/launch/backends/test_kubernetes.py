"""The kubernetes backend's description (launch/backends/kubernetes.py): the phase's objects as YAML documents, the
same the submission renders (launch/backends/kubernetes_render.py) but for the suffix each submission draws and the
owner it finds; the job's own environment reaches the containers, a credential only as a reference to the Secret.
Submission, following and deletion against a stand-in API server are tests/kubernetes."""

from __future__ import annotations

import pytest
import yaml

from config.loader import load_config
from launch.backends.kubernetes import DESCRIBED_SUFFIX, KubernetesBackend, pod_job
from launch.backends.kubernetes_render import render
from launch.dry_run import planned_job
from launch.job import TRAIN, PhaseJob
from tests.unit.launch.backends.test_kubernetes_render import FULL

CANARY = "hf_canary_value_123"


@pytest.mark.parametrize("runtime", [[], ["launch.kubernetes.runtime=torch-distributed"]])
def test_the_description_is_the_objects_the_submission_renders(runtime: list[str]) -> None:
    job = planned_job(load_config(None, [*FULL, *runtime]), TRAIN)
    text = KubernetesBackend().describe(job)
    assert text.startswith("# launch.backend=kubernetes: the objects of the train phase, created in namespace ml")
    assert list(yaml.safe_load_all(text)) == render(pod_job(job, suffix=DESCRIBED_SUFFIX))
    assert text.count("\n---\n") == len(render(pod_job(job, suffix=DESCRIBED_SUFFIX)))  # each document marked


def test_the_jobs_environment_reaches_the_containers_and_no_credential_value_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HF_TOKEN", CANARY)
    planned = planned_job(load_config(None, FULL), TRAIN)
    text = KubernetesBackend().describe(PhaseJob(planned.written, TRAIN, env={"NCCL_DEBUG": "INFO"}))
    _, indexed = yaml.safe_load_all(text)
    env = {item["name"]: item for item in indexed["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["NCCL_DEBUG"] == {"name": "NCCL_DEBUG", "value": "INFO"}
    assert env["HF_TOKEN"] == {
        "name": "HF_TOKEN",
        "valueFrom": {"secretKeyRef": {"name": "tandem-creds", "key": "HF_TOKEN"}},
    }
    assert CANARY not in text


def test_each_submission_draws_its_own_suffix() -> None:
    job = planned_job(load_config(None, FULL), TRAIN)
    suffixes = {pod_job(job).suffix for _ in range(20)}
    assert len(suffixes) > 1 and all(len(s) == 4 and int(s, 16) >= 0 for s in suffixes)
