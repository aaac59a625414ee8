"""prefect.yaml, read as `prefect deploy` reads it: the deployments the pipeline and the prefect launch
backend rely on, with valid parameters equal to the tiny-cpu preset."""

from __future__ import annotations

from datetime import datetime

import yaml
from cronsim import CronSim

from config.loader import preset_path, read_yaml
from config.schema import FinetuneConfig
from config.sections.launch import LaunchConfig
from tests.conftest import ROOT


def deployments() -> dict[str, dict]:
    document = yaml.safe_load((ROOT / "prefect.yaml").read_text())
    flows = {"flows/finetune.py:finetune": "finetune", "flows/node.py:node": "node"}
    return {f"{flows[d['entrypoint']]}/{d['name']}": d for d in document["deployments"]}


def test_the_four_deployments_and_their_pools() -> None:
    found = deployments()
    assert sorted(found) == ["finetune/kubernetes", "finetune/manual", "finetune/nightly", "node/node"]
    assert found["finetune/kubernetes"]["work_pool"]["name"] == "tandem-kubernetes"
    assert found["finetune/manual"]["work_pool"]["name"] == found["finetune/nightly"]["work_pool"]["name"]
    assert found["node/node"]["work_pool"]["name"] == "tandem-nodes"
    # Separate queues, so that a worker (the tests' one) can serve manual runs without taking scheduled ones.
    assert found["finetune/nightly"]["work_pool"]["work_queue_name"] == "scheduled"
    assert found["finetune/manual"]["work_pool"]["work_queue_name"] == "manual"
    assert LaunchConfig().node_deployment == "node/node"  # what launch.backend=prefect asks for by default
    assert all(d["enforce_parameter_schema"] is True for d in found.values())


def test_nightly_has_a_cron_schedule_and_manual_none() -> None:
    found = deployments()
    (schedule,) = found["finetune/nightly"]["schedules"]
    CronSim(schedule["cron"], datetime(2026, 1, 1))  # raises on a malformed expression
    assert schedule["active"] is True
    assert found["finetune/manual"]["schedules"] == [] and found["node/node"]["schedules"] == []
    assert found["finetune/kubernetes"]["schedules"] == []


def test_pipeline_parameters_are_the_tiny_cpu_preset() -> None:
    preset = FinetuneConfig.model_validate(read_yaml(preset_path("tiny-cpu"))).model_dump()  # paths as written
    for name in ("finetune/nightly", "finetune/manual", "finetune/kubernetes"):
        parameters = deployments()[name]["parameters"]
        assert list(parameters) == ["config"]
        assert FinetuneConfig.model_validate(parameters["config"]).model_dump() == preset, name


def test_code_comes_from_the_workers_checkout() -> None:
    document = yaml.safe_load((ROOT / "prefect.yaml").read_text())
    assert document["build"] is None and document["push"] is None
    assert document["pull"] == [
        {"prefect.deployments.steps.set_working_directory": {"directory": "{{ $TANDEM_ROOT }}"}}
    ]
