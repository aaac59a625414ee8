"""The MLflow sink: one MLflow run per Tandem run (`tandem.run_id` tag), found again by a retry or a rerun.

MLflow is an optional extra (`pip install 'tandem[mlflow]'`), imported only when a run tracks to it. The client is
MLflow's `MlflowClient` on an explicit tracking URI (never the fluent API's process-wide active run), so the
pipeline's other state is untouched.
"""

from __future__ import annotations

import base64
import os
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from core.errors import UserError
from storage.fs import read_bytes
from storage.location import Location
from tracking.sink import RunInfo, require, step_metrics

RUN_TAG = "tandem.run_id"
LAST_STEP_METRIC = "train/loss"
PARAM_VALUE_MAX = 6000  # MLflow's limit for a param value
TAG_VALUE_MAX = 5000
BATCH_PARAMS = 100  # MLflow's limit per log_batch call
BATCH_METRICS = 1000
CHECK_TIMEOUT_S = 10
# MLflow's client retries a failed request 7 times over about two minutes by default; the sink's own worker retries
# in the background, so a call may fail fast. Only where the user has not set these.
CLIENT_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1", "MLFLOW_HTTP_REQUEST_TIMEOUT": "15"}


def import_mlflow() -> Any:
    """The mlflow module, or a one-line UserError naming the extra that provides it."""
    return require("mlflow", "MLflow", "track.mlflow_uri", "off")


def make_client(uri: str) -> Any:
    """MLflow's client for the tracking server and model registry at `uri`."""
    mlflow = import_mlflow()
    for key, value in CLIENT_DEFAULTS.items():
        os.environ.setdefault(key, value)
    return mlflow.MlflowClient(tracking_uri=uri, registry_uri=uri)


def auth_header() -> dict[str, str]:
    """Basic auth from MLFLOW_TRACKING_USERNAME/PASSWORD, as MLflow's client sends it."""
    user, password = os.environ.get("MLFLOW_TRACKING_USERNAME"), os.environ.get("MLFLOW_TRACKING_PASSWORD")
    if not (user and password):
        return {}
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def check_server(uri: str) -> None:
    """Before training: the tracking server answers an authorized API call, or one UserError line with the fix."""
    import_mlflow()
    if not uri.startswith(("http://", "https://")):
        return  # a local store (file:, sqlite:) or a hosted scheme: nothing to reach beforehand
    url = f"{uri.rstrip('/')}/api/2.0/mlflow/experiments/search?max_results=1"
    fix = (
        "start it (mlflow server --host 127.0.0.1 --port 5000), fix track.mlflow_uri / MLFLOW_TRACKING_URI, or "
        "set track.mlflow_uri=off to train without MLflow"
    )
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=auth_header()), timeout=CHECK_TIMEOUT_S):
            return
    except urllib.error.HTTPError as exc:
        if exc.code in (401, 403):
            raise UserError(
                f"track.mlflow_uri: MLflow at {uri} refused the credentials (HTTP {exc.code}): set "
                "MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD in the environment"
            ) from None
        raise UserError(f"track.mlflow_uri: MLflow at {uri} answered HTTP {exc.code}; {fix}") from None
    except (OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise UserError(f"track.mlflow_uri: MLflow at {uri} is not reachable ({reason}); {fix}") from None


def run_link(uri: str, experiment_id: str, run_id: str) -> str | None:
    """The run's page in the MLflow UI, for a server URI."""
    if not uri.startswith(("http://", "https://")):
        return None
    return f"{uri.rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}"


def find_run(client: Any, experiment: str, run_id: str, tags: Mapping[str, str]) -> tuple[str, str, bool]:
    """(experiment id, MLflow run id, whether it existed) of the MLflow run of Tandem's `run_id` in `experiment`;
    both are created (the run with `tags`) when missing."""
    found_experiment = client.get_experiment_by_name(experiment)
    experiment_id = (
        found_experiment.experiment_id if found_experiment is not None else client.create_experiment(experiment)
    )
    runs = client.search_runs([experiment_id], filter_string=f"tags.`{RUN_TAG}` = '{run_id}'", max_results=1)
    if runs:
        return experiment_id, runs[0].info.run_id, True
    return experiment_id, client.create_run(experiment_id, tags=dict(tags), run_name=run_id).info.run_id, False


def _clip(value: str, limit: int) -> str:
    return value if len(value) <= limit else value[: limit - 3] + "..."


class MlflowSink:
    """Mirrors a Tandem run into one MLflow run of `experiment` on the tracking server at `uri`."""

    name = "MLflow"

    def __init__(self, uri: str, experiment: str) -> None:
        self.uri = uri
        self.experiment = experiment
        self.client = make_client(uri)
        self.experiment_id: str | None = None
        self.mlflow_run_id: str | None = None

    def open(self, run: RunInfo) -> int:
        """Find the MLflow run tagged with this run_id (a retry, a rerun of the same run.name) or create it."""
        tags = {
            RUN_TAG: run.run_id,
            "tandem.run_url": str(run.run_url),
            **({"prefect.flow_run_id": run.flow_run_id} if run.flow_run_id else {}),
            **({"prefect.flow_run_url": run.flow_run_url} if run.flow_run_url else {}),
        }
        self.experiment_id, self.mlflow_run_id, found = find_run(self.client, self.experiment, run.run_id, tags)
        if found:
            self.client.update_run(self.mlflow_run_id, status="RUNNING")
            self.set_tags(tags)
        history = self.client.get_metric_history(self.mlflow_run_id, LAST_STEP_METRIC)
        return max((m.step for m in history), default=0)

    @property
    def link(self) -> str | None:
        """The MLflow UI page of the run (once opened)."""
        if self.experiment_id is None or self.mlflow_run_id is None:
            return None
        return run_link(self.uri, self.experiment_id, self.mlflow_run_id)

    def log_params(self, params: Mapping[str, str]) -> None:
        """Params the run does not hold yet (MLflow refuses to change a logged param; a rerun keeps the first)."""
        from mlflow.entities import Param

        held = self.client.get_run(self.mlflow_run_id).data.params
        new = [Param(key, _clip(value, PARAM_VALUE_MAX)) for key, value in sorted(params.items()) if key not in held]
        for start in range(0, len(new), BATCH_PARAMS):
            self.client.log_batch(self.mlflow_run_id, params=new[start : start + BATCH_PARAMS], synchronous=True)

    def log_steps(self, records: list[dict[str, Any]]) -> None:
        """train/{key} of every step line, at its step."""
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [
            Metric(key, value, now, record["step"]) for record in records for key, value in step_metrics(record).items()
        ]
        for start in range(0, len(metrics), BATCH_METRICS):
            self.client.log_batch(self.mlflow_run_id, metrics=metrics[start : start + BATCH_METRICS], synchronous=True)

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        """Metrics at one step."""
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(
            self.mlflow_run_id, metrics=[Metric(k, float(v), now, step) for k, v in metrics.items()], synchronous=True
        )

    def set_tags(self, tags: Mapping[str, str]) -> None:
        """Tags on the run."""
        from mlflow.entities import RunTag

        self.client.log_batch(
            self.mlflow_run_id,
            tags=[RunTag(k, _clip(str(v), TAG_VALUE_MAX)) for k, v in tags.items()],
            synchronous=True,
        )

    def log_file(self, url: Location, name: str) -> None:
        """A storage file as the run's artifact `name`."""
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / name
            path.write_bytes(read_bytes(url))
            self.client.log_artifact(self.mlflow_run_id, str(path))

    def close(self, status: str) -> None:
        """End the run."""
        self.client.set_terminated(self.mlflow_run_id, status=status)
