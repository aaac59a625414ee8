"""Train: preflight every node, run the trainer on each, follow progress, and wait for all of them."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from prefect import get_run_logger, task
from prefect.artifacts import create_progress_artifact, update_progress_artifact

from prefect.states import State

from config.errors import RetryableError
from storage.spec import Spec, WrittenSpec
from launch.phase import run_phase


@task(name="train")
def train_on_nodes(written: WrittenSpec) -> None:
    """Preflight every node, launch `python -m trainer` on each; returns when all ranks finished."""
    logger = get_run_logger()
    run_phase(written, "train", logger.info, on_progress=progress_reporter(written.spec.total_steps, logger.info))


def retry_only_retryable(_task: object, _task_run: object, state: State) -> bool:
    """Prefect's retry condition: retry lost nodes, stalls and timeouts, never bad config or data."""
    try:
        state.result(raise_on_failure=True)
    except RetryableError:
        return True
    except Exception:  # noqa: BLE001 - anything else (UserError above all) is not worth a retry
        return False
    return False


def train_with_retries(spec: Spec) -> Any:
    """The train task with the run's retry policy (launch.retries); a retry resumes (train.resume=auto)."""
    launch = spec.config.launch
    return train_on_nodes.with_options(retries=launch.retries, retry_delay_seconds=launch.retry_delay_s,
                                       retry_condition_fn=retry_only_retryable)


def progress_reporter(total: int, info: Callable[[str], None]) -> Callable[[dict[str, Any]], None]:
    """A callback that logs step/total, loss, tokens/s and ETA, and keeps a Prefect progress artifact."""
    artifact = create_progress_artifact(progress=0.0, key="training-progress", description="training steps done")
    started = time.monotonic()

    def report(record: dict[str, Any]) -> None:
        step = record["step"]
        eta = (time.monotonic() - started) / step * (total - step)
        info(f"step {step}/{total} loss {record['loss']:.4f} tokens/s {record['tokens_per_s']:.0f} ETA {eta:.0f} s")
        update_progress_artifact(artifact_id=artifact, progress=100.0 * step / total)

    return report
