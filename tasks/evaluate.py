"""Evaluate: run `python -m trainer.evaluate` on every node and read the all-reduced eval.json."""

from __future__ import annotations

from typing import Any

from prefect import get_run_logger, task

from launch.job import EVAL
from launch.phase import run_phase
from storage import layout
from storage.fs import read_json
from storage.location import Location, join
from storage.metrics import delta_metrics, eval_metric_keys, generate_metrics, task_metrics
from storage.spec import WrittenSpec


@task(name="evaluate")
def evaluate_on_nodes(written: WrittenSpec, model: Location) -> dict[str, Any]:
    """Exact eval metrics of `model` (final/ or checkpoints/step-N, reached with its options) on the eval split."""
    logger = get_run_logger()
    run_phase(written, EVAL, logger.info, model=model)
    result = read_json(join(written.spec.run, layout.EVAL))
    logger.info(
        "eval of the %s %s: %s (%d ranks)",
        result["model_kind"],
        model,
        ", ".join(f"{key} {result[key]:.4f}" for key in eval_metric_keys(result)),
        result["world_size"],
    )
    if generated := generate_metrics(result):
        logger.info(
            "generated answers: %s",
            ", ".join(f"{key.removeprefix('generate.')} {value:.4g}" for key, value in generated.items()),
        )
    if tasks := task_metrics(result):
        shown = ", ".join(f"{key.removeprefix('tasks.')} {value:.4g}" for key, value in tasks.items())
        logger.info("benchmark tasks: %s", shown)
    if deltas := delta_metrics(result):
        logger.info(
            "against the base model: %s",
            ", ".join(f"{key.removeprefix('delta.')} {value:+.4g}" for key, value in deltas.items()),
        )
    if result.get("samples_url"):
        logger.info("greedy samples: %s", result["samples_url"])
    return result
