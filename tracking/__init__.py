"""Experiment tracking: a run's metrics, config and results mirrored into MLflow, TensorBoard and W&B (`track`).

The pipeline process feeds the sinks (`tracking/sink.py`) from what it already reads: the metrics.jsonl lines
the train task follows for progress, then the whole file once training ended (a step that arrived between two
progress reads, or during a retry, is sent then), the evaluation's metrics, the registration's lineage, the loss
curve and the model card. Tandem's files stay the source of truth; a sink that cannot keep up is retried in the
background and reported at the end, never a reason to fail or wait during training.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from config.schema import FinetuneConfig
from storage.spec import Spec
from tracking.sink import RunInfo, Sink, Tracker, flatten

log = logging.getLogger(__name__)

CLOSE_TIMEOUT_S = 60.0  # how long the end of a run waits for a slow or unreachable tracking server
OPEN_WAIT_S = 30.0  # how long the start waits for the MLflow run to exist, to link it from Prefect


def check_tracking(cfg: FinetuneConfig) -> None:
    """Before anything is written: the configured sinks' packages are installed and the MLflow server answers."""
    uri = cfg.track.mlflow_tracking_uri()
    if uri is not None:
        from tracking.mlflow_sink import check_server

        check_server(uri)
    if cfg.track.tensorboard:
        from tracking.tensorboard_sink import import_tensorboard

        import_tensorboard()
    if cfg.track.wandb:
        from tracking.wandb_sink import import_wandb

        import_wandb()


def build_sinks(cfg: FinetuneConfig) -> list[Sink]:
    """The sinks `track` asks for (none: nothing is tracked beyond Tandem's own files)."""
    sinks: list[Sink] = []
    uri = cfg.track.mlflow_tracking_uri()
    if uri is not None:
        from tracking.mlflow_sink import MlflowSink

        sinks.append(MlflowSink(uri, cfg.track.mlflow_experiment))
    if cfg.track.tensorboard:
        from tracking.tensorboard_sink import TensorBoardSink

        sinks.append(TensorBoardSink())
    if cfg.track.wandb:
        from tracking.wandb_sink import WandbSink

        sinks.append(WandbSink(cfg.track.wandb_project))
    return sinks


@contextmanager
def tracking(cfg: FinetuneConfig, run: RunInfo) -> Iterator[Tracker]:
    """The run's tracker while the pipeline runs (the flow hands it to what feeds it: the train task's progress), every
    record ended when the block ends (FAILED when it raises), and what could not be delivered reported as a
    warning."""
    tracker = Tracker(build_sinks(cfg), run)
    status = "FAILED"
    try:
        yield tracker
        status = "FINISHED"
    finally:
        for line in tracker.close(status, CLOSE_TIMEOUT_S):
            log.warning(line)


def wait_opened(tracker: Tracker, timeout_s: float = OPEN_WAIT_S) -> None:
    """Wait (bounded) until every sink has opened its record, so its link can be shown from the start."""
    deadline = time.monotonic() + timeout_s
    while any(w.last_step is None for w in tracker.workers) and time.monotonic() < deadline:
        time.sleep(0.2)


def links(tracker: Tracker) -> dict[str, str]:
    """Sink name -> the page of the run in that system's UI, for the sinks that have one (and opened)."""
    return {w.sink.name: link for w in tracker.workers if (link := getattr(w.sink, "link", None))}


def resolved_params(spec: Spec) -> dict[str, str]:
    """The resolved config, flattened (`train.learning_rate`, `resolved.deepspeed.zero_optimization.stage`) and
    masked: what every sink records as the run's parameters."""
    doc = spec.model_dump(mode="json")
    resolved = {key: doc[key] for key in ("world_size", "total_steps", "model_path", "deepspeed", "code_version")}
    return {**flatten(doc["config"]), **flatten({"dataset_id": spec.dataset.dataset_id, **resolved}, "resolved.")}


def run_tags(spec: Spec, lineage: Mapping[str, Any]) -> dict[str, str]:
    """Lineage digests and an elastic run's attempts, as tags."""
    tags = {f"tandem.{key}": str(value) for key, value in lineage.items() if value is not None and key != "attempts"}
    if spec.attempts:
        tags["tandem.attempts"] = str(len(spec.attempts))
        tags["tandem.attempt_history"] = json.dumps([a.model_dump() for a in spec.attempts], sort_keys=True)
    return tags
