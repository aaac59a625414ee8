"""The deployments of prefect.yaml on a real server: the typed form the server stores, the server refusing
a bad value by name, and a run created through the API (the UI's own call) behaving exactly like
`python -m flows.finetune` with the same config."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from config.loader import load_config
from tests.conftest import ROOT

pytestmark = pytest.mark.e2e

RUN_TIMEOUT_S = 600
SMALL = ["train.max_steps=4", "train.save_steps=4", "run.name=same"]  # the tiny-cpu preset, shortened


@contextmanager
def client_of(server) -> Iterator:
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: server.api_url}), get_client(sync_client=True) as client:
        yield client


def test_the_form_schema_on_the_server_is_typed(deployed) -> None:
    with client_of(deployed) as client:
        manual = client.read_deployment_by_name("finetune/manual")
        nightly = client.read_deployment_by_name("finetune/nightly")
        node = client.read_deployment_by_name("node/node")
    schema = manual.parameter_openapi_schema
    assert schema["properties"]["config"]["$ref"] == "#/definitions/FinetuneConfig"
    defs = schema["definitions"]
    train, launch, run = (defs[name]["properties"] for name in ("TrainConfig", "LaunchConfig", "RunConfig"))
    assert train["method"]["enum"] == ["full", "lora", "qlora"]
    # preference tuning and online RL, offered by the form
    assert train["objective"]["enum"] == ["sft", "dpo", "ipo", "kto", "orpo", "grpo"]
    assert defs["PreferenceConfig"]["properties"]["beta"]["exclusiveMinimum"] == 0.0
    assert (train["learning_rate"]["exclusiveMinimum"], train["learning_rate"]["maximum"]) == (0.0, 1.0)
    assert launch["backend"]["enum"] == ["local", "prefect", "slurm", "ssh", "kubernetes"]
    assert launch["nnodes"]["type"] == "integer" and launch["nnodes"]["maximum"] == 1024
    assert run["storage"]["description"].startswith("fsspec URL shared by every node")
    assert defs["TrainConfig"]["additionalProperties"] is False  # unknown keys are refused, as on the CLI
    assert manual.enforce_parameter_schema and manual.parameters["config"]["train"]["max_steps"] == 30
    assert manual.schedules == [] and [s.schedule.cron for s in nightly.schedules] == ["0 2 * * *"]
    assert (manual.work_pool_name, manual.work_queue_name) == ("tandem-pipeline", "manual")
    assert (node.work_pool_name, node.work_queue_name) == ("tandem-nodes", "node-0")


def test_the_kubernetes_pool_holds_the_pipelines_job_template(deployed) -> None:
    """tools/deploy.py made tandem-kubernetes a kubernetes pool with deploy/kubernetes/pipeline-pool.json (the server
    checked that every placeholder names a variable); its Job, with the variables' defaults and the deployment's
    image filled in by Prefect's own templating, validates against Kubernetes 1.33's strict schemas. No kubernetes
    worker runs here: no cluster can."""
    import kubernetes_validate
    from prefect.utilities.templating import apply_values

    with client_of(deployed) as client:
        pool = client.read_work_pool("tandem-kubernetes")
        deployment = client.read_deployment_by_name("finetune/kubernetes")
    assert pool.type == "kubernetes" and (deployment.work_pool_name, deployment.work_queue_name) == (
        "tandem-kubernetes",
        "default",
    )
    template = pool.base_job_template
    values = {name: spec["default"] for name, spec in template["variables"]["properties"].items() if "default" in spec}
    values |= {**deployment.job_variables, "name": "finetune-kubernetes", "labels": {"app": "tandem"}, "env": []}
    values["command"] = ["python", "-m", "prefect.engine"]
    job = apply_values(template["job_configuration"]["job_manifest"], values)
    job["metadata"]["name"] = job["metadata"].pop("generateName") + "x1"
    pod = job["spec"]["template"]["spec"]
    # prefect-kubernetes refuses a template without these two in the pod's spec (its own default template has them;
    # tests/kubernetes runs its worker); they are no PodSpec fields, and the API server drops them with a warning.
    assert (pod.pop("parallelism"), pod.pop("completions")) == (1, 1)
    assert kubernetes_validate.validate(job, "1.33", strict=True) == "1.33"
    assert pod["serviceAccountName"] == "tandem-pipeline"  # the account deploy/kubernetes/rbac.yaml binds
    assert pod["containers"][0]["image"] == "registry.example/tandem:latest"


@pytest.mark.parametrize(
    ("section", "key", "value", "expected"),
    [
        (
            "train",
            "learning_rate",
            -1,
            "'config.train.learning_rate'. Failure reason: -1 is less than or equal to the minimum of 0.0",
        ),
        (
            "train",
            "method",
            "bogus",
            "'config.train.method'. Failure reason: 'bogus' is not one of ['full', 'lora', 'qlora']",
        ),
        ("launch", "nnodes", "two", "'config.launch.nnodes'. Failure reason: 'two' is not of type 'integer'"),
    ],
)
def test_an_invalid_value_is_refused_naming_the_field(deployed, tmp_path, section, key, value, expected) -> None:
    from prefect.exceptions import PrefectHTTPStatusError

    config = load_config(None, [f"run.storage={tmp_path}"]).model_dump(mode="json")
    config[section][key] = value
    with client_of(deployed) as client:
        deployment = client.read_deployment_by_name("finetune/manual")
        with pytest.raises(PrefectHTTPStatusError) as info:
            client.create_flow_run_from_deployment(deployment.id, parameters={"config": config})
    assert info.value.response.status_code == 409
    assert info.value.response.json()["detail"] == f"Error creating flow run: Validation failed for field {expected}"


def step_losses(run_dir: Path) -> list[float]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [record["loss"] for record in map(json.loads, lines) if "event" not in record]


@pytest.mark.multirun  # two whole pipelines: 70-90 s, over the default run's budget
def test_a_run_from_the_api_matches_the_cli_run(deployed, tiny_model, tmp_path) -> None:
    """Both at once: `python -m flows.finetune` against the same server, and finetune/manual through its worker."""
    cli_storage, api_storage = tmp_path / "cli", tmp_path / "api"
    small = [*SMALL, f"model.name_or_path={tiny_model}"]  # the session's tiny model: built once, not per run
    cli = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "flows.finetune",
            *(a for s in small for a in ("--set", s)),
            "--set",
            f"run.storage={cli_storage}",
        ],
        cwd=ROOT,
        env=deployed.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    config = load_config(None, [*small, f"run.storage={api_storage}"]).model_dump(mode="json")
    with client_of(deployed) as client:
        deployment = client.read_deployment_by_name("finetune/manual")
        run = client.create_flow_run_from_deployment(deployment.id, parameters={"config": config})
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while not (state := client.read_flow_run(run.id).state).is_final() and time.monotonic() < deadline:
            time.sleep(2)
    cli_output, _ = cli.communicate(timeout=RUN_TIMEOUT_S)
    worker_log = (deployed.logs / "worker.log").read_text()[-3000:]
    assert state.is_completed(), f"{state.name}: {state.message}\n{worker_log}"
    assert state.message == "registered tandem-tiny v0001 (champion)"
    assert cli.returncode == 0, cli_output[-3000:]

    specs = [
        json.loads((storage / "runs" / "same" / "spec.json").read_text()) for storage in (cli_storage, api_storage)
    ]
    assert specs[0]["dataset"]["dataset_id"] == specs[1]["dataset"]["dataset_id"]
    manifests = [json.loads((Path(spec["dataset"]["url"]) / "manifest.json").read_text()) for spec in specs]
    assert manifests[0]["files"] == manifests[1]["files"]  # the same staged bytes (created_at differs)
    cli_losses, api_losses = (step_losses(storage / "runs" / "same") for storage in (cli_storage, api_storage))
    assert len(cli_losses) == 4
    assert api_losses == cli_losses
    evals = [json.loads((s / "runs" / "same" / "eval.json").read_text()) for s in (cli_storage, api_storage)]
    assert evals[0]["loss"] == evals[1]["loss"] and evals[0]["target_tokens"] == evals[1]["target_tokens"]
